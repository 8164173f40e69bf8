"""The compiler's stages, in order: the one place that runs them.

    parse       syntax/parser.py    the text → the tree, a span on every node
    check       check/checker.py    the items (dims, data, models, signatures), then each body's
                                    types and calls; placement (check/placement.py); on several
                                    devices the batch split (check/split.py) → `Checked`
    elaborate   ir/elaborate.py     `Checked` → the typed IR, each node with its type, its
                                    resolved call and the split's marks
    fuse        ir/fuse.py          spans torch has one kernel for, rewritten to use it
    defer       ir/defer.py         the calls whose results a controller's loop only logs,
                                    which it needn't wait for
    print       lower/codegen.py    the IR → a Python module for a target (one device, the
                                    controller, a worker, standalone)

Each stage reads only what the one before it gives; the front ends (api.py, cli.py, lsp.py, the
notebook) call these functions rather than the stages. The DeviceTable (check/comms.py) is worked
out from `Checked` when first asked for (`checked.devices`): a build for one device never needs it.
"""

from __future__ import annotations

from .check.checker import check_program
from .check.program import Checked
from .devices import DeviceSet
from .ir import nodes as ir
from .ir.defer import defer
from .ir.elaborate import elaborate
from .ir.fuse import fuse
from .lower.codegen import generate
from .lower.targets import Target
from .syntax.parser import parse


def check_source(source: str, file: str = "<input>", devices: DeviceSet | None = None,
          dims: dict[str, int] | None = None, python: bool = True) -> Checked:
    """Parse and check a program (CompileError with every diagnostic if it is wrong); `python=False`
    refuses the program's own Python (E0701)."""
    return check_program(parse(source, file), file, devices, dims, python)


def typed_ir(checked: Checked, fused: bool = True) -> ir.Module:
    """The checked program as typed IR; `fused`: with torch's kernels where they fit."""
    module = elaborate(checked)
    return defer(fuse(module) if fused else module)


def python_module(checked: Checked, target: Target | None = None, *, standalone: bool = False,
                  check_types: bool = False, fused: bool = True) -> str:
    """The Python module of a checked program for `target` (by default one device's module;
    `standalone=True`: the standalone target). `check_types`: the debug build, which checks every
    value the program names against its type as it runs (so nothing is fused away)."""
    module = typed_ir(checked, fused and not check_types)
    return generate(checked, module, target, standalone=standalone, check_types=check_types)


def python_modules(checked: Checked, targets: tuple[Target, ...], *, check_types: bool = False,
                   fused: bool = True) -> list[str]:
    """A module for each of `targets` (a program on several devices: its controller's and its
    workers'), printed from one typed IR."""
    module = typed_ir(checked, fused and not check_types)
    return [generate(checked, module, target, check_types=check_types) for target in targets]
