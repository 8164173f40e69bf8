"""Where each function runs: in the controller, on the workers, or anywhere.

The rules are the manual's: a function runs in the controller if it loops over a dataset, prints,
saves or loads, writes to a sink, uses Python, takes a dataset or a sink, or calls a function that
runs there; on the workers if it uses tensors, models, batches, gradients or optimizer state and
does none of those; anywhere otherwise.
"""

from __future__ import annotations

import dataclasses

from ..errors import Diagnostic
from ..ir import nodes as N
from ..ops.checking import Use
from ..shapes.kinds import FnKind
from ..shapes.plans import ANYWHERE, Placement, Where
from .planning import Planning

CONTROLLER_USES = {
    Use.LOOP: "loops over a dataset", Use.PRINT: "prints", Use.SAVE: "saves a checkpoint",
    Use.LOAD: "loads a checkpoint", Use.WRITE: "writes to a sink", Use.PYTHON: "calls Python",
    Use.DATASET: "takes a dataset", Use.SINK: "takes a sink",
}


def place(ctx: Planning) -> N.Module:
    """The pass: the module with each function's placement; on several devices, E1803 for device
    work in a function that runs in the controller."""
    fns = ctx.fns
    placed: dict[str, Placement] = {}
    for fn in fns.values():
        if fn.kind == FnKind.PYTHON:
            placed[fn.name] = Placement(Where.CONTROLLER, "is a Python function")
        elif fn.kind == FnKind.EXTERN:
            placed[fn.name] = Placement(Where.WORKERS, "works on each example")
        else:
            reason = next((text for use, text in CONTROLLER_USES.items() if use in fn.uses), "")
            placed[fn.name] = Placement(Where.CONTROLLER, reason) if reason else ANYWHERE
    changed = True
    while changed:  # a caller of a controller function runs in the controller
        changed = False
        for fn in fns.values():
            if placed[fn.name].where == Where.CONTROLLER:
                continue
            callee = next((c for c in fn.calls if placed[c].where == Where.CONTROLLER), None)
            if callee is not None:
                placed[fn.name] = Placement(Where.CONTROLLER, f"calls `{callee}`, which runs there")
                changed = True
    for fn in fns.values():
        if placed[fn.name] == ANYWHERE and fn.kind == FnKind.FN and (Use.TENSORS in fn.uses or fn.device_work):
            placed[fn.name] = Placement(Where.WORKERS, "uses tensors")
    if ctx.module.devices.count > 1:
        for fn in fns.values():
            if placed[fn.name].where == Where.CONTROLLER and fn.device_work:
                report_device_work(ctx, fn, placed)
    return dataclasses.replace(ctx.module, functions=tuple(
        dataclasses.replace(f, placement=placed[f.name]) for f in ctx.module.functions))


# The controller uses that belong in a training loop's caller rather than in a step: a function with
# one of these and device work is a step that should hand its value out instead.
MOVABLE_USES = {Use.PRINT: "`print`", Use.SAVE: "`save`", Use.LOAD: "`load`", Use.WRITE: "the write to a sink",
                Use.PYTHON: "the Python call"}


def report_device_work(ctx: Planning, fn: N.Function, placed: dict[str, Placement]) -> None:
    """E1803, pointing at what to move: a print, save, sink write, Python call or call of a controller
    function in a step of device work is what moves out; a loop over a dataset stays, and the device
    work moves into a function of its own."""
    use = next((u for u in MOVABLE_USES if u in fn.uses), None)
    callee = next((c for c in fn.calls if placed[c].where == Where.CONTROLLER), None)
    loops = any(u in fn.uses for u in (Use.LOOP, Use.DATASET, Use.SINK))
    if loops or (use is None and callee is None):
        for what, span in fn.device_work:
            ctx.error("E1803", f"{what} is device work, but `{fn.name}` runs in the controller", span,
                      "device work", f"`{fn.name}` runs in the controller because it {placed[fn.name].reason}",
                      "move the device work into a function of its own, as the README's train_step, "
                      "and call it from the loop")
        return
    thing = MOVABLE_USES[use] if use is not None else f"the call of `{callee}`"
    if use is not None:
        span = fn.uses[use]
    else:
        assert callee is not None  # one of the two, or the loop above returned
        span = fn.calls[callee]
    reason = (f"{CONTROLLER_USES[use]}, so it runs in the controller" if use is not None
              else f"calls `{callee}`, which runs in the controller")
    notes = tuple(f"{what} at {where} is device work, which runs on the workers" for what, where in fn.device_work)
    ctx.diagnostics.append(Diagnostic(
        "E1803", f"`{fn.name}` does device work, but it {reason}", span,
        f"this makes `{fn.name}` run in the controller", (
            f"move {thing} out of `{fn.name}` into the loop in the controller that calls it; "
            f"`{fn.name}` can return the values it needs",), notes))
