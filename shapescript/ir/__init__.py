"""The typed IR between the checker and lowering: nodes.py defines it (check/elaborate.py builds it),
walk.py and rewrite.py read and rewrite it, passes.py lists the passes over it."""
