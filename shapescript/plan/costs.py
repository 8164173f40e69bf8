"""What a planned program's layout costs a step: the bytes it sends and what each device holds
(`layout auto` weighs every layout so, plan/choose.py).

Read off the DeviceTable and the planned IR, never from running anything:

- **sent**: what one call of the step sends (the DeviceTable's bytes for it, as `shapescript comms`
  prints them), the step being the function on the devices that updates a model (the one that sends
  most, if several do; without one, the function on the devices that sends most);
- **params**: each model the devices' functions take, once (not the models inside another taken):
  its params and buffers as one device holds them (a piece of each with `shard params`, a part of
  those with the split dim);
- **optimizer**: for each model an optimizer trains, the most state per param value its kind keeps
  (two moments for AdamW; a momentum buffer for SGD, which has none without momentum) times the
  params one device holds; **gradients**: as big as those params;
- **activations**: an estimate of what autograd keeps for the backward pass: every value the step's
  functions work out (each op's result, not the names that only read one), as one device holds it
  (its part of the batch, or of the split dim), as often as the step runs it (L times in a loop
  over a stack of L blocks).

Sizes the program leaves to its call (the batch's `b`) are worked out at the batch size of its
first `batches(n)` with n written as a number; without one, at 1. A dim not given a size yet (one
`shapescript check` leaves to loading) counts as 1.
"""

from __future__ import annotations

from collections.abc import Iterator

import sympy

from ..check.program import Checked
from ..devices import DeviceSet
from ..dtypes import ELEMENTS
from ..ir import nodes as N
from ..ops.table import numel
from ..optimizers import FACTS
from ..shapes import value_types as T
from ..shapes.kinds import CallKind, FnKind
from ..shapes.plans import Footprint, LayoutCost, Where
from ..syntax.tree import MemberKind
from .comms import DeviceTable, TableBuilder, device_table
from .layout import head_axis
from .split import split_axes

# The IR's nodes whose value is worked out, and so kept by autograd (a Name or a Member only reads one)
COMPUTED = (N.BinOp, N.UnOp, N.OpCall, N.Heads, N.Attention, N.LayerNorm)


def step_of(checked: Checked) -> str | None:
    """The function whose call is a step: one on the devices that updates a model (it takes an
    optimizer to change), the one that sends most if several do; without one, the function on the
    devices that sends most; None if nothing runs on the devices."""
    table = device_table(checked)
    on_devices = [f for f in checked.module.functions
                  if f.kind == FnKind.FN and f.placement.where != Where.CONTROLLER and f.name in table.fns]
    updating = [f for f in on_devices if any(p.mut and isinstance(p.ty, T.OptT) for p in f.params)]
    pool = updating or on_devices
    if not pool:
        return None
    return max(pool, key=lambda f: _at(table.fns[f.name].bytes, 1)).name


def batch_of(checked: Checked) -> tuple[int, str]:
    """The batch size the costs are worked out at, and where it comes from."""
    table = device_table(checked)
    if table.batch is not None and table.batch_span is not None:
        return table.batch, f"`batches({table.batch})` at {table.batch_span}"
    return 1, "1 (no `batches(n)` with n written as a number)"


def cost_of(checked: Checked, step: str | None, batch: int) -> LayoutCost:
    """The layout `checked` was planned with, weighed."""
    devices = checked.device_set
    table = device_table(checked)
    sent = _at(table.fns[step].bytes, batch) if step is not None else 0
    return LayoutCost(devices.layout_text, devices.shard_params, devices.split, sent,
                      _Weigher(checked, table, batch).footprint(step))


def refused(devices: DeviceSet, error: str) -> LayoutCost:
    """A layout the compiler refuses for this program, with its first error."""
    return LayoutCost(devices.layout_text, devices.shard_params, devices.split, refused=error)


def _at(expr: sympy.Expr, batch: int) -> int:
    """A size of the table at `batch`: every size left to the call (a generic dim, the batch's) is
    `batch`; a loop's unknown number of passes, and a dim not given a size yet, are 1."""
    value = sympy.sympify(expr)
    value = value.xreplace({s: sympy.Integer(batch if isinstance(s, sympy.Dummy) else 1) for s in value.free_symbols})
    return int(sympy.ceiling(value))


class _Weigher:
    """What one device holds for a step of the program as planned."""

    def __init__(self, checked: Checked, table: DeviceTable, batch: int) -> None:
        self.module = checked.module
        self.table = table
        self.batch = batch
        self.builder = TableBuilder(checked.module)
        self.fns = {f.name: f for f in checked.module.functions}
        self.count = checked.module.devices.count

    def footprint(self, step: str | None) -> Footprint:
        models = self.models_used()
        trained = {p.ty.model.name: p.ty for f in self.on_devices() for p in f.params if isinstance(p.ty, T.OptT)}
        params = sum(self.held(m) for m in models.values())
        per_param = [FACTS[opt.kind].state_at_most for opt in trained.values()]
        weights = [self.weights(opt.model) for opt in trained.values()]
        optimizer = sum(_at(w * n, self.batch) for w, n in zip(weights, per_param))
        gradients = sum(_at(w, self.batch) for w in weights)
        step_fn = self.fns.get(step) if step is not None else None
        activations = _at(self.activations(step_fn, {}, 0), self.batch) if step_fn is not None else 0
        return Footprint(params, optimizer, gradients, activations)

    def on_devices(self) -> Iterator[N.Function]:
        return (f for f in self.module.functions if f.kind == FnKind.FN and f.placement.where != Where.CONTROLLER)

    def models_used(self) -> dict[str, T.ModelT | T.StackT]:
        """The models the devices' functions take, by name, less those inside another one taken."""
        found: dict[str, T.ModelT | T.StackT] = {}
        for f in self.on_devices():
            for p in f.params:
                ty = p.ty.model if isinstance(p.ty, (T.OptT, T.GradT)) else p.ty
                if isinstance(ty, (T.ModelT, T.StackT)):
                    found.setdefault(ty.show(), ty)
        inside = {name for ty in found.values() for name in _members(ty.model if isinstance(ty, T.StackT) else ty)}
        return {name: ty for name, ty in found.items() if name not in inside}

    def held(self, ty: T.ModelT | T.StackT) -> int:
        """A model's params and buffers as one device holds them."""
        layout = self.builder.model_layout(ty.show(), None, self.module.span, ty)
        return _at(sympy.sympify((layout.bytes or 0) + (layout.buffers or 0)), self.batch)

    def weights(self, model: T.ModelT) -> sympy.Expr:
        """The bytes of one device's part of a model's trained params."""
        return self.builder.size(self.builder.param_bytes(model))

    def activations(self, fn: N.Function, sizes: dict[sympy.Expr, sympy.Expr], depth: int) -> sympy.Expr:
        """The bytes of the values one call of `fn` works out on one device, its calls' included;
        `sizes`: what the call binds `fn`'s generic dims to."""
        total: sympy.Expr = sympy.Integer(0)
        if depth > len(self.fns):  # recursion is refused by the checker; this only guards the walk
            return total
        for node, _, times in self.builder.operations(fn.body, sympy.Integer(1)):
            if isinstance(node, N.GradCall | N.FnCall):
                callee = node.fn if isinstance(node, N.GradCall) else node.name if node.kind == CallKind.FN else None
                if callee is None or callee not in self.fns:
                    continue
                bound = {mine: sympy.sympify(theirs).xreplace(sizes) for mine, theirs in node.binds}
                total += times * self.activations(self.fns[callee], bound, depth + 1)
            elif isinstance(node, COMPUTED):
                total += times * self.value_bytes(fn, node.ty, sizes)
        return total

    def value_bytes(self, fn: N.Function, ty: T.Ty | None, sizes: dict[sympy.Expr, sympy.Expr]) -> sympy.Expr:
        """A value's bytes on one device: its part of the batch, or of the split dim, on several."""
        if not isinstance(ty, T.TensorT):
            none: sympy.Expr = sympy.Integer(0)
            return none
        whole = self.builder.size(sympy.sympify(numel(ty) * ELEMENTS[ty.dtype].bytes).xreplace(sizes))
        split = self.count > 1 and fn.split is not None and (
            bool(split_axes(fn.split.dims, ty)) or (fn.split.heads and head_axis(fn.split.dims, ty) is not None))
        part: sympy.Expr = whole / self.count if split else whole
        return part


def _members(model: T.ModelT) -> Iterator[str]:
    """The names of the models inside `model`, however deep (a stack's as `[L] Block` and `Block`)."""
    for m in model.members.values():
        if m.kind == MemberKind.SUB and m.model is not None:
            if m.count is not None:
                yield T.StackT(m.count, m.model).show()
            yield m.model.show()
            yield from _members(m.model)
