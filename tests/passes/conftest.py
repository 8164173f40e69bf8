"""The per-pass tests: each compiles small programs (tests/programs.py) and asserts on what one pass
of the checker found, never running them. What they read of a pass's results is in `facts`."""
