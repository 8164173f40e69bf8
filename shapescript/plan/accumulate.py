"""Gradient accumulation on several devices: which `value_and_grad` calls may keep their gradients
each device's own until an update reads them (as DDP's `no_sync`), so that accumulating over
micro-batches costs one all-reduce of the gradients per optimizer step, not one per micro-batch.

A call qualifies in a function that adds gradients together, when the gradients it binds (and every
gradient worked out from them there) are only added, subtracted or scaled, then read whole by an op
whose table entry says `reads_gradients` (update, clip_norm, norm) or by a field read, all in that
function: each such read averages them, in one all-reduce. Averaging is linear, so the result is
what one device computes. If such a gradient goes anywhere else (returned, passed to a function,
put in a tuple), none of the function's calls defers: the DeviceTable could not say where its
all-reduce happens. Not with `shard params` or `split H`, whose gradients are combined in the
backward pass itself, nor in a step that updates with one call's gradients, whose all-reduce starts
during the backward pass.
"""

from __future__ import annotations

import dataclasses

from ..ir import nodes as N
from ..ir.rewrite import rewrite_body
from ..ir.walk import statements, walk
from ..ops.table import OPS
from ..shapes import value_types as T


def reads_whole(e: N.Expr) -> bool:
    """An op that reads gradients whole (its table entry's `reads_gradients`): it averages pending ones."""
    return isinstance(e, N.OpCall) and OPS[e.op].reads_gradients


def defer_gradients(module: N.Module) -> N.Module:
    """`module` with `GradCall.deferred` set where the gradients only add up before they are read."""
    if module.devices.count < 2 or module.devices.shard_params or module.devices.split:
        return module
    return dataclasses.replace(module, functions=tuple(_deferred(fn) if _accumulates(fn) else fn
                                                       for fn in module.functions))


def _accumulates(fn: N.Function) -> bool:
    """Whether `fn` adds gradients together: only then is a deferred all-reduce fewer all-reduces. (A
    step that updates with one call's gradients keeps value_and_grad's own, which starts during the
    backward pass.)"""
    return any(isinstance(e, N.BinOp) and isinstance(e.left.ty, T.GradT) and isinstance(e.right.ty, T.GradT)
               for e in walk(fn.body))


def pending_names(fn: N.Function) -> set[str] | None:
    """The variables holding gradients that stay each device's own (those value_and_grad binds, and
    what is worked out from them), or None where one of them goes elsewhere than a reader."""
    pending: set[str] = set()
    for s in statements(fn.body):
        if isinstance(s, N.Assign) and isinstance(s.value, N.GradCall) and len(s.targets) == 2:
            pending.add(s.targets[1].name)
        elif isinstance(s, N.Assign) and len(s.targets) == 1 and isinstance(s.value.ty, T.GradT) \
                and reads_pending(s.value, pending):
            pending.add(s.targets[0].name)
    if not pending:
        return None
    for s in statements(fn.body):
        if isinstance(s, N.Assign) and isinstance(s.value, N.GradCall):
            parts, allowed = s.value.args, False
        elif isinstance(s, N.Assign):  # a pending value renamed or worked on may go into a pending name
            parts, allowed = (s.value,), len(s.targets) == 1 and s.targets[0].name in pending
        elif isinstance(s, N.Do | N.Return):
            parts, allowed = _children(s.value if isinstance(s, N.Return) else s.expr), False
        elif isinstance(s, N.If):
            parts, allowed = (s.cond,), False
        else:
            assert isinstance(s, N.For)
            parts, allowed = (s.iter,), False
        if any(_escapes(e, pending, allowed) for e in parts):
            return None
    return pending


def reads_pending(e: N.Expr, pending: set[str]) -> bool:
    """Whether `e` works out its value from a pending variable's: a reader's result inside it (as
    `clip_norm(g, 1.0)` in an update) is averaged already."""
    if isinstance(e, N.Name):
        return e.id in pending
    if reads_whole(e):
        return False
    return any(reads_pending(v, pending) for f in dataclasses.fields(e) for v in _children(getattr(e, f.name)))


def _children(value: object) -> tuple[N.Expr, ...]:
    items = value if isinstance(value, tuple) else (value,)
    return tuple(v for v in items if isinstance(v, N.Expr))


def _escapes(e: N.Expr, pending: set[str], allowed: bool) -> bool:
    """Whether a pending name in `e` is used other than by gradient arithmetic or a reader.
    `allowed`: `e` is in such a place itself."""
    if isinstance(e, N.Name):
        return e.id in pending and not allowed
    inside = (isinstance(e, N.BinOp) and isinstance(e.ty, T.GradT)
              or reads_whole(e)
              or isinstance(e, N.Member) and isinstance(e.obj.ty, T.GradT))
    return any(_escapes(v, pending, inside) for f in dataclasses.fields(e) for v in _children(getattr(e, f.name)))


def _deferred(fn: N.Function) -> N.Function:
    pending = pending_names(fn)
    if not pending:
        return fn
    bound = {id(s.value) for s in statements(fn.body) if isinstance(s, N.Assign)
             and isinstance(s.value, N.GradCall) and len(s.targets) == 2 and s.targets[1].name in pending}

    def change(original: N.Expr, inner: N.Expr) -> N.Expr:
        return dataclasses.replace(inner, deferred=True) if id(original) in bound and isinstance(inner, N.GradCall) else inner
    return dataclasses.replace(fn, body=rewrite_body(fn.body, change))
