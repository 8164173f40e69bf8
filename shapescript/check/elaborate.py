"""Elaboration, the checker's last step: the checked program's functions as IR (ir/nodes.py).

This is the one reader of the checker's side tables (each expression's type, each call's
resolution, how broadcast operands are placed); the stages after it (the plans, the IR's passes,
lowering) read only the nodes it builds.
"""

from __future__ import annotations

from ..ir import nodes as N
from ..ir.walk import sizes_read
from ..ops import OPS
from ..ops.args import called_name
from ..shapes import value_types as T
from ..shapes.kinds import CallKind
from ..shapes.options import NO_RECIPE, Recipe
from ..syntax import tree as A
from .program import Checked, FnInfo


def elaborate(checked: Checked) -> N.Module:
    c = checked
    span = c.program.items[0].span if c.program.items else c.program.span
    functions = tuple(_Elaborator(c, fn).function() for fn in c.fns.values())
    return N.Module(c.file, c.source, span, c.device_set, dict(c.dim_values), dict(c.derived), tuple(c.data.values()),
                    tuple(c.models.values()), functions, mixed=c.mixed, tf32=c.tf32)


class _Elaborator:
    def __init__(self, checked: Checked, fn: FnInfo) -> None:
        self.c, self.fn = checked, fn

    def function(self) -> N.Function:
        fn, node = self.fn, self.fn.node
        params = tuple(N.Param(p.name, p.ty, p.mut, p.node.span) for p in fn.params)
        body = tuple(self.stmt(s) for s in node.body) if isinstance(node, A.Fn) else ()
        target = node.target if isinstance(node, A.Extern) else ""
        return N.Function(fn.name, fn.kind, params, fn.ret, body, node.span, fn.span, self.c.reaches_extern(fn.name),
                          sizes_read(body), target, dict(fn.generics), dict(fn.uses), dict(fn.calls),
                          tuple(fn.device_work))

    # ---- statements ---------------------------------------------------------------------------

    def stmt(self, s: A.Stmt) -> N.Stmt:
        if isinstance(s, A.Assign):
            return N.Assign(s.span, tuple(self.target(t) for t in s.targets), self.expr(s.value))
        if isinstance(s, A.Return):
            return N.Return(s.span, None if s.value is None else self.expr(s.value))
        if isinstance(s, A.For):
            iterable = self.expr(s.iter)  # the loop's sizes are read before its body's
            return N.For(s.span, self.target(s.var), iterable, tuple(self.stmt(b) for b in s.body))
        if isinstance(s, A.If):
            return N.If(s.span, self.expr(s.cond), tuple(self.stmt(b) for b in s.then),
                        tuple(self.stmt(b) for b in s.orelse))
        assert isinstance(s, A.ExprStmt), s
        return N.Do(s.span, self.expr(s.expr))

    def target(self, name: A.Name) -> N.Target:
        return N.Target(name.id, self.c.types[name], name.span)

    # ---- expressions --------------------------------------------------------------------------

    def expr(self, node: A.Expr) -> N.Expr:
        ty, span = self.c.types.get(node, T.UNKNOWN), node.span
        recipe = self.c.recipes.get(node, NO_RECIPE)
        if isinstance(node, A.Name):
            if recipe.dim:
                return N.Size(ty, span, recipe.size, node.id)
            return N.Name(ty, span, node.id)
        if isinstance(node, (A.IntLit, A.FloatLit, A.StrLit, A.BoolLit)):
            return N.Const(ty, span, node.value)
        if isinstance(node, A.Attr):
            live = isinstance(self.c.types.get(node.obj), T.ModelT)  # the tensor training updates
            return N.Member(ty, span, self.expr(node.obj), node.name, live)
        if isinstance(node, A.TupleExpr):
            return N.TupleOf(ty, span, tuple(self.expr(i) for i in node.items))
        if isinstance(node, A.Binary):
            return N.BinOp(ty, span, node.op, self.expr(node.left), self.expr(node.right), recipe)
        if isinstance(node, A.Unary):
            return N.UnOp(ty, span, node.op, self.expr(node.operand))
        if isinstance(node, A.Call):
            return self.call(node, ty, recipe)
        raise AssertionError(f"can't elaborate {node!r}")

    def call(self, node: A.Call, ty: T.Ty, recipe: Recipe) -> N.Expr:
        info = self.c.calls[node]
        axis_args = info.axis_args
        span = node.span
        if info.kind in (CallKind.FN, CallKind.PYTHON, CallKind.EXTERN, CallKind.GRAD):
            passed = tuple(self.axis(_value(a), axis_args[k]) if k in axis_args else self.expr(_value(a))
                           for k, a in enumerate(info.args))
            binds = tuple(info.mapping.items())
            if info.kind == CallKind.GRAD:  # value_and_grad, resolved as a call of the function it differentiates
                return N.GradCall(ty, span, info.name, passed, called_name(node), binds)
            return N.FnCall(ty, span, info.kind, info.name, passed, binds=binds)
        assert info.kind == CallKind.BUILTIN and info.name in OPS and not axis_args, info
        args = tuple(self.expr(_value(a)) for a in info.args)
        return N.OpCall(ty, span, info.name, args, info.options, recipe)

    def axis(self, node: A.Expr, index: int) -> N.AxisArg:
        """An `Axis[...]` argument, passed as its axis's index in the call's tensors."""
        return N.AxisArg(self.c.types[node], node.span, index)


def _value(arg: A.Expr | A.Pattern) -> A.Expr:
    """A call's argument as a value: an op's pattern is in its options, never among its arguments."""
    assert not isinstance(arg, A.Pattern), arg
    return arg
