"""Fusion: spans of the IR that torch has one kernel for, rewritten to use it.

Three rewrites, each exact up to float rounding (tests/compiler/test_fusion.py compares every one with the
program's own unfused build):
- causal attention written out, softmax(masked_fill(q·kᵀ · scale, causal(i, j), -1e9), over=j)·v,
  becomes `F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=...)`: one kernel that
  never holds the masked scores, forward or backward;
- `layer_norm(x, over=D) * gain + bias` over the last axis becomes the affine `F.layer_norm(x,
  gain.shape, gain, bias)`: the built-in's call with its weight and bias given (its eps kept), or,
  for the std library's extern fn (`shapescript.std.layer_norm`), `_rt.affine_layer_norm`;
- a causal mask that only masks (`masked_fill(x, causal(i, j), v)`) is built once per size and
  device and shared, rather than at each call, in each layer, at every step.

A rewrite consumes intermediate variables only when nothing else reads them; it never fires on a
span that combines across the batch axis (all of it works per example).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.kinds import CallKind, FnKind
from ..shapes.options import AxisOptions, EinsumOptions, MaskOptions, NormalizeOptions, SizesOptions
from . import nodes as N
from .walk import exprs, sizes_read, statements, walk

LAYER_NORM = "shapescript.std.layer_norm"  # the extern fn's target that programs declared before the built-in
BUILTIN_LAYER_NORM = "layer_norm"
MASKED = -1e9  # a fill this low leaves softmax exactly 0 there in every float dtype, as -inf does


def fuse(module: N.Module) -> N.Module:
    norms = frozenset(f.name for f in module.functions if f.kind == FnKind.EXTERN and f.target == LAYER_NORM)
    return dataclasses.replace(module, functions=tuple(_Function(f, norms, module.derived).fused()
                                                       for f in module.functions))


class _Function:
    def __init__(self, fn: N.Function, norms: frozenset[str], derived: D.Definitions) -> None:
        self.fn, self.norms = fn, norms  # norms: the extern fns that are the std library's layer_norm
        self.derived = derived  # the program's derived dims: `[n D]` and `[n (H Dh)]` are one type
        reads = Counter(n.id for n in walk(fn.body) if isinstance(n, N.Name))
        self.writes = Counter(t.name for s in statements(fn.body) if isinstance(s, N.Assign) for t in s.targets)
        self.writes.update(s.var.name for s in statements(fn.body) if isinstance(s, N.For))
        self.params = {p.name for p in fn.params}
        # Variables assigned once, at the body's top level, and read once: a rewrite may absorb them.
        self.single = {s.targets[0].name: s.value for s in fn.body
                       if isinstance(s, N.Assign) and len(s.targets) == 1 and self.writes[s.targets[0].name] == 1
                       and reads[s.targets[0].name] == 1 and s.targets[0].name not in self.params}
        self.absorbed: set[str] = set()

    def fused(self) -> N.Function:
        body = tuple(self.stmt(s) for s in self.fn.body)
        body = tuple(s for s in body if not (isinstance(s, N.Assign) and s.targets[0].name in self.absorbed))
        return dataclasses.replace(self.fn, body=body, sizes=sizes_read(body))

    def stmt(self, s: N.Stmt) -> N.Stmt:
        if isinstance(s, N.Assign):
            return dataclasses.replace(s, value=self.expr(s.value))
        if isinstance(s, N.Return):
            return s if s.value is None else dataclasses.replace(s, value=self.expr(s.value))
        if isinstance(s, N.For):
            return dataclasses.replace(s, iter=self.expr(s.iter), body=tuple(self.stmt(b) for b in s.body))
        if isinstance(s, N.If):
            return dataclasses.replace(s, cond=self.expr(s.cond), then=tuple(self.stmt(b) for b in s.then),
                                       orelse=tuple(self.stmt(b) for b in s.orelse))
        assert isinstance(s, N.Do)
        return dataclasses.replace(s, expr=self.expr(s.expr))

    def expr(self, e: N.Expr) -> N.Expr:
        fused = self.attention(e) or self.layer_norm(e)
        if fused is not None:
            return _map_children(fused, self.expr)  # its operands may hold more
        if isinstance(e, N.OpCall) and e.op == "masked_fill" and isinstance(e.args[1], N.OpCall) \
                and e.args[1].op == "causal" and not e.across:
            mask = e.args[1]
            assert isinstance(mask.options, SizesOptions)  # causal's
            shared = N.CausalMask(mask.ty, mask.span, mask.options.sizes)
            x, fill = e.args[0], e.args[2]
            assert x is not None and fill is not None
            return dataclasses.replace(e, args=(self.expr(x), shared, self.expr(fill)))
        return _map_children(e, self.expr)

    def value(self, e: N.Expr) -> tuple[N.Expr, str | None]:
        """`e`, or what the variable `e` names when a rewrite may absorb it (and that variable): it
        is assigned once and read only here, and what it reads is never assigned again."""
        if isinstance(e, N.Name) and e.id in self.single and e.id not in self.absorbed:
            value = self.single[e.id]
            if all(self.writes[n.id] == (0 if n.id in self.params else 1)
                   for n in exprs(value) if isinstance(n, N.Name)):
                return value, e.id
        return e, None

    # ---- causal attention -----------------------------------------------------------------------

    def attention(self, e: N.Expr) -> N.Expr | None:
        if not (isinstance(e, N.OpCall) and e.op == "einsum" and len(e.args) == 2 and not e.across
                and _contracts(e, "P i j,P j d->P i d")):
            return None
        weights, v = e.args
        assert weights is not None and v is not None
        weights, took_weights = self.value(weights)
        if not (_is_op(weights, "softmax", last_axis=True) and isinstance(weights, N.OpCall)):
            return None
        assert weights.args[0] is not None
        masked, took_masked = self.value(weights.args[0])
        if not (isinstance(masked, N.OpCall) and _is_op(masked, "masked_fill")
                and isinstance(masked.args[1], N.OpCall) and masked.args[1].op == "causal"
                and isinstance(masked.options, MaskOptions) and masked.options.mask_index == ()
                and _fill_hides(masked.args[2])):
            return None
        assert masked.args[0] is not None
        scaled, took_scaled = self.value(masked.args[0])
        scores, scale = _scaled(scaled)
        scores, took_scores = self.value(scores)
        if not (isinstance(scores, N.OpCall) and _is_op(scores, "einsum")
                and _contracts(scores, "P i e,P j e->P i j")):
            return None
        q, k = scores.args
        assert q is not None and k is not None
        if not _same_lead(self.derived, q.ty, k.ty, v.ty):
            return None
        self.absorbed.update(n for n in (took_weights, took_masked, took_scaled, took_scores) if n is not None)
        return N.Attention(e.ty, e.span, q, k, v, scale)

    # ---- affine layer norm ----------------------------------------------------------------------

    def layer_norm(self, e: N.Expr) -> N.Expr | None:
        if not (isinstance(e, N.BinOp) and e.op == "+" and _trailing(e)):
            return None
        product, bias = e.left, e.right
        if not (isinstance(product, N.BinOp) and product.op == "*" and _trailing(product)):
            return None
        normed, gain = product.left, product.right
        if isinstance(normed, N.OpCall):
            return self.builtin_layer_norm(e, normed, gain, bias)
        if not (isinstance(normed, N.FnCall) and normed.kind == CallKind.EXTERN and normed.name in self.norms
                and len(normed.args) == 2):
            return None
        x, axis = normed.args
        if not isinstance(axis, N.AxisArg) or not (isinstance(x.ty, T.TensorT) and x.ty.rank > 0 and axis.index == x.ty.rank - 1):
            return None
        out = normed.ty  # as declared: fused only where the declaration says what the function does
        if not (isinstance(out, T.TensorT) and out.dtype == x.ty.dtype and out.rank == x.ty.rank
                and all(a.same(b, self.derived) for a, b in zip(out.axes, x.ty.axes))):
            return None
        if not self.affine_params(x.ty, gain, bias):
            return None
        return N.LayerNorm(e.ty, e.span, x, gain, bias)

    def builtin_layer_norm(self, e: N.Expr, normed: N.OpCall, gain: N.Expr, bias: N.Expr) -> N.Expr | None:
        """The built-in `layer_norm(x, over=D)`, without affine params of its own, over x's last
        axis: the same call with `gain` and `bias` as its weight and bias (and its eps, if given)."""
        options = normed.options
        if not (normed.op == BUILTIN_LAYER_NORM and not normed.across and isinstance(options, NormalizeOptions)
                and not options.affine and normed.args and normed.args[0] is not None):
            return None
        x = normed.args[0]
        if not (isinstance(x.ty, T.TensorT) and x.ty.rank > 0 and options.axis == x.ty.rank - 1
                and self.affine_params(x.ty, gain, bias) and isinstance(e.ty, T.TensorT) and e.ty.rank == x.ty.rank):
            return None
        return dataclasses.replace(normed, ty=e.ty, span=e.span, args=(x, gain, bias, *normed.args[1:]),
                                   options=dataclasses.replace(options, affine=("weight", "bias")))

    def affine_params(self, x: T.TensorT, gain: N.Expr, bias: N.Expr) -> bool:
        """A gain and a bias read as they are (a param or a variable), each `[D]` of x's last axis and dtype."""
        last = x.axes[-1]
        return all(isinstance(p, (N.Member, N.Name)) and isinstance(p.ty, T.TensorT) and p.ty.rank == 1
                   and p.ty.axes[0].same(last, self.derived) and p.ty.dtype == x.dtype for p in (gain, bias))


# ---- matching helpers -----------------------------------------------------------------------------

def _trailing(e: N.BinOp) -> bool:
    """Both operands broadcast as torch does by itself (no index places their axes)."""
    return not e.recipe.left and not e.recipe.right


def _is_op(e: N.Expr | None, op: str, last_axis: bool = False) -> bool:
    """A call of `op` that works per example (over its last axis, with `last_axis`)."""
    if not (isinstance(e, N.OpCall) and e.op == op and not e.across):
        return False
    return not last_axis or (isinstance(e.ty, T.TensorT) and isinstance(e.options, AxisOptions)
                             and e.options.axis == e.ty.rank - 1)


def _fill_hides(e: N.Expr | None) -> bool:
    """A fill value low enough that softmax gives exactly 0 where it is."""
    value = _number(e)
    return value is not None and value <= MASKED


def _number(e: N.Expr | None) -> float | None:
    if isinstance(e, N.Const) and isinstance(e.value, (int, float)) and not isinstance(e.value, bool):
        return float(e.value)
    if isinstance(e, N.UnOp) and e.op == "-":
        inner = _number(e.operand)
        return None if inner is None else -inner
    return None


def _scaled(e: N.Expr) -> tuple[N.Expr, N.Expr | None]:
    """Scores times a number (either side), or divided by one: the scores and the scale's expression."""
    if isinstance(e, N.BinOp) and e.op in ("*", "/") and not e.across:
        for scores, number, side in ((e.left, e.right, "right"), (e.right, e.left, "left")):
            if isinstance(number.ty, T.ScalarT) and isinstance(scores.ty, T.TensorT):
                if e.op == "*":
                    return scores, number
                if side == "right":
                    one = N.Const(number.ty, number.span, 1.0)
                    return scores, N.BinOp(number.ty, number.span, "/", one, number)
    return e, N.Const(T.ScalarT("float"), e.span, 1.0)


def _contracts(e: N.OpCall, shape: str) -> bool:
    """Whether einsum `e`'s spec has `shape`: P the same leading letters everywhere, then the named
    letters (all different) as written."""
    if not isinstance(e.options, EinsumOptions):
        return False
    spec = e.options.spec
    lhs, rhs = spec.split("->")
    parts, (want_lhs, want_rhs) = lhs.split(","), shape.split("->")
    wanted = want_lhs.split(",") + [want_rhs]
    got = parts + [rhs]
    if len(got) != len(wanted) or any(len(g) < 3 for g in got):
        return False
    lead = got[0][:-2]
    names: dict[str, str] = {}
    for g, w in zip(got, wanted):
        tail = w.split()[1:]
        if g[:-2] != lead or len(g) != len(lead) + 2:
            return False
        for letter, name in zip(g[-2:], tail):
            if names.setdefault(name, letter) != letter:
                return False
    return len(set(names.values())) == len(names) and not set(names.values()) & set(lead)


def _same_lead(derived: D.Definitions, *types: T.Ty) -> bool:
    """q, k and v: tensors of one float dtype whose leading axes (all but the last two) agree."""
    if not all(isinstance(t, T.TensorT) and t.rank >= 2 for t in types):
        return False
    q, k, v = types
    assert isinstance(q, T.TensorT) and isinstance(k, T.TensorT) and isinstance(v, T.TensorT)
    if not (q.is_float and q.dtype == k.dtype == v.dtype):
        return False
    same = all(a.same(b, derived) and b.same(c, derived) for a, b, c in zip(q.axes[:-2], k.axes[:-2], v.axes[:-2]))
    return same and k.axes[-2].same(v.axes[-2], derived) and q.axes[-1].same(k.axes[-1], derived)


def _map_children(e: N.Expr, f: Callable[[N.Expr], N.Expr]) -> N.Expr:
    """`e` with `f` applied to each expression directly inside it."""
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(e):
        value = getattr(e, field.name)
        if isinstance(value, N.Expr):
            changes[field.name] = f(value)
        elif isinstance(value, tuple) and any(isinstance(v, N.Expr) for v in value):
            changes[field.name] = tuple(f(v) if isinstance(v, N.Expr) else v for v in value)
    return dataclasses.replace(e, **changes) if changes else e
