"""The layout options' plan: which reads of a param gather it from the devices' pieces (`shard
params`), and with `split H` which values each device holds a part of and where the compiled code
gathers, cuts or sums them. Worked out once, after placement, for elaboration (which prints the
plan) and the DeviceTable (which counts what it sends) alike.

`split H` is decided by the types: a value whose type has an axis of size H, or a group axis that
starts with H ((H Dh): a block of whole heads), once, is split along it; any other value is whole
(H in two places, or after another axis in a group, as (3 H Dh)). Batches are whole. The dims a
function splits are H and the generic dims its calls bind to H. Each operation follows its op's
layout rule (ops/table.py): its devices work on their parts alone (LOCAL), or add up partial
results (SUM), or need their split operands whole (GATHER, also every op without a rule). A value
computed from whole operands whose type is split is cut to each device's part (no communication);
a value passed to a function, or returned from one, that the other side lays out differently is
gathered or cut there.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import sympy

from ..check.program import NO_LAYOUT, CallInfo, Checked, FnInfo, HeadsMark, LayoutFacts, ShardedRead, SplitFacts
from ..ops.table import OPS, CallView, heads_contraction, numel
from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.kinds import CallKind, FnKind
from ..shapes.options import NO_OPTIONS, CallOptions
from ..shapes.plans import BatchSplit, HeadsKind, Where
from ..syntax import tree as A
from .split import call_sites

Dims = frozenset[sympy.Basic]


def lay_out(checked: Checked) -> LayoutFacts:
    devices = checked.device_set
    if devices.count == 1 or not (devices.shard_params or devices.split):
        return NO_LAYOUT
    fns = [f for f in checked.fns.values() if f.kind == FnKind.FN and checked.placement(f.name).where == Where.WORKERS]
    head_params = _head_params(checked, devices.split) if devices.split else {}
    reads = _sharded_reads(checked, fns, head_params) if devices.shard_params else {}
    if not devices.split:
        return LayoutFacts(reads)
    dims = heads_dims(checked, devices.split)
    marks: dict[int, tuple[HeadsMark, ...]] = {}
    for fn in fns:
        _Marker(checked, fn, dims, marks).run()
    return LayoutFacts(reads, devices.split, head_params, marks)


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
        if m.kind == "param" and m.tensor is not None:
            yield ParamOf(prefix + m.name, model.name, m.name, m.tensor, count)
        elif m.kind == "sub" and m.model is not None:
            yield from model_params(m.model, f"{prefix}{m.name}.", count * (m.count if m.count is not None else 1))


def _head_params(checked: Checked, heads: str) -> dict[tuple[str, str], int]:
    """The params each device holds its part of: those whose type has H where a value is split."""
    dims = frozenset({D.declared(heads)})
    out = {}
    for model in checked.models.values():
        for p in model_params(model):
            axis = head_axis(dims, p.tensor)
            if axis is not None:
                out[(p.owner, p.name)] = axis
    return out


def _sharded_reads(checked: Checked, fns: list[FnInfo], head_params: dict[tuple[str, str], int]
                   ) -> dict[int, ShardedRead]:
    """Every read of a param on the workers, but those split along H: each device holds
    ceil(n / N) of its n values, the last device's piece padded."""
    count = checked.device_set.count
    reads: dict[int, ShardedRead] = {}
    for fn in fns:
        for node in A.iter_nodes(fn.node):
            if not isinstance(node, A.Attr):
                continue
            owner = checked.types.get(id(node.obj))
            member = owner.members.get(node.name) if isinstance(owner, T.ModelT) else None
            if (isinstance(owner, T.ModelT) and member is not None and member.kind == "param"
                    and member.tensor is not None and (owner.name, member.name) not in head_params):
                padded = sympy.ceiling(numel(member.tensor) / count) * count
                reads[id(node)] = ShardedRead(owner.name, member.name, member.tensor.dtype, padded)
    return reads


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


def heads_dims(checked: Checked, heads: str) -> dict[str, Dims]:
    """Each function's split dims: H, and the generic dims that a call binds to one, to a fixed point."""
    fns = [f for f in checked.fns.values() if f.kind == FnKind.FN]
    out: dict[str, set[sympy.Basic]] = {f.name: {D.declared(heads)} for f in fns}
    changed = True
    while changed:
        changed = False
        for caller, _, callee, mapping in call_sites(checked, fns):
            for generic, dim in mapping.items():
                if dim in out[caller.name] and generic not in out[callee.name]:
                    out[callee.name].add(generic)
                    changed = True
    return {name: frozenset(d) for name, d in out.items()}


def heads_facts(checked: Checked) -> SplitFacts:
    """With `split H`, how a call of each function from the controller cuts its arguments and joins
    its result along H (in place of the batch split: batches are whole on every device)."""
    assert checked.device_set.split is not None
    dims = heads_dims(checked, checked.device_set.split)
    return SplitFacts({name: BatchSplit(d, tuple(head_axis(d, p.ty) for p in checked.fns[name].params),
                                        head_axis(d, checked.fns[name].ret), heads=True)
                       for name, d in dims.items()}, {}, {})


class _Marker:
    """Marks what `split H` does at each operation of one function on the workers."""

    def __init__(self, checked: Checked, fn: FnInfo, dims: dict[str, Dims],
                 marks: dict[int, tuple[HeadsMark, ...]]) -> None:
        self.c, self.fn, self.all_dims, self.dims, self.marks = checked, fn, dims, dims[fn.name], marks

    def axis(self, node: A.Node) -> int | None:
        return head_axis(self.dims, self.c.types.get(id(node)))

    def mark(self, node: A.Node, kind: HeadsKind, axes: tuple[int | None, ...] = ()) -> None:
        self.marks[id(node)] = self.marks.get(id(node), ()) + (HeadsMark(kind, axes),)

    def gather(self, operands: Iterable[A.Node]) -> None:
        for operand in operands:
            axis = self.axis(operand)
            if axis is not None:
                self.mark(operand, HeadsKind.GATHER, (axis,))

    def cut(self, node: A.Node) -> None:
        """A value computed whole whose type is split: each device keeps its part."""
        t = self.c.types.get(id(node))
        items = t.items if isinstance(t, T.TupleT) else (t,)
        axes = tuple(head_axis(self.dims, item) for item in items)
        if any(a is not None for a in axes):
            self.mark(node, HeadsKind.CUT, axes)

    def run(self) -> None:
        for node in A.iter_nodes(self.fn.node):
            if isinstance(node, A.Binary):
                self.operation(node, [node.left, node.right],
                               heads_contraction(self.view(node, [node.left, node.right])) if node.op == "@" else HeadsKind.LOCAL)
            elif isinstance(node, A.Unary):
                self.operation(node, [node.operand], HeadsKind.LOCAL)
            elif isinstance(node, A.Call) and id(node) in self.c.calls:
                self.call(node)

    def view(self, node: A.Node, operands: Sequence[A.Node], options: CallOptions = NO_OPTIONS) -> CallView:
        types = self.c.types

        def split(t: T.Ty | None) -> list[int]:
            axis = head_axis(self.dims, t)
            return [] if axis is None else [axis]
        return CallView(options, tuple(types.get(id(o)) for o in operands), types.get(id(node)), split,
                        lambda size: False)

    def operation(self, node: A.Node, operands: Sequence[A.Node], rule: HeadsKind) -> None:
        split_in = [o for o in operands if self.axis(o) is not None]
        if not split_in:
            self.cut(node)  # whole operands; a split result is cut (no communication)
        elif rule == HeadsKind.SUM:
            self.mark(node, HeadsKind.SUM)
        elif rule == HeadsKind.GATHER:
            self.gather(operands)
            self.cut(node)

    def call(self, node: A.Call) -> None:
        info = self.c.calls[id(node)]
        operands = [a for a in info.args if not isinstance(a, A.Pattern) and id(a) in self.c.types]
        if info.kind == CallKind.BUILTIN:
            op = OPS.get(info.name)
            rule = op.layout.heads if op is not None and op.layout is not None else None
            self.operation(node, operands, rule(self.view(node, operands, info.options)) if rule else HeadsKind.GATHER)
        elif info.kind in (CallKind.FN, CallKind.GRAD) and info.name in self.c.fns:
            self.boundary(node, info)
        else:  # extern and python fns take every value whole: their declared types are checked whole
            self.operation(node, operands, HeadsKind.GATHER)

    def boundary(self, node: A.Call, info: CallInfo) -> None:
        """A call of a function of the program: each argument laid out as the callee takes it."""
        callee = self.c.fns[info.name]
        theirs = self.all_dims.get(callee.name, frozenset())
        for arg, param in zip(info.args, callee.params):
            mine, wanted = self.axis(arg), head_axis(theirs, param.ty)
            if mine is not None and wanted is None:
                self.mark(arg, HeadsKind.GATHER, (mine,))
            elif mine is None and wanted is not None:
                self.mark(arg, HeadsKind.CUT, (wanted,))
        if info.kind == CallKind.FN:
            given, mine = head_axis(theirs, callee.ret), self.axis(node)
            if given is not None and mine is None:
                self.mark(node, HeadsKind.GATHER, (given,))
            elif given is None and mine is not None:
                self.mark(node, HeadsKind.CUT, (mine,))
