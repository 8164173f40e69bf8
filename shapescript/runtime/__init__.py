"""The single-device runtime that generated code and the Python API call."""
