"""The typed IR between the checker and lowering: nodes.py defines it, elaborate.py builds it."""
