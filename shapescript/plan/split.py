"""The batch over several devices: which dims are split, and what combines values across them.

A batch is split along its batch axis (the first axis of a `[b] Digit` type), and so is every
value with an axis of that dim; the split follows the data into the functions it is passed to.
An operation that reduces over the batch axis combines every device's part: sum, mean,
cross_entropy, batch_norm and contractions (`@`, einsum, reduce with sum) have a lowering to an
all-reduce, which this pass marks on the operation (`across`); anything else across the batch
axis is E1801. The batch axis must stay an axis of its own (E1802), a function takes a split value
at every call or at none (E1804), and Python calls never get split data (E1901).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from ..errors import Span
from ..ir import nodes as N
from ..ir.rewrite import rewrite_body
from ..ir.walk import source_order, statements
from ..ops.table import OPS, PARTIAL, CallView
from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.kinds import CallKind, FnKind
from ..shapes.options import CallOptions, ParamSize
from ..shapes.plans import BatchSplit, Combine, Where
from .planning import Planning

SplitDims = set[Any]  # a function's generic dims that are the batch axis


def split_batches(ctx: Planning) -> N.Module:
    """The pass: each function's split, and each operation's combining across the devices."""
    fns = [f for f in ctx.module.functions if f.kind == FnKind.FN]
    dims = {fn.name: seeds(ctx, fn) for fn in fns}
    propagate(ctx, fns, dims)
    planned: dict[str, N.Function] = {}
    for fn in fns:
        marks: dict[int, Mark] = {}
        if fn.placement.where == Where.WORKERS:
            Classifier(ctx, fn, dims[fn.name], marks).run()
        elif fn.placement.where == Where.CONTROLLER:
            python_calls(ctx, fn, dims[fn.name])
        planned[fn.name] = dataclasses.replace(fn, split=layout(fn, dims[fn.name]),
                                               body=_marked(fn.body, marks) if marks else fn.body)
    return dataclasses.replace(ctx.module, functions=tuple(planned.get(f.name, f) for f in ctx.module.functions))


def seeds(ctx: Planning, fn: N.Function) -> SplitDims:
    """The batch axes a function has by its own types: its batches' and its loops' batches'."""
    out: SplitDims = set()
    batches = [p.ty for p in fn.params if isinstance(p.ty, T.BatchT)]
    batches += [s.var.ty for s in statements(fn.body) if isinstance(s, N.For) and isinstance(s.var.ty, T.BatchT)]
    for t in batches:
        assert isinstance(t, T.BatchT)
        for axis in t.axes[:1]:
            if D.is_generic(axis.size):
                out.add(axis.size)
            elif fn.placement.where != Where.CONTROLLER:
                span = next(p.span for p in fn.params if p.ty is t)
                ctx.error("E1802", f"a batch of a fixed size, {t.show()}, can't be split across "
                          f"{ctx.module.devices.count} devices", span, "a fixed batch size",
                          "give the batch a generic size, as `[b] Digit`")
    return out


def call_sites(fns: list[N.Function]) -> Iterator[tuple[N.Function, N.Expr, N.Function, N.Binding]]:
    """(caller, call, callee, binding of the callee's generic dims) for each call between functions."""
    by_name = {f.name: f for f in fns}
    for fn in fns:
        for node in source_order(fn.body):
            if isinstance(node, N.FnCall) and node.kind == CallKind.FN and node.name in by_name:
                yield fn, node, by_name[node.name], node.binds
            elif isinstance(node, N.GradCall) and node.fn in by_name:
                yield fn, node, by_name[node.fn], node.binds


def propagate(ctx: Planning, fns: list[N.Function], dims: dict[str, SplitDims]) -> None:
    """Carry the split into the functions that split values are passed to, to a fixed point; then
    every call must agree with the callee's split (E1804)."""
    changed = True
    while changed:
        changed = False
        for caller, _, callee, binds in call_sites(fns):
            for generic, dim in binds:
                if dim in dims[caller.name] and generic not in dims[callee.name]:
                    dims[callee.name].add(generic)
                    changed = True
    first_split: dict[tuple[str, object], Span] = {}
    sites = list(call_sites(fns))
    for caller, node, callee, binds in sites:
        for generic, dim in binds:
            if dim in dims[caller.name]:
                first_split.setdefault((callee.name, generic), node.span)
    reported: set[tuple[str, D.Dim]] = set()
    for caller, node, callee, binds in sites:
        for generic, dim in binds:
            key = (callee.name, generic)
            caller_dims = dims[caller.name]
            if dim in caller_dims or generic not in dims[callee.name]:
                if dim not in caller_dims and any(s in caller_dims for s in dim.free_symbols):
                    ctx.error("E1802", f"the batch axis as part of {D.show(dim)} can't stay split", node.span,
                              "the batch axis in arithmetic", "keep the batch axis apart")
                continue
            if key in reported:
                continue
            reported.add(key)
            split_at = first_split.get(key)
            ctx.error("E1804", f"`{callee.name}` takes a split value in one call and a whole one in another",
                      node.span, "a whole value here",
                      f"the value with the batch axis is passed at {split_at}" if split_at else
                      f"`{callee.name}` takes a batch",
                      "call a function of its own for whole values")


def split_axes(dims: SplitDims | frozenset[Any], t: T.Ty) -> list[int]:
    """The axes of a value of type `t` that are split, in a function whose split dims are `dims`."""
    axes = t.axes if isinstance(t, (T.TensorT, T.BatchT)) else ()
    return [k for k, a in enumerate(axes) if a.size in dims]


def layout(fn: N.Function, dims: SplitDims) -> BatchSplit:
    def first(t: T.Ty) -> int | None:
        axes = split_axes(dims, t)
        return axes[0] if axes else None
    return BatchSplit(frozenset(dims), tuple(first(p.ty) for p in fn.params), first(fn.ret))


def python_calls(ctx: Planning, fn: N.Function, dims: SplitDims) -> None:
    """E1901: a Python call in the controller given a batch, or a value with its batch axis."""
    for node in source_order(fn.body):
        if not (isinstance(node, N.FnCall) and node.kind == CallKind.PYTHON):
            continue
        for arg in node.args:
            t = arg.ty
            if isinstance(t, T.BatchT) or split_axes(dims, t):
                ctx.error("E1901", f"the Python function `{node.name}` would get split data: every device's "
                          f"part would have to come through the controller at each step", arg.span,
                          f"this is {t.show()}, split across the devices",
                          "prepare examples in the dataset as it loads them, or declare an `extern fn`, "
                          "which runs on the devices")


@dataclasses.dataclass(frozen=True)
class Mark:
    """What the split found at an operation: how its devices' results combine (None: they don't),
    and the options an op's call takes instead of its own when its operand is split."""
    across: Combine | None = None
    options: CallOptions | None = None


def _marked(body: tuple[N.Stmt, ...], marks: dict[int, Mark]) -> tuple[N.Stmt, ...]:
    """`body` with each marked operation (by the identity of its node in `body`) carrying its mark."""
    def change(original: N.Expr, inner: N.Expr) -> N.Expr:
        mark = marks.get(id(original))
        if mark is None:
            return inner
        if isinstance(inner, N.OpCall):
            return dataclasses.replace(inner, across=mark.across, options=mark.options or inner.options)
        assert isinstance(inner, N.BinOp) and mark.options is None
        return dataclasses.replace(inner, across=mark.across)
    return rewrite_body(body, change)


class Classifier:
    """Marks each operation of a function on the workers that works across the batch axis."""

    def __init__(self, ctx: Planning, fn: N.Function, dims: SplitDims, marks: dict[int, Mark]) -> None:
        self.ctx, self.fn, self.dims = ctx, fn, dims
        self.marks = marks  # what the pass finds, by the identity of the node in fn's body

    def error(self, code: str, message: str, span: Span, label: str, *help: str) -> None:
        self.ctx.error(code, message, span, label, *help)

    def run(self) -> None:
        if not self.dims:
            return
        for node in source_order(self.fn.body):
            if isinstance(node, N.OpCall) and self.call(node):
                continue  # refused across the batch axis (E1801): its result's type adds nothing
            if isinstance(node.ty, T.TensorT):
                self.check_type(node, node.ty)
            if isinstance(node, N.Size):
                self.size_of_batch(node)
            elif isinstance(node, N.BinOp) and node.op == "@":
                self.contraction(node, node.left)
            elif isinstance(node, N.FnCall) and node.kind == CallKind.EXTERN:
                self.extern_axes(node)

    def check_type(self, node: N.Expr | N.Target, t: T.TensorT) -> None:
        split = [a for a in t.axes if a.size in self.dims]
        grouped = [a for a in t.axes if a.size not in self.dims
                   and any(s in self.dims for s in a.size.free_symbols)]
        if grouped:
            self.error("E1802", f"the batch axis is grouped with another in {t.show()}, so it can't stay split "
                       f"across the devices", node.span, f"this is {t.show()}",
                       "keep the batch axis apart, as in b (h w) rather than (b h) w")
        elif len(split) > 1:
            self.error("E1802", f"{t.show()} has the batch axis twice", node.span, "two batch axes",
                       "each device holds one part of the batch; a value can be split along one axis")

    def size_of_batch(self, node: N.Size) -> None:
        dim = self.fn.generics.get(node.name)
        if dim is not None and dim in self.dims:
            self.error("E1802", f"`{node.name}`, the batch's size, as a number would be each device's part's size",
                       node.span, "the batch's size", "use mean rather than a sum divided by the batch's size")

    def split_positions(self, t: T.Ty | None) -> list[int]:
        return split_axes(self.dims, t) if t is not None else []

    def mark(self, node: N.Expr, across: Combine | None = None, options: CallOptions | None = None) -> None:
        old = self.marks.get(id(node), Mark())
        self.marks[id(node)] = Mark(across or old.across, options or old.options)

    def across(self, node: N.Expr, what: str) -> None:
        self.error("E1801", f"{what} across the batch axis has no lowering for several devices", node.span,
                   "across the batch axis",
                   "compute it per example, or with an operation that has a lowering (sum, mean, "
                   "cross_entropy, @), or declare one device")

    def contraction(self, node: N.BinOp, left: N.Expr) -> None:
        t = left.ty
        if isinstance(t, T.TensorT) and t.rank and t.axes[-1].size in self.dims:
            self.mark(node, PARTIAL)

    def call(self, node: N.OpCall) -> bool:
        """Mark what the call does along the batch axis; whether it is refused there (E1801)."""
        op = OPS[node.op]
        across, view = op.across, self.view(node)  # the op table says what it does along the batch axis
        if across.over_batch is not None and across.over_batch(view):
            kind = across.kind_of(view)
            if kind is None:
                self.across(node, across.refused_as(view) if across.refused_as else f"`{op.name}`")
                return True
            self.mark(node, kind)
        if across.split_options is not None:
            self.mark(node, options=across.split_options(view))
        return False

    def view(self, node: N.OpCall) -> CallView[CallOptions]:
        return CallView(node.options, tuple(a.ty if a is not None else None for a in node.args), node.ty,
                        self.split_positions, lambda size: isinstance(size, tuple) and self.is_split_param(size))

    def extern_axes(self, node: N.FnCall) -> None:
        """An extern fn works on each example by itself, except along the axes it is given: given the
        batch axis, it would see only each device's part of it."""
        for arg in node.args:
            t = arg.ty
            if isinstance(t, T.AxisArgT) and (t.dim in self.dims
                                               or any(s in self.dims for s in t.dim.free_symbols)):
                self.error("E1801", f"`{node.name}` along the batch axis has no lowering for several devices: "
                           f"each device would see only its part of the batch", arg.span,
                           "the batch axis, split across the devices",
                           "give the extern fn another axis, compute it per example, or declare one device")

    def is_split_param(self, source: ParamSize) -> bool:
        param, axis = source
        p = next(p for p in self.fn.params if p.name == param)
        if axis == "size":
            return True
        t = p.ty
        assert isinstance(t, (T.TensorT, T.BatchT)) and isinstance(axis, int)
        return t.axes[axis].size in self.dims
