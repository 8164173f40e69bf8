"""Elaboration: the checked program's functions as IR (ir/nodes.py).

This is the one reader of the checker's side tables (each expression's type, each call's
resolution, how broadcast operands are placed, the batch split's marks); the stages after it read
only the nodes it builds.
"""

from __future__ import annotations

from ..check.program import Checked, FnInfo
from ..ops import OPS
from ..ops.args import called_name
from ..shapes import value_types as T
from ..shapes.kinds import CallKind
from ..shapes.options import NO_RECIPE, Recipe
from ..syntax import tree as A
from . import nodes as N
from .walk import sizes_read


def elaborate(checked: Checked) -> N.Module:
    c = checked
    span = c.program.items[0].span if c.program.items else c.program.span
    functions = tuple(_Elaborator(c, fn).function() for fn in c.fns.values())
    return N.Module(c.file, c.source, span, c.device_set, dict(c.dim_values), dict(c.derived), tuple(c.data.values()),
                    tuple(c.models.values()), functions, c.layout.heads, dict(c.layout.head_params))


class _Elaborator:
    def __init__(self, checked: Checked, fn: FnInfo) -> None:
        self.c, self.fn = checked, fn

    def function(self) -> N.Function:
        fn, node = self.fn, self.fn.node
        params = tuple(N.Param(p.name, p.ty, p.mut, p.node.span) for p in fn.params)
        body = tuple(self.stmt(s) for s in node.body) if isinstance(node, A.Fn) else ()
        target = node.target if isinstance(node, A.Extern) else ""
        return N.Function(fn.name, fn.kind, params, fn.ret, body, node.span, fn.span, self.c.placement(fn.name).where,
                          self.c.split_of(fn.name), self.c.reaches_extern(fn.name), sizes_read(body), target)

    # ---- statements ---------------------------------------------------------------------------

    def stmt(self, s: A.Stmt) -> N.Stmt:
        if isinstance(s, A.Assign):
            return N.Assign(s.span, tuple(t.id for t in s.targets), self.expr(s.value))
        if isinstance(s, A.Return):
            return N.Return(s.span, None if s.value is None else self.expr(s.value))
        if isinstance(s, A.For):
            iterable = self.expr(s.iter)  # the loop's sizes are read before its body's
            return N.For(s.span, s.var.id, self.c.types[id(s.var)], iterable, tuple(self.stmt(b) for b in s.body))
        assert isinstance(s, A.ExprStmt), s
        return N.Do(s.span, self.expr(s.expr))

    # ---- expressions --------------------------------------------------------------------------

    def expr(self, node: A.Expr) -> N.Expr:
        out = self._expr(node)
        for mark in self.c.layout.marks.get(id(node), ()):  # `split H`'s gathers, cuts and sums, in order
            out = N.Heads(out.ty, out.span, mark.kind, mark.axes, out)
        return out

    def _expr(self, node: A.Expr) -> N.Expr:
        ty, span = self.c.types.get(id(node), T.UNKNOWN), node.span
        recipe = self.c.recipes.get(id(node), NO_RECIPE)
        if isinstance(node, A.Name):
            if recipe.dim:
                return N.Size(ty, span, recipe.size)
            return N.Name(ty, span, node.id)
        if isinstance(node, (A.IntLit, A.FloatLit, A.StrLit, A.BoolLit)):
            return N.Const(ty, span, node.value)
        if isinstance(node, A.Attr):
            live = isinstance(self.c.types.get(id(node.obj)), T.ModelT)  # the tensor training updates
            return N.Member(ty, span, self.expr(node.obj), node.name, live, id(node) in self.c.layout.reads)
        if isinstance(node, A.TupleExpr):
            return N.TupleOf(ty, span, tuple(self.expr(i) for i in node.items))
        if isinstance(node, A.Binary):
            return N.BinOp(ty, span, node.op, self.expr(node.left), self.expr(node.right), recipe,
                           self.c.split.across.get(id(node)))
        if isinstance(node, A.Unary):
            return N.UnOp(ty, span, node.op, self.expr(node.operand))
        if isinstance(node, A.Call):
            return self.call(node, ty, recipe)
        raise AssertionError(f"can't elaborate {node!r}")

    def call(self, node: A.Call, ty: T.Ty, recipe: Recipe) -> N.Expr:
        info = self.c.calls[id(node)]
        axis_args = info.axis_args
        args = [None if k in axis_args else self.expr(_value(a)) for k, a in enumerate(info.args)]
        span = node.span
        passed = tuple(axis_args[k] if a is None else a for k, a in enumerate(args))  # an axis as its index
        if info.kind in (CallKind.FN, CallKind.PYTHON, CallKind.EXTERN):
            return N.FnCall(ty, span, info.kind, info.name, passed)
        if info.kind == CallKind.GRAD:  # value_and_grad, resolved as a call of the function it differentiates
            return N.GradCall(ty, span, info.name, passed, called_name(node))
        assert info.kind == CallKind.BUILTIN and info.name in OPS, info
        options = self.c.split.options.get(id(node), info.options)  # the batch split's, on a split operand
        return N.OpCall(ty, span, info.name, tuple(args), options, recipe, self.c.split.across.get(id(node)))


def _value(arg: A.Expr | A.Pattern) -> A.Expr:
    """A call's argument as a value: an op's pattern is in its options, never among its arguments."""
    assert not isinstance(arg, A.Pattern), arg
    return arg
