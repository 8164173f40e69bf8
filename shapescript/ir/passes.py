"""The passes over the typed IR, in the order they run: each takes a module and gives a module
(ir/rewrite.py makes one of a rule on expressions). OPTIMIZATIONS change how a program computes,
never what it computes, and are left out of the debug build, which checks each value the program
names against its type; ANALYSES add facts every build reads. A new pass joins one of the lists."""

from __future__ import annotations

from collections.abc import Callable

from . import nodes as N
from .defer import defer
from .fuse import fuse

Pass = Callable[[N.Module], N.Module]

OPTIMIZATIONS: list[Pass] = [fuse]
ANALYSES: list[Pass] = [defer]


def run_passes(module: N.Module, optimize: bool = True) -> N.Module:
    """`module` after every pass: the optimizations first (where `optimize`), then the analyses."""
    for each in [*(OPTIMIZATIONS if optimize else []), *ANALYSES]:
        module = each(module)
    return module
