"""Where each function runs: in the controller, on the workers, or anywhere.

The rules are the manual's: a function runs in the controller if it loops over a dataset, prints,
saves or loads, writes to a sink, uses Python, takes a dataset or a sink, or calls a function that
runs there; on the workers if it uses tensors, models, batches, gradients or optimizer state and
does none of those; anywhere otherwise.
"""

from __future__ import annotations

from .checker import Context

CONTROLLER_USES = {
    "loop": "loops over a dataset", "print": "prints", "save": "saves a checkpoint",
    "load": "loads a checkpoint", "write": "writes to a sink", "python": "calls Python",
    "dataset": "takes a dataset", "sink": "takes a sink",
}


def place(ctx: Context) -> None:
    fns = ctx.fns
    for fn in fns.values():
        if fn.kind == "python":
            fn.placement, fn.placement_reason = "controller", "is a Python function"
        elif fn.kind == "extern":
            fn.placement, fn.placement_reason = "workers", "works on each example"
        else:
            reason = next((text for use, text in CONTROLLER_USES.items() if use in fn.uses), "")
            if reason:
                fn.placement, fn.placement_reason = "controller", reason
    changed = True
    while changed:  # a caller of a controller function runs in the controller
        changed = False
        for fn in fns.values():
            if fn.placement == "controller":
                continue
            callee = next((c for c in fn.calls if fns[c].placement == "controller"), None)
            if callee is not None:
                fn.placement, fn.placement_reason = "controller", f"calls `{callee}`, which runs there"
                changed = True
    for fn in fns.values():
        if fn.placement == "anywhere" and fn.kind == "fn" and ("tensors" in fn.uses or fn.device_work):
            fn.placement, fn.placement_reason = "workers", "uses tensors"
    devices = ctx.checked.device_set if ctx.checked else None
    if devices is None or devices.count == 1:
        return
    for fn in fns.values():
        if fn.placement != "controller":
            continue
        for what, span in fn.device_work:
            ctx.error("E1803", f"`{what}` is device work, but `{fn.name}` runs in the controller", span,
                      "device work", f"`{fn.name}` runs in the controller because it {fn.placement_reason}",
                      "move the device work into a function of its own, as the README's train_step, "
                      "and call it from the loop")
