"""Checking function bodies: statements, names, fields, operators and calls of user functions.

Built-in functions have their rules in the op table (shapescript/ops/), which sees this checker as
its `RuleChecker`; both record each expression's type and, where lowering needs one, a recipe (how
to broadcast, which axis) in the `Checked` tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..dtypes import INT_DTYPES
from ..errors import Span
from ..names import similar
from ..ops import RULES
from ..ops.args import broadcast, matmul
from ..ops.checking import Label, Use
from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.kinds import CallKind, FnKind
from ..shapes.options import NO_OPTIONS, CallOptions, Recipe
from ..syntax import tree as A
from . import calls as B
from . import flow, origins
from .calls import misspelled_dim
from .context import Context
from .gradients import gradient_arith, gradient_field
from .hints import a_dtype, cast_help, common_dtype, keeps_values, source_text, tensor_help
from .program import CallInfo, FnInfo, ParamInfo
from .rules import number_arith, number_negation, whole_tensor_power

ARITH = {"+", "-", "*", "/", "%", "**"}  # `%` as Python's and torch's: the remainder takes the divisor's sign
COMPARE = {"==", "!=", "<", "<=", ">", ">="}
@dataclass
class Var:
    ty: T.Ty
    mutable: bool  # a `mut` parameter
    span: Span


def check_bodies(ctx: Context) -> None:
    for fn in ctx.fns.values():
        if isinstance(fn.node, A.Fn):
            BodyChecker(ctx, fn).run()


class BodyChecker:
    def __init__(self, ctx: Context, fn: FnInfo) -> None:
        self.ctx = ctx
        self.fn = fn
        self.tables = ctx.tables
        self.vars: dict[str, Var] = {p.name: Var(p.ty, p.mut, p.node.span) for p in fn.params}
        self.dims: dict[str, D.Dim] = dict(fn.generics)
        self.returned = False
        self.mapping: dict[D.Dim, D.Dim] = {}  # the last call's binding of the callee's generic dims
        self.grown: dict[D.Dim, D.Dim] = {}  # the sizes of values a loop grows, each with where it started
        self.branch_only: dict[str, Span] = {}  # names one branch of an `if` assigns: the `if`'s span

    def error(self, code: str, message: str, span: Span, label: str = "", *help: str,
              secondary: tuple[tuple[Span, str], ...] = ()) -> T.UnknownT:
        return self.ctx.error(code, message, span, label, *help, secondary=secondary)

    def use(self, what: Use, span: Span) -> None:
        self.fn.uses.setdefault(what, span)

    # ---- what the op table's rules see of the checker (ops/checking.py: RuleChecker) -------------

    @property
    def dim_values(self) -> Mapping[str, int | None]:
        return self.ctx.dim_values

    @property
    def precision(self) -> str:
        return self.ctx.precision

    @property
    def params(self) -> Sequence[ParamInfo]:
        return self.fn.params

    def type_of(self, node: A.Node) -> T.Ty | None:
        return self.tables.types.get(node)

    def dim_note(self, t: T.Ty) -> str:
        return self.ctx.dim_note(t)

    def cast_help(self, at: A.Node | Span, dtype: str) -> str:
        """Convert `at` to `dtype`, where that keeps its values; never a lossy conversion."""
        have = self.tables.types.get(at) if isinstance(at, A.Node) else None
        if isinstance(have, T.TensorT) and not keeps_values(have.dtype, dtype):
            return (f"this is {have.dtype}, and converting it to {dtype} would lose values: give {a_dtype(dtype)} "
                    f"value here, or make the other side {have.dtype}")
        return cast_help(self.ctx.program.source, at, dtype)

    def common_help(self, left: A.Node, ld: str, right: A.Node, rd: str) -> str:
        """Both sides of an operator in one dtype: the side that converts without losing values."""
        common = common_dtype(ld, rd)
        side = right if common == ld else left
        return f"convert one side so both have the same dtype, as `to({source_text(self.ctx.program.source, side)}, {common})`"

    def type_label(self, node: A.Node, t: T.Ty) -> Label | None:
        return origins.type_label(self, node, t)

    def axis_label(self, node: A.Node, t: T.TensorT, k: int, which: str) -> Label | None:
        return origins.axis_label(self, node, t, k, which)

    def set_recipe(self, node: A.Node, recipe: Recipe) -> None:
        self.tables.recipes[node] = recipe

    def came_from(self, fresh: D.Dim, origin: D.Dim) -> None:
        self.grown[fresh] = origin

    def device_work(self, what: str, span: Span) -> None:
        self.fn.device_work.append((what, span))

    def function_named(self, node: A.Name, call: A.Call) -> FnInfo | None:
        fn = self.ctx.fns.get(node.id)
        if fn is not None:
            self.tables.types[node] = T.FnRefT(fn.name)
            self.fn.calls.setdefault(fn.name, call.span)
        return fn

    def call_as_grad(self, node: A.Call, fn: str) -> T.Ty:
        named = node.args[0].value
        assert isinstance(named, A.Name)  # value_and_grad's rule found the function by it
        inner = A.Call(node.span, named, node.args[1:])
        result = self.call_fn(inner, self.ctx.fns[fn])
        resolved = self.tables.calls.pop(inner, None)  # its arguments had errors: none
        self.tables.calls[node] = (dataclasses.replace(resolved, kind=CallKind.GRAD) if resolved
                                   else CallInfo(CallKind.GRAD, fn, []))
        return result

    # ---- statements ---------------------------------------------------------------------------

    def run(self) -> None:
        for p in self.fn.params:
            if self.is_device_value(p.ty):
                self.use(Use.TENSORS, p.node.span)
            if isinstance(p.ty, T.DatasetT):
                self.use(Use.DATASET, p.node.span)
            if p.ty == T.SINK:
                self.use(Use.SINK, p.node.span)
        node = self.fn.node
        assert isinstance(node, A.Fn)  # check_bodies checks the bodies of `fn`s only
        self.stmts(node.body)
        if self.fn.ret != T.NONE and not self.returned and self.fn.ret is not T.UNKNOWN:
            self.error("E0305", f"`{self.fn.name}` must return {self.fn.ret.show()}, but has no `return`",
                       node.name_span, "never returns", "end the body with `return ...`")

    @staticmethod
    def is_device_value(t: T.Ty) -> bool:
        return isinstance(t, (T.TensorT, T.BatchT, T.ModelT, T.OptT, T.GradT))

    def stmts(self, body: list[A.Stmt]) -> None:
        for s in body:
            self.stmt(s)

    def stmt(self, s: A.Stmt) -> None:
        if isinstance(s, A.Assign):
            t = self.expr(s.value)
            if len(s.targets) == 1:
                self.bind(s.targets[0], t)
            elif isinstance(t, T.TupleT) and len(t.items) == len(s.targets):
                for target, item in zip(s.targets, t.items):
                    self.bind(target, item)
            elif t is T.UNKNOWN:
                for target in s.targets:
                    self.bind(target, T.UNKNOWN)
            else:
                n = len(t.items) if isinstance(t, T.TupleT) else 1
                self.error("E0401", f"{len(s.targets)} names, but the value has {n} part{'s' * (n != 1)}",
                           s.value.span, f"this is {t.show()}", "give one name per part")
                for target in s.targets:
                    self.bind(target, T.UNKNOWN)
        elif isinstance(s, A.Return):
            self.ret(s)
        elif isinstance(s, A.For):
            flow.loop(self, s)
        elif isinstance(s, A.If):
            flow.branch(self, s)
        else:
            self.expr(s.expr)

    def bind(self, target: A.Name, t: T.Ty) -> None:
        old = self.vars.get(target.id)
        self.vars[target.id] = Var(t, old.mutable if old else False, target.span)
        self.tables.types[target] = t

    def ret(self, s: A.Return) -> None:
        self.returned = True
        expected = self.fn.ret
        if s.value is None:
            if expected != T.NONE:
                self.error("E0305", f"`{self.fn.name}` must return {expected.show()}", s.span, "returns nothing")
            return
        t = self.expr(s.value)
        if t is T.UNKNOWN:
            return  # its error is reported
        if expected == T.NONE:
            self.error("E0305", f"`{self.fn.name}` declares no result, but returns {t.show()}", s.value.span,
                       "a value", f"declare it: `fn {self.fn.name}(...) -> {t.show()}`")
            return
        problem = self.conforms(expected, t)
        if problem:
            declared = self.fn.node.ret
            self.error("E0305", f"`{self.fn.name}` must return {expected.show()}{self.ctx.dim_note(expected)}, "
                       f"but this is {t.show()}", s.value.span, problem,
                       misspelled_dim(expected, t)
                       or f"declare the result as `-> {t.show()}`, or return a {expected.show()} value",
                       secondary=((declared.span, f"the result is declared {expected.show()} here"),)
                       if declared is not None else ())
        elif isinstance(expected, T.TensorT) and isinstance(t, T.TensorT):  # an `Index[C]` result needs its bound
            B._check_element(self, f"`{self.fn.name}`'s result", expected, t, s.value.span)

    def conforms(self, expected: T.Ty, actual: T.Ty) -> str:
        """'' when `actual` is a value of `expected` (no dims bound), else a short reason."""
        if T.UNKNOWN in (expected, actual):
            return ""
        if isinstance(expected, T.TensorT) and isinstance(actual, T.TensorT):
            if expected.rank != actual.rank:
                return f"{actual.rank} axes, not {expected.rank}"
            for k, (e, a) in enumerate(zip(expected.axes, actual.axes)):
                if not e.same(a):
                    return f"dim {k} is {a.show()}, not {e.show()}"
            if expected.dtype != actual.dtype:
                return f"dtype {actual.dtype}, not {expected.dtype}"
            return ""
        if isinstance(expected, T.TensorT) and isinstance(actual, T.ScalarT) and not expected.axes:
            return "" if actual.kind in ("int", "float") and expected.is_float else f"a {actual.kind}"
        if expected != actual:
            return f"this is {actual.show()}"
        return ""

    # ---- expressions --------------------------------------------------------------------------

    def expr(self, node: A.Expr) -> T.Ty:
        t = self._expr(node)
        self.tables.types[node] = t
        return t

    def _expr(self, node: A.Expr) -> T.Ty:
        if isinstance(node, A.Name):
            return self.name(node)
        if isinstance(node, A.IntLit):
            return T.INT
        if isinstance(node, A.FloatLit):
            return T.FLOAT
        if isinstance(node, A.StrLit):
            return T.STR
        if isinstance(node, A.BoolLit):
            return T.BOOL
        if isinstance(node, A.Attr):
            return self.attr(node)
        if isinstance(node, A.Binary):
            return self.binary(node)
        if isinstance(node, A.Unary):
            return self.unary(node)
        if isinstance(node, A.TupleExpr):
            return T.TupleT(tuple(self.expr(i) for i in node.items))
        if isinstance(node, A.Call):
            return self.call(node)
        if isinstance(node, A.Subscript):
            self.expr(node.obj)
            return self.error("E0404", "indexing a tensor with `[...]` isn't part of the language",
                              node.span, "indexing", "use take or window along a dim, gather, or a pattern such as rearrange")
        raise AssertionError(f"unknown expression {node!r}")

    def name(self, node: A.Name) -> T.Ty:
        var = self.vars.get(node.id)
        if var is not None:
            return var.ty
        if node.id in self.ctx.fns:
            return T.FnRefT(node.id)
        if node.id in self.dims or node.id in self.ctx.dim_values:
            return self.dim_value(node)
        candidates = list(self.vars) + list(self.ctx.fns)
        branch = self.branch_only.get(node.id)
        if branch is not None:
            return self.error("E0201", f"`{node.id}` is assigned in one branch of the `if` on line {branch.line} "
                              "only", node.span, "not assigned on every path",
                              f"assign `{node.id}` in both branches, or before the `if`")
        return self.error("E0201", f"unknown name `{node.id}`", node.span, "not defined",
                          similar(node.id, candidates)
                          or f"assign it before this line (`{node.id} = ...`) or take it as a parameter of "
                          f"`{self.fn.name}`")

    def dim_value(self, node: A.Name) -> T.Ty:
        """A dim used as a number, as `1.0 / Dh ** 0.5`: its size, known or read off a parameter."""
        from ..ops.sizes import dim_source
        found = dim_source(self, node)
        if found is None:
            return T.UNKNOWN
        self.tables.recipes[node] = Recipe(dim=True, size=found[1])
        return T.INT

    def attr(self, node: A.Attr) -> T.Ty:
        t = self.expr(node.obj)
        if isinstance(t, T.BatchT):
            if node.name in t.data.fields:
                return t.field(node.name)
            return self.error("E0203", f"`{t.data.name}` has no field `{node.name}`", node.name_span,
                              "unknown field", similar(node.name, list(t.data.fields))
                              or f"its fields: {', '.join(t.data.fields)}")
        if isinstance(t, T.GradT):
            return gradient_field(self, node, t)
        if isinstance(t, T.ModelT):
            member = t.members.get(node.name)
            if member is None:
                return self.error("E0203", f"model `{t.name}` has no member `{node.name}`", node.name_span,
                                  "unknown member", similar(node.name, list(t.members))
                                  or f"its members: {', '.join(t.members)}")
            if member.model is not None:  # a sub-model, or a stack of them
                return T.StackT(member.count, member.model) if member.count is not None else member.model
            assert member.tensor is not None  # a param or a buffer
            return member.tensor
        if t is T.UNKNOWN:
            return t
        return self.error("E0203", f"{t.show()} has no fields", node.name_span, "no field here")

    # ---- operators ----------------------------------------------------------------------------

    def operand(self, node: A.Expr, t: T.Ty | None = None) -> T.Ty:
        """A tensor or a plain number, for an operator (its type `t` where already known); anything
        else is an error."""
        t = self.expr(node) if t is None else t
        if isinstance(t, T.TensorT) or t is T.UNKNOWN:
            if isinstance(t, T.TensorT):
                self.use(Use.TENSORS, node.span)
            return t
        if isinstance(t, T.ScalarT) and t.kind in ("int", "float", "bool"):
            return t
        return self.error("E0401", f"expected a tensor or a number, found {t.show()}", node.span,
                          f"this is {t.show()}", tensor_help(t, source_text(self.ctx.program.source, node)))

    def binary(self, node: A.Binary) -> T.Ty:
        if node.op in ("and", "or"):
            return self.logical(node)
        left, right = self.expr(node.left), self.expr(node.right)
        if isinstance(left, T.GradT) or isinstance(right, T.GradT):
            return T.UNKNOWN if T.UNKNOWN in (left, right) else gradient_arith(self, node, left, right)
        left = self.operand(node.left, left)
        right = self.operand(node.right, right)
        if T.UNKNOWN in (left, right):
            return T.UNKNOWN
        if node.op == "@":
            return matmul(self, node, left, right, node.left, node.right)
        if isinstance(left, T.ScalarT) and isinstance(right, T.ScalarT):
            if node.op in COMPARE:
                return T.BOOL
            return number_arith(self, node, left, right)
        return self.elementwise(node, left, right)

    def elementwise(self, node: A.Binary, left: T.Ty, right: T.Ty) -> T.Ty:
        dtype = self.result_dtype(node, left, right)
        if dtype is None:
            return T.UNKNOWN
        if isinstance(left, T.ScalarT) or isinstance(right, T.ScalarT):
            tensor = left if isinstance(left, T.TensorT) else right
            assert isinstance(tensor, T.TensorT)
            return T.TensorT(tensor.axes, "bool" if node.op in COMPARE else dtype)
        assert isinstance(left, T.TensorT) and isinstance(right, T.TensorT)
        axes = broadcast(self, node, left, right)
        if axes is None:
            return T.UNKNOWN
        return T.TensorT(axes, "bool" if node.op in COMPARE else dtype)

    def result_dtype(self, node: A.Binary, left: T.Ty, right: T.Ty) -> str | None:
        def dtype(t: T.Ty) -> str | None:
            return t.dtype if isinstance(t, T.TensorT) else None

        ld, rd = dtype(left), dtype(right)
        if ld and rd:
            if ld != rd:
                self.error("E0308", f"`{node.op}` of {ld} and {rd}", node.span, f"{ld} and {rd}",
                           self.common_help(node.left, ld, node.right, rd))
                return None
            if node.op in ARITH and ld == "bool":
                self.error("E0308", f"`{node.op}` of bool tensors", node.span, "bool", "use `and`, `or`, `not`")
                return None
            return "f32" if node.op == "/" and ld in INT_DTYPES else ld  # true division, as torch's
        known = ld or rd
        scalar = right if ld else left
        assert isinstance(scalar, T.ScalarT) and known is not None
        if node.op not in ARITH:
            return known
        if "bool" in (known, scalar.kind) and (node.op == "-" or known == scalar.kind):
            # torch refuses `-` with any bool, and a bool tensor with a bool is logic
            self.error("E0308", f"`{node.op}` of {known} and a {scalar.kind}", node.span, "bool arithmetic",
                       "use `and`, `or`, `not`, or convert first, as `to(x, f32)`")
            return None
        if scalar is right and not whole_tensor_power(self, node, known, scalar):
            return None
        return T.promoted(known, scalar.kind, node.op)

    def logical(self, node: A.Binary) -> T.Ty:
        left, right = self.expr(node.left), self.expr(node.right)
        for side, t in ((node.left, left), (node.right, right)):
            if t is T.UNKNOWN:
                return t
            if not (t == T.BOOL or isinstance(t, T.TensorT) and t.dtype == "bool"):
                return self.error("E0308", f"`{node.op}` takes bools, not {t.show()}", side.span,
                                  f"this is {t.show()}", "compare it first, as `x > 0`")
        if isinstance(left, T.TensorT) and isinstance(right, T.TensorT):
            axes = broadcast(self, node, left, right)
            return T.TensorT(axes, "bool") if axes is not None else T.UNKNOWN
        tensor = left if isinstance(left, T.TensorT) else right
        return tensor

    def unary(self, node: A.Unary) -> T.Ty:
        t = self.operand(node.operand)
        if t is T.UNKNOWN:
            return t
        if node.op == "not":
            if t == T.BOOL or isinstance(t, T.TensorT) and t.dtype == "bool":
                return t
            return self.error("E0308", f"`not` takes bools, not {t.show()}", node.operand.span,
                              f"this is {t.show()}", "compare it first, as `x > 0`")
        if isinstance(t, T.TensorT) and t.dtype == "bool":
            return self.error("E0308", "negation of a bool tensor", node.span, "bool", "use `not`")
        if isinstance(t, T.TensorT) and t.index is not None:
            return T.TensorT(t.axes, t.dtype)
        return number_negation(t)

    # ---- calls --------------------------------------------------------------------------------

    def call(self, node: A.Call) -> T.Ty:
        func = node.func
        if isinstance(func, A.Name):
            if func.id in self.vars:
                return self.error("E0205", f"`{func.id}` is a value, not a function", func.span, "not callable")
            fn = self.ctx.fns.get(func.id)
            if fn is not None:
                self.fn.calls.setdefault(fn.name, node.span)
                return self.call_fn(node, fn)
            rule = RULES.get(func.id)
            if rule is not None:
                return rule(self, node)
            return self.error("E0201", f"unknown function `{func.id}`", func.span, "not defined",
                              similar(func.id, list(self.ctx.fns) + list(RULES)))
        return self.error("E0205", "only functions can be called", func.span, "not a function name",
                          "call a function by its name, as `forward(m, x)`")

    def arrange(self, node: A.Call, names: list[str], what: str, required: int | None = None,
                ) -> list[A.Arg | None] | None:
        """The call's arguments in parameter order (keywords placed), or None after an error."""
        out: list[A.Arg | None] = [None] * len(names)
        ok = True
        for k, arg in enumerate(node.args):
            if isinstance(arg.value, A.Pattern):
                self.error("E0206", f"{what} takes no pattern", arg.span, "unexpected pattern")
                ok = False
                continue
            if arg.keyword is None:
                if any(a.keyword for a in node.args[:k]):
                    self.error("E0206", "a positional argument after a keyword one", arg.span, "",
                               "put positional arguments first")
                    ok = False
                elif k >= len(names):
                    self.error("E0206", f"{what} takes {len(names)} argument{'s' * (len(names) != 1)}, "
                               f"given {len(node.args)}", arg.span, "one too many",
                               f"remove the extra argument; {what} takes ({', '.join(names)})")
                    ok = False
                else:
                    out[k] = arg
            elif arg.keyword not in names:
                self.error("E0206", f"{what} has no parameter `{arg.keyword}`", arg.span, "unknown keyword",
                           similar(arg.keyword, names) or f"its parameters: {', '.join(names)}")
                ok = False
            elif out[names.index(arg.keyword)] is not None:
                self.error("E0206", f"`{arg.keyword}` is given twice", arg.span, "given again")
                ok = False
            else:
                out[names.index(arg.keyword)] = arg
        required = len(names) if required is None else required
        missing = [n for n, a in zip(names[:required], out[:required]) if a is None]
        if ok and missing:
            self.error("E0206", f"{what} is missing {', '.join('`' + m + '`' for m in missing)}", node.span,
                       "missing argument" + "s" * (len(missing) > 1))
            ok = False
        return out if ok else None

    def arrange_all(self, node: A.Call, names: list[str], what: str) -> list[A.Arg] | None:
        """`arrange` where every parameter is required: each place holds its argument."""
        args = self.arrange(node, names, what)
        if args is None:
            return None
        given = [a for a in args if a is not None]
        assert len(given) == len(args)  # a missing argument is an error of `arrange`
        return given

    def check_mut(self, arg: A.Arg, param_mut: bool, param: str, what: str, callee: FnInfo | None = None) -> None:
        if arg.mut and not param_mut and callee is not None and callee.passes_mut(param):
            return  # the callee changes it without declaring it `mut`: its own E0501 says to add `mut`
        if param_mut and not arg.mut:
            self.error("E0502", f"{what} changes `{param}`, so the call must say `mut`", arg.span,
                       "changed by the call", f"write `mut {source_text(self.ctx.program.source, arg.value)}`")
        elif arg.mut and not param_mut:
            self.error("E0503", f"`mut` given, but {what} doesn't change `{param}`", arg.span,
                       "not changed", "remove `mut`")
        elif param_mut:
            target = arg.value
            var = self.vars.get(target.id) if isinstance(target, A.Name) else None
            if var is None or not isinstance(target, A.Name):
                self.error("E0501", "only a `mut` parameter can be changed; this is an expression",
                           arg.span, "not a mut parameter", "pass a parameter declared with `mut`")
            elif not var.mutable:
                self.error("E0501", f"`{target.id}` is changed here, but `{self.fn.name}` doesn't take it as `mut`",
                           arg.span, "changed", f"declare it `mut {target.id}` in `{self.fn.name}`'s parameters")

    def call_fn(self, node: A.Call, fn: FnInfo) -> T.Ty:
        what = f"`{fn.name}`"
        args = self.arrange_all(node, [p.name for p in fn.params], what)
        if args is None:
            for a in node.args:
                if not isinstance(a.value, A.Pattern):
                    self.expr(a.value)
            return T.UNKNOWN
        arg_types = [self.axis_arg(a) if isinstance(p.ty, T.AxisArgT) else self.expr(a.expr)
                     for a, p in zip(args, fn.params)]
        for a, p in zip(args, fn.params):
            self.check_mut(a, p.mut, p.name, what, fn)
        self.record_call(node, CallKind(fn.kind), fn.name, [a.value for a in args])
        if fn.kind == FnKind.PYTHON:
            self.use(Use.PYTHON, node.span)
        result = self.instantiate(fn, fn.params, args, arg_types, fn.ret)
        self.tables.calls[node] = dataclasses.replace(self.tables.calls[node], mapping=self.mapping)
        if any(isinstance(p.ty, T.AxisArgT) for p in fn.params) and result is not T.UNKNOWN:
            self.axis_indices(node, fn, arg_types)
        return result

    def axis_arg(self, arg: A.Arg) -> T.Ty:
        """`over=D` given to an `Axis[...]` parameter: a dim, not a value."""
        node = arg.value
        dim = self.dims.get(node.id) if isinstance(node, A.Name) else None
        if isinstance(node, A.Name) and dim is None and node.id in self.ctx.dim_values:
            dim = D.declared(node.id)
        if dim is None:
            return self.error("E0303", "an `Axis[...]` argument names a dim, as `over=D`", arg.span, "not a dim")
        t = T.AxisArgT(dim)
        self.tables.types[node] = t
        return t

    def axis_indices(self, node: A.Call, fn: FnInfo, arg_types: list[T.Ty]) -> None:
        """Each Axis argument's index in the first tensor argument that has that dim."""
        tensors = [t for t in arg_types if isinstance(t, T.TensorT)]
        found: dict[int, int] = {}
        for k, (p, t) in enumerate(zip(fn.params, arg_types)):
            if not isinstance(t, T.AxisArgT):
                continue
            index = next((i for x in tensors for i, a in enumerate(x.axes) if D.equal(a.size, t.dim)), None)
            if index is None:
                self.error("E0303", f"no tensor given to `{fn.name}` has an axis {D.show(t.dim)}", node.span,
                           f"`{p.name}` names {D.show(t.dim)}")
                return
            found[k] = index
        self.tables.calls[node] = dataclasses.replace(self.tables.calls[node], axis_args=found)

    def record_call(self, node: A.Call, kind: CallKind, name: str, args: list[A.Expr | A.Pattern],
                    options: CallOptions = NO_OPTIONS) -> None:
        self.tables.calls[node] = CallInfo(kind, name, args, options)

    def instantiate(self, fn: FnInfo, params: list[ParamInfo], args: list[A.Arg], arg_types: list[T.Ty],
                    ret: T.Ty) -> T.Ty:
        """Bind the callee's generic dims from the arguments, check each, return the result's type."""
        mapping: dict[D.Dim, D.Dim] = {}
        bound_by: dict[D.Dim, str] = {}  # each generic dim bound: the parameter that bound it
        self.mapping = mapping
        for p, _, t in zip(params, args, arg_types):
            B.bind_generics(p.ty, t, mapping, bound_by, p.name)
        ok = True
        arg_spans = {p.name: a.value.span for p, a in zip(params, args)}
        for p, a, t in zip(params, args, arg_types):
            if not B.check_argument(self, fn, p, a, t, mapping, bound_by, arg_spans):
                ok = False
        if not ok:
            return T.UNKNOWN
        return B.substitute(ret, mapping)
