"""The layout options' plan: which reads of a param gather it from the devices' pieces (`shard
params`), and with `split H` which values each device holds a part of and where the compiled code
gathers, cuts or sums them: a pass over the IR after placement and the split, which leaves its
plan on the nodes (a gathered `Member`, `Heads` around a value) for lowering to print and the
DeviceTable to count.

`split H` is decided by the types: a value whose type has an axis of size H, or a group axis that
starts with H ((H Dh): a block of whole heads), once, is split along it; any other value is whole
(H in two places, or after another axis in a group, as (3 H Dh)). Batches are whole: a field with
an H axis is cut to each device's part where it is read. The dims a
function splits are H and the generic dims its calls bind to H. Each operation follows its op's
layout rule (ops/table.py): its devices work on their parts alone (LOCAL), or add up partial
results (SUM), or need their split operands whole (GATHER, also every op without a rule). A value
computed from whole operands whose type is split is cut to each device's part (no communication);
a value passed to a function, or returned from one, that the other side lays out differently is
gathered or cut there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import sympy

from ..ir import nodes as N
from ..ir.rewrite import rewrite_body
from ..ir.walk import source_order
from ..ops.table import OPS, CallView, heads_contraction
from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.kinds import CallKind, FnKind
from ..shapes.options import NO_OPTIONS, CallOptions
from ..shapes.plans import BatchSplit, HeadsKind, Where
from ..syntax.tree import MemberKind
from .split import call_sites

Dims = frozenset[sympy.Basic]


def lay_out(module: N.Module) -> N.Module:
    """The pass: the reads of params each device holds a piece of (`shard params`), gathered where
    they're read; with `split H`, the params split along H and where values are gathered, cut or
    summed."""
    devices = module.devices
    if devices.count == 1 or not (devices.shard_params or devices.split):
        return module
    head_params = _head_params(module, devices.split) if devices.split else {}
    dims = heads_dims(module, devices.split) if devices.split else {}
    functions = []
    for fn in module.functions:
        if fn.kind == FnKind.FN and fn.placement.where == Where.WORKERS:
            if devices.shard_params:
                fn = dataclasses.replace(fn, body=_gathered_reads(fn.body, head_params))
            if devices.split:  # marked by the identity of the nodes of the body it then rewrites
                marks: dict[int, tuple[HeadsMark, ...]] = {}
                _Marker(module, fn, dims, marks).run()
                fn = dataclasses.replace(fn, body=_with_heads(fn.body, marks))
        functions.append(fn)
    return dataclasses.replace(module, functions=tuple(functions), heads=devices.split,
                               head_params=head_params)


@dataclasses.dataclass(frozen=True)
class HeadsMark:
    """What `split H` does to a value where it's computed (an N.Heads node once the pass is done):
    `gather` it whole from every device's part along `axes[0]`, `cut` a whole value to this
    device's part along its axis (a tuple's: along each element's, None: whole), or `sum` every
    device's partial result."""
    kind: HeadsKind  # GATHER, CUT or SUM
    axes: tuple[int | None, ...] = ()


def _with_heads(body: tuple[N.Stmt, ...], marks: dict[int, tuple[HeadsMark, ...]]) -> tuple[N.Stmt, ...]:
    """`body` with each marked value (by the identity of its node in `body`) in its marks' Heads
    nodes, the first mark innermost."""
    def change(original: N.Expr, inner: N.Expr) -> N.Expr:
        for mark in marks.get(id(original), ()):
            inner = N.Heads(inner.ty, inner.span, mark.kind, mark.axes, inner)
        return inner
    return rewrite_body(body, change)


class ParamOf(NamedTuple):
    """A trained param of a model, sub-models' included: its dotted name, the model type declaring
    it and its name there, its type, and how many copies a stack has of it."""
    path: str
    owner: str
    name: str
    tensor: T.TensorT
    copies: sympy.Expr


def model_params(model: T.ModelT, prefix: str = "", count: sympy.Expr = sympy.S.One) -> Iterator[ParamOf]:
    """Every trained param of `model`, in declaration order, depth-first."""
    for m in model.members.values():
        if m.kind == MemberKind.PARAM and m.tensor is not None:
            yield ParamOf(prefix + m.name, model.name, m.name, m.tensor, count)
        elif m.kind == MemberKind.SUB and m.model is not None:
            yield from model_params(m.model, f"{prefix}{m.name}.", count * (m.count if m.count is not None else 1))


def _head_params(module: N.Module, heads: str) -> dict[tuple[str, str], int]:
    """The params each device holds its part of: those whose type has H where a value is split."""
    dims = frozenset({D.declared(heads)})
    out = {}
    for model in module.models:
        for p in model_params(model):
            axis = head_axis(dims, p.tensor)
            if axis is not None:
                out[(p.owner, p.name)] = axis
    return out


def _gathered_reads(body: tuple[N.Stmt, ...], head_params: dict[tuple[str, str], int]) -> tuple[N.Stmt, ...]:
    """`body` with every read of a param gathered from the pieces, but those split along H: each
    device holds ceil(n / N) of its n values, the last device's piece padded."""
    def change(_: N.Expr, inner: N.Expr) -> N.Expr:
        read = sharded_read(inner)
        if read is None or (read[0].name, read[1].name) in head_params:
            return inner
        assert isinstance(inner, N.Member)
        return dataclasses.replace(inner, gathered=True)
    return rewrite_body(body, change)


def sharded_read(node: N.Expr) -> tuple[T.ModelT, T.MemberT, T.TensorT] | None:
    """(the model, its member, the member's type) where `node` reads a param of a model."""
    if not isinstance(node, N.Member) or not isinstance(node.obj.ty, T.ModelT):
        return None
    member = node.obj.ty.members.get(node.name)
    if member is None or member.kind != MemberKind.PARAM or member.tensor is None:
        return None
    return node.obj.ty, member, member.tensor


def head_axis(dims: Dims, t: T.Ty | None) -> int | None:
    """The axis along which a value of type `t` is split, in a function that splits `dims`: its one
    axis of such a size, or one group axis starting with one; None: whole."""
    if not isinstance(t, T.TensorT):
        return None
    found: list[int] = []
    for k, axis in enumerate(t.axes):
        parts = axis.parts or (axis.size,)
        for at, part in enumerate(parts):
            if part in dims:
                found.append(k if at == 0 else -1)
    return found[0] if len(found) == 1 and found[0] >= 0 else None


def heads_dims(module: N.Module, heads: str) -> dict[str, Dims]:
    """Each function's split dims: H, and the generic dims that a call binds to one, to a fixed point."""
    fns = [f for f in module.functions if f.kind == FnKind.FN]
    out: dict[str, set[sympy.Basic]] = {f.name: {D.declared(heads)} for f in fns}
    changed = True
    while changed:
        changed = False
        for caller, _, callee, binds in call_sites(fns):
            for generic, dim in binds:
                if dim in out[caller.name] and generic not in out[callee.name]:
                    out[callee.name].add(generic)
                    changed = True
    return {name: frozenset(d) for name, d in out.items()}


def split_heads(module: N.Module) -> N.Module:
    """The pass in place of the batch split with `split H` (batches are whole on every device): how
    a call of each function from the controller cuts its arguments and joins its result along H."""
    assert module.devices.split is not None
    dims = heads_dims(module, module.devices.split)
    return dataclasses.replace(module, functions=tuple(
        dataclasses.replace(f, split=BatchSplit(dims[f.name], tuple(head_axis(dims[f.name], p.ty) for p in f.params),
                                                head_axis(dims[f.name], f.ret), heads=True))
        if f.name in dims else f for f in module.functions))


class _Marker:
    """Marks what `split H` does at each operation of one function on the workers."""

    def __init__(self, module: N.Module, fn: N.Function, dims: dict[str, Dims],
                 marks: dict[int, tuple[HeadsMark, ...]]) -> None:
        self.fn, self.all_dims, self.dims, self.marks = fn, dims, dims[fn.name], marks
        self.callees = {f.name: f for f in module.functions}

    def axis(self, node: N.Expr) -> int | None:
        return head_axis(self.dims, node.ty)

    def mark(self, node: N.Expr, kind: HeadsKind, axes: tuple[int | None, ...] = ()) -> None:
        self.marks[id(node)] = self.marks.get(id(node), ()) + (HeadsMark(kind, axes),)

    def gather(self, operands: Iterable[N.Expr]) -> None:
        for operand in operands:
            axis = self.axis(operand)
            if axis is not None:
                self.mark(operand, HeadsKind.GATHER, (axis,))

    def cut(self, node: N.Expr) -> None:
        """A value computed whole whose type is split: each device keeps its part."""
        t = node.ty
        items = t.items if isinstance(t, T.TupleT) else (t,)
        axes = tuple(head_axis(self.dims, item) for item in items)
        if any(a is not None for a in axes):
            self.mark(node, HeadsKind.CUT, axes)

    def run(self) -> None:
        for node in source_order(self.fn.body):
            if isinstance(node, N.BinOp):
                self.operation(node, [node.left, node.right],
                               heads_contraction(self.view(node, [node.left, node.right])) if node.op == "@" else HeadsKind.LOCAL)
            elif isinstance(node, N.UnOp):
                self.operation(node, [node.operand], HeadsKind.LOCAL)
            elif isinstance(node, N.OpCall | N.FnCall | N.GradCall):
                self.call(node)
            elif isinstance(node, N.Member) and isinstance(node.obj.ty, T.BatchT):
                self.cut(node)  # a batch is whole on every device: a field with an H axis is cut where it's read

    def view(self, node: N.Expr, operands: Sequence[N.Expr], options: CallOptions = NO_OPTIONS) -> CallView[CallOptions]:
        def split(t: T.Ty | None) -> list[int]:
            axis = head_axis(self.dims, t)
            return [] if axis is None else [axis]
        return CallView(options, tuple(o.ty for o in operands), node.ty, split, lambda size: False)

    def operation(self, node: N.Expr, operands: Sequence[N.Expr], rule: HeadsKind) -> None:
        split_in = [o for o in operands if self.axis(o) is not None]
        if not split_in:
            self.cut(node)  # whole operands; a split result is cut (no communication)
        elif rule == HeadsKind.SUM:
            self.mark(node, HeadsKind.SUM)
        elif rule == HeadsKind.GATHER:
            self.gather(operands)
            self.cut(node)

    def call(self, node: N.OpCall | N.FnCall | N.GradCall) -> None:
        operands = [a for a in node.args if a is not None]
        if isinstance(node, N.OpCall):
            op = OPS.get(node.op)
            rule = op.layout.heads if op is not None and op.layout is not None else None
            self.operation(node, operands, rule(self.view(node, operands, node.options)) if rule else HeadsKind.GATHER)
        elif isinstance(node, N.GradCall) or node.kind == CallKind.FN:
            self.boundary(node)
        else:  # extern and python fns take every value whole: their declared types are checked whole
            self.operation(node, operands, HeadsKind.GATHER)

    def boundary(self, node: N.FnCall | N.GradCall) -> None:
        """A call of a function of the program: each argument laid out as the callee takes it."""
        callee = self.callees[node.fn if isinstance(node, N.GradCall) else node.name]
        theirs = self.all_dims.get(callee.name, frozenset())
        for arg, param in zip(node.args, callee.params):
            mine, wanted = self.axis(arg), head_axis(theirs, param.ty)
            if mine is not None and wanted is None:
                self.mark(arg, HeadsKind.GATHER, (mine,))
            elif mine is None and wanted is not None:
                self.mark(arg, HeadsKind.CUT, (wanted,))
        if isinstance(node, N.FnCall):
            given, mine = head_axis(theirs, callee.ret), self.axis(node)
            if given is not None and mine is None:
                self.mark(node, HeadsKind.GATHER, (given,))
            elif given is None and mine is not None:
                self.mark(node, HeadsKind.CUT, (mine,))
