"""What each target's module holds besides the program's own code (codegen.py prints that).

The module a target gets is exactly what runs there; nothing is patched into it afterwards:

- `ONE_DEVICE`: the program on one device, importing shapescript's runtime.
- `WORKER`: what each worker process of a program on several devices loads. It is one device's
  module (its loader sets `DEVICE` to the worker's own), so it prints as `ONE_DEVICE` does.
- `CONTROLLER`: the module a program on several devices runs in the caller's process. Its loops'
  batches are loaded by the workers (`parallel.loading.RemoteBatches`), and each fn placed on the
  devices is a stub that sends every worker its part of the arguments (`parallel.remote`). Both
  reach the workers through the module's `_workers`, which whoever runs the module sets (api.Program
  sets itself): they look it up when called, so the module loads without any.
- `STANDALONE`: one device, with the runtime inlined; it imports no shapescript.
"""

from __future__ import annotations

from enum import Enum

from ..errors import CompileError, Diagnostic
from ..ir import nodes as ir
from ..shapes.kinds import FnKind
from ..shapes.plans import Where
from .text import literal


class Target(Enum):
    """Where a module runs (the module's docstring above says what each holds)."""
    ONE_DEVICE = "one device"
    WORKER = "worker"
    CONTROLLER = "controller"
    STANDALONE = "standalone"


# The controller module's name for its link to the workers (api.Program): None until whoever runs the
# module sets it. It starts with `_`, as no .ss name in the module does (codegen.py_name renames them).
WORKERS_NAME = "_workers"
REMOTE_IMPORT = "from shapescript.parallel import remote as _remote"
CONTROLLER_RUNTIME = (f"{WORKERS_NAME} = None  # the worker processes, set by whoever runs this module (api.Program)",
                      f"_rt = _remote.controller_runtime(_rt, lambda: {WORKERS_NAME})  # its loops' batches: loaded "
                      f"by the workers")


def target_for(module: ir.Module, target: Target | None, standalone: bool) -> Target:
    """The target asked for (`standalone=True` is `Target.STANDALONE`), refused where it can't run:
    a standalone build on several devices is E1805 (the user's choice, so a diagnostic), a
    controller of a program on one device a ValueError (the caller's mistake)."""
    if target is None:
        target = Target.STANDALONE if standalone else Target.ONE_DEVICE
    elif standalone and target is not Target.STANDALONE:
        raise ValueError(f"standalone=True asks for the standalone target, not {target.value}")
    several = module.devices.count > 1
    if target is Target.STANDALONE and several:
        raise CompileError([Diagnostic(
            "E1805", f"a standalone build can't run on {module.devices.count} devices", module.span,
            "several devices", ("build without --standalone, or for one device",),
            ("on several devices the program runs in a controller that starts the package's workers",))],
            module.source)
    if target is Target.CONTROLLER and not several:
        raise ValueError(f"{module.file} runs on {module.devices}: a controller is for several devices")
    return target


def is_remote(fn: ir.Function, target: Target) -> bool:
    """Whether `fn` is a stub in this target's module: the controller's fns placed on the workers."""
    return target is Target.CONTROLLER and fn.kind == FnKind.FN and fn.placement.where == Where.WORKERS


def remote_stub(fn: ir.Function, name: str) -> str:
    """The controller's stub of `fn` (whose Python name is `name`): a call of it sends each worker
    its part of the arguments, split along the batch axis as the checker decided."""
    split = fn.split
    assert split is not None, fn.name  # every fn on the workers has one on several devices
    heads = ", heads=True" if split.heads else ""
    # no extern fn can keep the batch's rows: the workers read them where they lie (parallel/shared.py)
    in_place = "" if fn.reaches_extern else ", rows_in_place=True"
    plan = (f"_remote.SplitCall({literal(f'`{fn.name}` ({fn.name_span})')}, {literal(split.params)}, "
            f"{literal(split.result)}{heads}{in_place})")
    return f"{name} = _remote.RemoteFunction(lambda: {WORKERS_NAME}, {plan}, {literal(name)})"

