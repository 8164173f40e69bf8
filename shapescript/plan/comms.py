"""The DeviceTable: how a program's values lie on its devices, and what each line sends.

Worked out from the planned IR (placement, the batch split and the layout options' marks on its
nodes), never from running anything. It is one table for every front end: `shapescript comms`, the
language server's hovers and the notebook's widgets all read it (plan/comms_text.py renders it).

Each collective is the lowering's own (runtime/collectives.py): an operation across the batch axis
is one all-reduce (sum and contractions send their result's values, mean its sum and a count,
cross_entropy a sum and a count, batch_norm 2·C + 1 values in f64), and value_and_grad all-reduces
the whole params' gradients, one buffer per dtype. A collective of floats in a function that
value_and_grad differentiates runs again, as big, in the backward pass, so it counts twice there.
Sizes are sympy expressions with the declared dims' values put in; the batch's own dims stay
symbols (`3,072·b·n` bytes), printed by their written names (`3072*b*n`, not sympy's `_b` of a
generic dim). Each record's `bytes_text` is its size in the words `shapescript comms` prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field

import sympy

from ..check.program import Checked
from ..devices import shares, shares_text
from ..dtypes import FLOAT_DTYPES
from ..errors import Span
from ..ir import nodes as N
from ..ir.walk import source_order, statement_parts, statements, walk
from ..ops.table import OPS, PARTIAL_PRODUCTS, CallView, numel
from ..optimizers import FACTS
from ..shapes import value_types as T
from ..shapes.kinds import CallKind, FnKind
from ..shapes.options import BatchesOptions
from ..shapes.plans import HeadsKind, LayoutChoice, Where
from ..syntax.tree import MemberKind
from .accumulate import pending_names, reads_pending, reads_whole
from .layout import Dims, head_axis, model_params, sharded_read
from .precision import ComputeDtypes
from .records import DTYPE_BYTES, Collective, FnPlan, Layout, LineItem, Named, Sent, ValueKind
from .split import split_axes


def device_table(checked: Checked) -> DeviceTable:
    """How values are laid out over the devices and what every line sends between them: worked out
    when first asked for (a one-device build never needs it), then kept on `checked`."""
    if not isinstance(checked.table, DeviceTable):  # a frozen Checked's one field filled late
        object.__setattr__(checked, "table", DeviceTable.of(checked))
    assert isinstance(checked.table, DeviceTable)
    return checked.table


@dataclass
class DeviceTable:
    """device_table(checked): the program's layout and communication on its device set."""
    devices: str
    count: int
    batch: int | None  # the batch size of the program's batches(n), for shares
    batch_span: Span | None
    fns: dict[str, FnPlan] = field(default_factory=dict)
    values: list[Layout] = field(default_factory=list)
    models: dict[str, Layout] = field(default_factory=dict)
    lines: dict[int, list[LineItem]] = field(default_factory=dict)
    file: str = ""
    shard_params: bool = False
    heads: str | None = None  # `split H`'s dim
    heads_size: int | None = None
    hosts: int = 1  # `2 x cuda[0 1]`: `count` is every host's devices, and every collective crosses hosts
    choice: LayoutChoice | None = None  # `layout auto`'s: the layout chosen, and the others weighed

    @property
    def per_host(self) -> int:
        return self.count // self.hosts

    @property
    def crosses_hosts(self) -> bool:
        """Whether the collectives cross hosts: each runs over all the workers, so with more than
        one host, every one does."""
        return self.hosts > 1

    @classmethod
    def of(cls, checked: Checked) -> DeviceTable:
        table = TableBuilder(checked.module).build()
        table.choice = checked.layout_choice
        return table

    def shares(self, batch: int | None = None) -> list[int] | None:
        n = batch if batch is not None else self.batch
        return shares(n, self.count) if n is not None else None

    def shares_text(self, batch: int | None = None) -> str | None:
        """The shares in words ("22/21/21"; grouped on many devices), or None without a batch size."""
        n = batch if batch is not None else self.batch
        return shares_text(n, self.count) if n is not None else None

    def line(self, number: int) -> list[LineItem]:
        return self.lines.get(number, [])

    def value_at(self, line: int, column: int) -> Layout | None:
        return next((v for v in self.values if _inside(v.span, line, column)), None)

    def fn_at(self, line: int, column: int) -> FnPlan | None:
        return next((f for f in self.fns.values() if _inside(f.span, line, column)), None)


def _inside(span: Span, line: int, column: int) -> bool:
    return span.line == line and span.col <= column < max(span.end_col, span.col + 1)


class TableBuilder:
    def __init__(self, module: N.Module) -> None:
        self.m = module
        self.fns = {f.name: f for f in module.functions}
        self.values = {sympy.Symbol(k, integer=True, positive=True): v
                       for k, v in module.dims.items() if v is not None}
        self.count = module.devices.count
        self.memo: dict[tuple[str, bool], tuple[Sent, ...]] = {}
        self.differentiated = self._differentiated()
        self.sharding = module.devices.shard_params and self.count > 1
        self.named: dict[sympy.Dummy, Named] = {}  # each generic dim, as the table's sizes print it
        self.computed = ComputeDtypes(module)  # `precision mixed bf16`: values sent in the dtype computed

    def size(self, expr: sympy.Expr) -> sympy.Expr:
        expr = sympy.sympify(expr)
        generic = {d: self.shown(d) for d in expr.free_symbols
                   if isinstance(d, sympy.Dummy) and not isinstance(d, Named)}
        size: sympy.Expr = sympy.expand(expr.xreplace({**self.values, **generic}))
        return size

    def shown(self, dim: sympy.Dummy) -> Named:
        """The generic dim `dim` as the table's sizes hold it: one Named for each."""
        if dim not in self.named:
            self.named[dim] = Named(str(dim.name), integer=True, positive=True)  # type: ignore[no-untyped-call]
        return self.named[dim]

    def build(self) -> DeviceTable:
        batch, batch_span = self._batch_size()
        heads = self.m.heads
        table = DeviceTable(str(self.m.devices), self.count, batch, batch_span, file=self.m.file,
                            shard_params=self.sharding, heads=heads,
                            heads_size=self.m.dims.get(heads) if heads else None,
                            hosts=self.m.devices.hosts)
        for model in self.m.models:
            table.models[model.name] = self.model_layout(model.name, None, model.node.name_span, model)
        for fn in self.m.functions:
            if fn.kind != FnKind.FN:
                continue
            table.fns[fn.name] = FnPlan(fn.name, fn.name_span, fn.placement.where, fn.placement.reason,
                                        self.sends(fn.name, False), fn.name in self.differentiated,
                                        self.sends(fn.name, True))
            table.values.extend(self.layouts(fn))
            for item in self.line_items(fn):
                table.lines.setdefault(item.span.line, []).append(item)
        return table

    # -- where the batch size comes from ------------------------------------------------------------

    def _batch_size(self) -> tuple[int | None, Span | None]:
        for fn in self.m.functions:
            for node in walk(fn.body):
                options = node.options if isinstance(node, N.OpCall) else None
                size = options.batch_size if isinstance(options, BatchesOptions) else None
                if isinstance(size, int):  # `batches(n)` with n written as a number
                    return size, node.span
        return None, None

    def _differentiated(self) -> set[str]:
        """The functions value_and_grad differentiates, and those they call."""
        out: set[str] = set()
        todo = [e.fn for f in self.m.functions for e in walk(f.body) if isinstance(e, N.GradCall)]
        while todo:
            name = todo.pop()
            if name in out or name not in self.fns:
                continue
            out.add(name)
            todo.extend(self.fns[name].calls)
        return out

    # -- what a call sends ----------------------------------------------------------------------------

    def sends(self, name: str, differentiated: bool) -> tuple[Sent, ...]:
        """Everything one call of `name` sends, its calls included, in the order of the source."""
        key = (name, differentiated)
        if key not in self.memo:
            self.memo[key] = ()  # recursion is refused by the checker; this only guards the walk
            fn = self.fns[name]
            out: list[Sent] = []
            if self.count > 1 and fn.kind == FnKind.FN:
                for item in self.line_items(fn, differentiated):
                    out.extend(Sent(s.collective, _count(s.times * item.repeats), s.via) for s in item.sent)
            self.memo[key] = tuple(out)
        return self.memo[key]

    def line_items(self, fn: N.Function, differentiated: bool = False) -> Iterator[LineItem]:
        """Each collective in `fn`'s body, and each call that sends something, in source order."""
        if self.count == 1 or fn.kind != FnKind.FN:
            return
        # gradients a deferred value_and_grad leaves each device's own: averaged where first read whole
        pending = pending_names(fn) if any(isinstance(e, N.GradCall) and e.deferred for e in walk(fn.body)) else None
        for node, marks, times in self.operations(fn.body, sympy.Integer(1)):
            read = self.first_read(node, pending)
            if read is not None:
                yield LineItem(node.span, fn.name, tuple(Sent(c) for c in self.gradients(fn, node, read)),
                               repeats=times)
                continue
            if isinstance(node, N.Member) and node.gathered:
                yield dataclasses.replace(self.gathered(fn, node, differentiated), repeats=times)
                continue
            for item in self.heads_items(fn, node, marks, differentiated):  # `split H`'s, and then the node's own
                yield dataclasses.replace(item, repeats=times)
            collective = self.collective(fn, node) or self.sharded(fn, node)
            if collective is not None:
                twice = differentiated and collective.dtype in FLOAT_DTYPES
                yield LineItem(node.span, fn.name, (Sent(collective, 2 if twice else 1),), collective, repeats=times)
                continue
            if isinstance(node, N.GradCall):
                callee, grad = self.fns[node.fn], True
            elif isinstance(node, N.FnCall) and node.kind == CallKind.FN:
                callee, grad = self.fns[node.name], False
            else:
                continue
            if fn.placement.where == Where.CONTROLLER and callee.placement.where == Where.CONTROLLER:
                continue  # runs in the controller: sends nothing itself
            sent: list[Sent] = []
            if isinstance(node, N.GradCall) and not node.deferred:
                sent.extend(Sent(c) for c in self.gradients(fn, node, node.args[0]))
            inner = self.sends(callee.name, differentiated or grad)
            sent.extend(self.rebound(s, node.binds, callee.name) for s in inner)
            if sent:
                yield LineItem(node.span, fn.name, tuple(sent), callee=callee.name,
                               differentiated=differentiated or grad, repeats=times)

    def rebound(self, s: Sent, binds: N.Binding, callee: str) -> Sent:
        """A callee's Sent as its caller's line sends it: the callee's generic dims (a `[b n D]`'s n)
        given the sizes the call binds them to (the caller's `T`, or its own generic dims)."""
        sizes = {self.shown(mine): self.size(theirs) for mine, theirs in binds if isinstance(mine, sympy.Dummy)}
        if not sizes:
            return Sent(s.collective, s.times, (callee,) + s.via)
        collective = dataclasses.replace(s.collective, count=sympy.expand(s.collective.count.xreplace(sizes)))
        return Sent(collective, _count(sympy.sympify(s.times).xreplace(sizes)), (callee,) + s.via)

    def operations(self, body: tuple[N.Stmt, ...], times: sympy.Expr
                   ) -> Iterator[tuple[N.Expr, tuple[N.Heads, ...], sympy.Expr]]:
        """Each expression of `body` in source order, with the `split H` marks around it (the first
        innermost) and how often one run of the function runs it: L times in a loop over a stack of
        L models (`for block in m.blocks`)."""
        for s in body:
            marks: list[N.Heads] = []
            for part in statement_parts(s):
                if isinstance(part, N.Heads):
                    marks.insert(0, part)  # the marks come outermost first, the value after them
                elif isinstance(part, N.Expr):
                    yield part, tuple(marks), times
                    marks = []
            if isinstance(s, N.For):
                inner = times * self.passes(s.iter.ty)
                yield from self.operations(s.body, inner)
            elif isinstance(s, N.If):  # either branch may run: each shows what it sends when it does
                yield from self.operations(s.then, times)
                yield from self.operations(s.orelse, times)

    def passes(self, iterated: T.Ty) -> sympy.Expr:
        """How many times a loop runs its body: L over a stack of L models, K over `range(K)`, and a
        symbol `passes` where only the run knows (a range of an int parameter, a dataset's batches)."""
        count = iterated.count if isinstance(iterated, T.StackT | T.RangeT) else sympy.Integer(1)
        return self.size(count) if count is not None else sympy.Symbol("passes", positive=True)

    def collective(self, fn: N.Function, node: N.Expr) -> Collective | None:
        across = node.across if isinstance(node, N.OpCall | N.BinOp) else None
        if not across:
            return None
        result = node.ty
        op = OPS[node.op] if isinstance(node, N.OpCall) else None
        if op is not None and op.across.payload is not None:  # the op table says what it sends
            assert isinstance(node, N.OpCall)
            dims = self.split_dims(fn)
            view = CallView(node.options, tuple(a.ty if a is not None else None for a in node.args), result,
                            lambda t: split_axes(dims, t) if t is not None else [], lambda size: False)
            sent = op.across.payload(view)
            carries_result = isinstance(result, T.TensorT) and sent.dtype == result.dtype  # its values, as computed
            dtype = (self.computed.of(fn, node) or sent.dtype) if carries_result else sent.dtype
            return self._make(fn, node, sent.what, sent.values, dtype)
        assert isinstance(result, T.TensorT)  # `@`, einsum, reduce: every device's partial product, summed
        return self._make(fn, node, PARTIAL_PRODUCTS, numel(result), self.computed.of(fn, node) or result.dtype)

    def gathered(self, fn: N.Function, node: N.Member, differentiated: bool) -> LineItem:
        """A read of a sharded param: an all-gather of the pieces, each device's ceil(n / N) of its n
        values (the last piece padded); differentiated, the backward pass gathers it again (it was
        freed after use) and reduce-scatters its gradient into the pieces."""
        read = sharded_read(node)
        assert read is not None
        model, member, tensor = read
        values = self.size(sympy.ceiling(numel(tensor) / self.count) * self.count)
        gather = Collective("all-gather", f"`{model.name}`'s param `{member.name}` from every device's piece "
                            f"(padded to {self.count} equal pieces)", fn.name, node.span, values, tensor.dtype)
        scatter = Collective("reduce-scatter", f"the gradient of `{member.name}`, every device's part added up "
                             f"and cut into the pieces", fn.name, node.span, values, tensor.dtype)
        sent = (Sent(gather, 2), Sent(scatter)) if differentiated else (Sent(gather),)
        return LineItem(node.span, fn.name, sent, gather, backward=scatter, again=True)

    def heads_items(self, fn: N.Function, node: N.Expr, marks: tuple[N.Heads, ...],
                    differentiated: bool) -> Iterator[LineItem]:
        """`split H` at a value: a gather is an all-gather (its backward a reduce-scatter), a sum of
        partial results an all-reduce (its backward one as big); a cut sends nothing."""
        t = node.ty
        for mark in marks:
            if mark.kind == HeadsKind.CUT or not isinstance(t, T.TensorT):
                continue
            values = self.size(numel(t))
            t = dataclasses.replace(t, dtype=self.computed.of(fn, node) or t.dtype)  # the dtype computed, sent
            if mark.kind == HeadsKind.SUM:
                total = Collective("all-reduce", f"the partial results of every device's part of "
                                   f"{self.m.heads}, added up", fn.name, node.span, values, t.dtype)
                twice = differentiated and t.dtype in FLOAT_DTYPES
                yield LineItem(node.span, fn.name, (Sent(total, 2 if twice else 1),), total)
                continue
            axis = t.axes[mark.axes[0]] if mark.axes and mark.axes[0] is not None else None
            along = f" along {axis.show()}" if axis is not None else ""
            gather = Collective("all-gather", f"a {t.show()} whole from every device's part{along}", fn.name,
                                node.span, values, t.dtype)
            scatter = Collective("reduce-scatter", "its gradient, every device's added up and cut into the "
                                 "parts", fn.name, node.span, values, t.dtype)
            floats = t.dtype in FLOAT_DTYPES
            sent = (Sent(gather), Sent(scatter)) if differentiated and floats else (Sent(gather),)
            yield LineItem(node.span, fn.name, sent, gather, backward=scatter if floats else None)

    def heads_layout(self, fn: N.Function, name: str, span: Span, ty: T.Ty) -> Layout | None:
        """With `split H`, a value split along H (or a group starting with it); None otherwise."""
        split = fn.split
        if split is None or not split.heads or not isinstance(ty, T.TensorT):
            return None
        k = head_axis(split.dims, ty)
        if k is None:
            return None
        whole = numel(ty) * DTYPE_BYTES[ty.dtype]
        return Layout(name, fn.name, span, ty.show(), ValueKind.HEADS, ty.axes[k].show(), self.size(whole),
                      self.size(whole / self.count))

    def sharded(self, fn: N.Function, node: N.Expr) -> Collective | None:
        """What an op sends of its own when each device holds pieces of the params (its layout rule)."""
        op = OPS[node.op] if isinstance(node, N.OpCall) else None
        if op is None or op.layout is None or op.layout.sharded is None:
            return None
        assert isinstance(node, N.OpCall)
        first = node.args[0] if node.args else None
        grads = first.ty if first is not None else None
        if not (isinstance(grads, T.GradT) and self.parts(grads.model)):
            return None
        view = CallView(node.options, tuple(a.ty if a is not None else None for a in node.args), node.ty,
                        lambda t: [], lambda size: False)
        sent = op.layout.sharded(view)
        return None if sent is None else self._make(fn, node, sent.what, sent.values, sent.dtype)

    def split_dims(self, fn: N.Function) -> Dims:
        return fn.split.dims if fn.split is not None else frozenset()

    def _make(self, fn: N.Function, node: N.Expr, what: str, values: sympy.Expr, dtype: str) -> Collective:
        return Collective("all-reduce", what, fn.name, node.span, self.size(values), dtype)

    def first_read(self, node: N.Expr, pending: set[str] | None) -> T.Ty | None:
        """The model whose pending gradients `node` reads whole (update, clip_norm, norm, a field):
        each such read averages them, a variable's in place (taken out of `pending`), a worked-out
        value's as it is; None if it reads none."""
        if not pending:
            return None
        if isinstance(node, N.OpCall) and reads_whole(node):
            read = next((a for a in node.args if a is not None and isinstance(a.ty, T.GradT)), None)
        elif isinstance(node, N.Member) and isinstance(node.obj.ty, T.GradT):
            read = node.obj
        else:
            return None
        if read is None or not reads_pending(read, pending):
            return None
        if isinstance(read, N.Name):  # averaged in place: read whole from then on
            pending.discard(read.id)
        assert isinstance(read.ty, T.GradT)
        return read.ty.model

    def gradients(self, fn: N.Function, node: N.Expr, model_arg: N.Expr | T.Ty) -> list[Collective]:
        """value_and_grad's all-reduce of the whole params' gradients (or, deferred, that of their
        first reader's): one per dtype."""
        model = model_arg if isinstance(model_arg, T.Ty) else model_arg.ty
        if not isinstance(model, T.ModelT) or self.sharding:
            return []  # sharded: each gathered param's gradient is reduce-scattered where it's read
        by_dtype: dict[str, list[tuple[str, sympy.Expr]]] = {}
        heads = self.m.heads
        for p in model_params(model):
            if (p.owner, p.name) not in self.m.head_params:  # a part along H: each device's gradient is its own
                by_dtype.setdefault(p.tensor.dtype, []).append((p.path, p.copies * numel(p.tensor)))
        out = []
        for dtype, items in by_dtype.items():
            names = [f"`{p}`" for p, _ in items]
            listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"
            what = (f"the gradients of `{model.name}`'s params {listed}, " + (
                f"each device's from its own part of {heads}, added up" if heads else
                "every device's part of the batch added up"))
            out.append(Collective("all-reduce", what, fn.name, node.span,
                                  self.size(sympy.Add(*(v for _, v in items))), dtype))
        return out

    # -- how values lie ---------------------------------------------------------------------------------

    def layouts(self, fn: N.Function) -> Iterator[Layout]:
        """Each parameter, and each name in the body that holds a value (a variable's every use)."""
        variables = {p.name for p in fn.params}
        variables.update(t.name for s in statements(fn.body) if isinstance(s, N.Assign) for t in s.targets)
        variables.update(s.var.name for s in statements(fn.body) if isinstance(s, N.For))
        for p in fn.params:
            yield self.layout(fn, p.name, p.span, p.ty)
        computed = self.computed.names(fn) if self.m.mixed else {}  # `precision mixed bf16`: as computed
        for part in source_order(fn.body):
            name = part.name if isinstance(part, N.Target) else part.id if isinstance(part, N.Name) else None
            if name in variables:
                ty = part.ty
                if name in computed and isinstance(ty, T.TensorT):
                    ty = dataclasses.replace(ty, dtype=computed[name])
                yield self.layout(fn, name, part.span, ty)

    def model_layout(self, name: str, fn: str | None, span: Span, ty: T.ModelT | T.StackT) -> Layout:
        """A model's copy on each device; with `shard params` each device's pieces of its params, with
        `split H` its part of those with H (and the others whole, or in pieces with both)."""
        model, count = (ty, 1) if isinstance(ty, T.ModelT) else (ty.model, ty.count)
        if not self.parts(model):
            return Layout(name, fn, span, ty.show(), ValueKind.MODEL, bytes=self.size(model_bytes(model) * count))
        buffers = self.size((model_bytes(model) - param_bytes(model)) * count)
        return Layout(name, fn, span, ty.show(), ValueKind.MODEL, bytes=self.size(self.param_bytes(model) * count),
                      sharded=True, buffers=buffers, split_params=self.head_params(model))

    def parts(self, model: T.ModelT) -> bool:
        """Whether each device holds parts of some of the model's params (`shard params`, `split H`)."""
        return self.sharding or bool(self.head_params(model))

    def head_params(self, model: T.ModelT) -> tuple[str, ...]:
        """The paths of the model's params split along H (`split H`): those with an H axis."""
        return tuple(p.path for p in model_params(model) if (p.owner, p.name) in self.m.head_params)

    def param_bytes(self, model: T.ModelT) -> sympy.Expr:
        """The bytes of one device's part of each of a model's trained params: 1/N of each with H
        (`split H`); ceil(n / N) values of every other one with `shard params`, else all of it."""
        total: sympy.Expr = sympy.Integer(0)
        for p in model_params(model):
            values = numel(p.tensor)
            if (p.owner, p.name) in self.m.head_params:
                values = values / self.count
            elif self.sharding:
                values = sympy.ceiling(values / self.count)
            total += p.copies * values * DTYPE_BYTES[p.tensor.dtype]
        return total

    def layout(self, fn: N.Function, name: str, span: Span, ty: T.Ty) -> Layout:
        shown = ty.show()
        if isinstance(ty, (T.ModelT, T.StackT)):
            return self.model_layout(name, fn.name, span, ty)
        if isinstance(ty, T.OptT):  # its state's size where its kind alone says it (optimizers.py)
            per_param = FACTS[ty.kind].state_per_param
            state = None if per_param is None else self.size(per_param * self.param_bytes(ty.model))
            return Layout(name, fn.name, span, shown, ValueKind.OPTIMIZER, bytes=state, sharded=self.parts(ty.model),
                          split_params=self.head_params(ty.model), state=FACTS[ty.kind].state_text)
        if isinstance(ty, T.GradT) and self.parts(ty.model):
            return Layout(name, fn.name, span, shown, ValueKind.WHOLE, bytes=self.size(self.param_bytes(ty.model)),
                          sharded=True, split_params=self.head_params(ty.model))
        heads = self.heads_layout(fn, name, span, ty)
        if heads is not None:
            return heads
        where = fn.placement.where
        if where == Where.CONTROLLER and not isinstance(ty, T.BatchT):
            return Layout(name, fn.name, span, shown, ValueKind.CONTROLLER)
        axes, per_example = value_axes(ty)
        if axes is None:
            return Layout(name, fn.name, span, shown, ValueKind.CONTROLLER if where == Where.CONTROLLER else ValueKind.WHOLE)
        dims = self.split_dims(fn)
        split = [a for a in axes if a.size in dims] if self.count > 1 else []
        whole = sympy.Mul(*(a.size for a in axes)) * per_example
        if isinstance(ty, T.BatchT) and (split or where == Where.CONTROLLER) and not self.m.heads:
            first = ty.axes[0]
            return Layout(name, fn.name, span, shown, ValueKind.SPLIT if self.count > 1 else ValueKind.WHOLE, first.show(),
                          self.size(whole), self.size(whole / first.size))
        if split:
            return Layout(name, fn.name, span, shown, ValueKind.SPLIT, split[0].show(), self.size(whole),
                          self.size(whole / split[0].size))
        return Layout(name, fn.name, span, shown, ValueKind.WHOLE, bytes=self.size(whole))


def _count(times: sympy.Expr | int) -> sympy.Expr | int:
    """How often a collective runs: an int where the dims' sizes make it one."""
    value = sympy.sympify(times)
    return int(value) if value.is_Integer else value


def param_bytes(model: T.ModelT) -> sympy.Expr:
    """The bytes of a model's trained params, whole."""
    return sympy.Add(*(p.copies * numel(p.tensor) * DTYPE_BYTES[p.tensor.dtype] for p in model_params(model)))


def model_bytes(model: T.ModelT) -> sympy.Expr:
    """Params and buffers, as each device's copy holds them."""
    total: sympy.Expr = sympy.Integer(0)
    for m in model.members.values():
        if m.kind in (MemberKind.PARAM, MemberKind.BUFFER) and m.tensor is not None:
            total += numel(m.tensor) * DTYPE_BYTES[m.tensor.dtype]
        elif m.kind == MemberKind.SUB and m.model is not None:
            total += model_bytes(m.model) * (m.count if m.count is not None else 1)
    return total


def value_axes(ty: T.Ty) -> tuple[tuple[T.AxisT, ...] | None, sympy.Expr]:
    """A value's axes and bytes per element of them (a batch's: its fields' bytes per example)."""
    if isinstance(ty, T.TensorT):
        return ty.axes, sympy.Integer(DTYPE_BYTES[ty.dtype])
    if isinstance(ty, T.BatchT):  # a field's type has the batch's axes in front
        fields = [ty.field(f) for f in ty.data.fields]
        per = sympy.Add(*(numel(f) * DTYPE_BYTES[f.dtype] for f in fields)) / sympy.Mul(*(a.size for a in ty.axes))
        return ty.axes, per
    return None, sympy.Integer(0)
