"""The several-devices tests start real worker processes (cpu[...] with Gloo)."""
