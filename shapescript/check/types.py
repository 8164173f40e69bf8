"""The types a program writes (`[b D] f16`, `[] Index[C]`, `[b] Digit`, `AdamW[Mlp]`) as the
checker's types, and models' members: each declared model's params, buffers and sub-models, and each
use of a generic model (`Linear[D C]`) made into a model type of its own, its dims put in.

A generic model's declaration is checked once with its dims generic, where its mistakes are
reported; each use of it is then resolved again with the dims it is given, and what only those
sizes get wrong (a size that isn't positive) is reported at the use.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping

import sympy

from ..dtypes import DTYPES
from ..errors import Span
from ..inits import INITS
from ..names import MODEL_RESERVED, is_reserved, reserved_text, similar
from ..optimizers import OptimizerKind
from ..shapes import dims as D
from ..shapes import value_types as T
from ..syntax import tree as A
from .constants import NotConstant, constant
from .context import Context

SCALAR_TYPES = {"int": T.INT, "float": T.FLOAT, "bool": T.BOOL, "str": T.STR}


def refuse_reserved(ctx: Context, node: A.Field | A.Member, owner: str, reserved: frozenset[str]) -> None:
    """E0207 at the name of a field or member that would meet an attribute its handle has itself."""
    line = ctx.program.source.splitlines()[node.span.line - 1]
    after_kind = node.span.col - 1 + (len(node.kind) if isinstance(node, A.Member) and node.kind != A.MemberKind.SUB else 0)
    col = line.find(node.name, after_kind) + 1  # the name is the next word
    span = Span(node.span.file, node.span.line, col, node.span.line, col + len(node.name)) if col else node.span
    what = "member" if isinstance(node, A.Member) else "field"
    ctx.error("E0207", f"`{node.name}` is reserved: {owner} has it already", span, "a reserved name",
              f"rename the {what}; reserved for a {what}: {reserved_text(reserved)}")


def declare_members(ctx: Context, model: T.ModelT) -> None:
    """A declared model's members; a generic one's with its dims generic, its mistakes reported here."""
    if model.name in ctx.models_done:
        return
    ctx.models_done.add(model.name)
    if not model.params:
        members(ctx, model, {})
        return
    before = len(ctx.diagnostics)
    dims = {p: D.generic(p) for p in model.params if p not in model.dtype_params}
    with ctx.within_model(model.name):
        members(ctx, model, dims, {p: ctx.precision for p in model.dtype_params})
    if len(ctx.diagnostics) > before:
        ctx.broken_models.add(model.name)


def members(ctx: Context, model: T.ModelT, dims: Mapping[str, D.Dim], dtypes: Mapping[str, str] | None = None) -> None:
    """Resolve a model's members, `dims` and `dtypes` giving its own dims and dtypes (a generic
    model's) by name."""
    outer, ctx.model_dtypes = ctx.model_dtypes, dict(dtypes or {})
    try:
        _members(ctx, model, dims)
    finally:
        ctx.model_dtypes = outer


def _members(ctx: Context, model: T.ModelT, dims: Mapping[str, D.Dim]) -> None:
    values = {**ctx.dim_values, **{name: D.value(d, ctx.dim_values) for name, d in dims.items()}}
    for m in model.node.members:
        if m.name in model.members:
            ctx.error("E0202", f"member `{m.name}` is defined twice in `{model.name}`", m.span)
            continue
        if is_reserved(m.name, MODEL_RESERVED):
            refuse_reserved(ctx, m, "a model", MODEL_RESERVED)
            continue
        if m.kind == A.MemberKind.SUB:
            t = resolve_type(ctx, m.type, dict(dims), allow_generic=False, what=f"stack `{m.name}`")
            if isinstance(t, T.ModelT):
                model.members[m.name] = T.MemberT(A.MemberKind.SUB, m.name, m, model=t)
            elif isinstance(t, T.StackT):
                model.members[m.name] = T.MemberT(A.MemberKind.SUB, m.name, m, model=t.model, count=t.count)
            elif t is not T.UNKNOWN:
                ctx.error("E0401", f"`{m.name}` is a {t.show()}, but a model's fields are params, buffers "
                          "and sub-models", m.type.span, "not a model",
                          f"declare a tensor with `param {m.name}: ...` or `buffer {m.name}: ...`")
            continue
        t = resolve_type(ctx, m.type, dict(dims), allow_generic=False, what=f"{m.kind} `{m.name}`")
        if t is T.UNKNOWN:
            continue
        if not isinstance(t, T.TensorT):
            ctx.error("E0401", f"{m.kind} `{m.name}` must be a tensor, not {t.show()}", m.type.span)
            continue
        if m.kind == A.MemberKind.PARAM and not t.is_float:
            ctx.error("E0308", f"param `{m.name}` has dtype {t.dtype}, but trained params are floats",
                      m.type.span, "not a float type", "make it a `buffer`, or give it a float dtype")
            continue
        init, args = init_of(ctx, m, {x.name: "sub-model" if x.kind == A.MemberKind.SUB else str(x.kind)
                                      for x in model.node.members}, values)
        model.members[m.name] = T.MemberT(m.kind, m.name, m, tensor=t, init=init, init_args=args)


def init_of(ctx: Context, m: A.Member, members: dict[str, str],
            values: dict[str, int | None]) -> tuple[str, dict[str, float]]:
    call = m.init
    assert call is not None
    name = call.func.id if isinstance(call.func, A.Name) else ""
    if name not in INITS:
        ctx.error("E0205", f"unknown initializer `{name or '?'}`", call.func.span, "not an initializer",
                  "use normal(mean=, std=), uniform(low=, high=), zeros() or ones()")
        return "zeros", {}
    given = dict(INITS[name])
    allowed = tuple(given)
    for k, arg in enumerate(call.args):
        key = arg.keyword or (allowed[k] if k < len(allowed) else None)
        if key not in allowed:
            ctx.error("E0206", f"`{name}` takes no argument {('`' + key + '`') if key else 'here'}",
                      arg.span, "unexpected argument",
                      f"`{name}` takes {', '.join(allowed) or 'no arguments'}")
            continue
        if isinstance(arg.value, A.Pattern):
            ctx.error("E0407", f"`{key}` must be a number", arg.span, "not a number", f"write `{key}=0.02`")
            continue
        try:
            value = constant(arg.value, values, members)
        except NotConstant as e:
            ctx.error("E0407", f"`{key}` of `{name}` must be a constant number: {e.message}", e.node.span,
                      e.label, e.help)
            continue
        if value is not None:  # None: a dim in it gets its size when loading, and the build waits for it
            given[key] = value
    if name == "normal" and given["std"] < 0:
        ctx.error("E0310", "a normal's std can't be negative", call.span, "negative std")
    return name, given


def model_cycles(ctx: Context) -> None:
    def visit(m: T.ModelT, path: list[str]) -> None:
        if m.family in path:
            ctx.error("E0402", f"model `{m.family}` contains itself", m.node.name_span, "",
                      "through " + " -> ".join(path + [m.family]))
            raise _Cycle
        for mem in m.members.values():
            if mem.model is not None:
                visit(mem.model, path + [m.family])

    for model in ctx.models.values():
        try:
            visit(model, [])
        except _Cycle:
            return


class _Cycle(Exception):
    pass


def resolve_type(ctx: Context, node: A.TypeExpr, generics: dict[str, D.Dim], allow_generic: bool,
                 what: str = "") -> T.Ty:
    if isinstance(node, A.ShapeType):
        axes = []
        for a in node.axes:
            ax = resolve_axis(ctx, a, generics, allow_generic, what)
            if ax is None:
                return T.UNKNOWN
            axes.append(ax)
        el = node.element
        if el is None:
            return T.TensorT(tuple(axes), ctx.precision)
        if el.name in ctx.model_dtypes and not el.args:  # a generic model's dtype param (`[I O] T`)
            return T.TensorT(tuple(axes), ctx.model_dtypes[el.name])
        if el.name in DTYPES and not el.args:
            return T.TensorT(tuple(axes), el.name)
        if el.name == "Index":
            bound = index_bound(ctx, el, generics, allow_generic, what)
            return T.TensorT(tuple(axes), "i64", bound) if bound is not None else T.UNKNOWN
        inner = resolve_type(ctx, el, generics, allow_generic, what)
        if isinstance(inner, T.BatchT) and not inner.axes:
            return T.BatchT(tuple(axes), inner.data, padded_dims(inner.data, generics))
        if isinstance(inner, T.ModelT) and len(axes) == 1:
            if D.value(axes[0].size, ctx.dim_values) is None and not ctx.generic_count(axes[0].size):
                return ctx.error("E0312", f"a stack of models needs a declared size, not {axes[0].show()}",
                                 node.span, "not a declared dim", "declare it: `dim L = 4`")
            return T.StackT(axes[0].size, inner)
        if inner is T.UNKNOWN:
            return inner
        return ctx.error("E0401", f"`{show_type_expr(node)}` isn't a type: a shape can hold a dtype, "
                         "`Index[...]` or a data type", el.span, "unexpected here",
                         "write `[b D]`, `[b D] f16`, `[] Index[C]` or `[b] Digit`")
    name = node.name
    if name in DTYPES and not node.args:
        return T.TensorT((), name)
    if name in SCALAR_TYPES and not node.args:
        return SCALAR_TYPES[name]
    if name in ("Index", "Axis"):
        bound = index_bound(ctx, node, generics, allow_generic, what)
        if bound is None:
            return T.UNKNOWN
        return T.TensorT((), "i64", bound) if name == "Index" else T.AxisArgT(bound)
    if name in ("Sink", "Logs", "Mode") and not node.args:
        return T.NamedT(name)
    if name in ctx.data and not node.args:
        return T.BatchT((), ctx.data[name])
    if name in ctx.models:
        model = ctx.models[name]
        return instantiate(ctx, model, node, generics, allow_generic, what) if model.params or node.args else model
    one_arg = {"Dataset": "a data type", "Grad": "a model", **{o.value: "a model" for o in OptimizerKind}}
    if name in one_arg:
        arg = node.args[0] if len(node.args) == 1 else None
        arg_name = arg.name if isinstance(arg, (A.DimName, A.NamedType)) else None
        if name == "Dataset" and arg_name in ctx.data and not getattr(arg, "args", None):
            return T.DatasetT(ctx.data[arg_name])
        if name != "Dataset" and arg_name in ctx.models:
            assert isinstance(arg, (A.DimName, A.NamedType))
            written = arg if isinstance(arg, A.NamedType) else A.NamedType(arg.span, arg.name)
            of = resolve_type(ctx, written, generics, allow_generic, what)
            if not isinstance(of, T.ModelT):
                return T.UNKNOWN
            return T.GradT(of) if name == "Grad" else T.OptT(OptimizerKind(name), of)
        return ctx.error("E0204", f"`{name}[...]` takes {one_arg[name]}", node.span,
                         f"expected {name}[{'Digit' if name == 'Dataset' else 'Model'}]",
                         f"the program declares {describe_names(ctx, name)}")
    return ctx.error("E0204", f"unknown type `{name}`", node.span, "not a type",
                     similar(name, list(ctx.data) + list(ctx.models) + list(DTYPES) + ["Dataset", "Sink", *OptimizerKind]))


def padded_dims(data: T.DataT, generics: dict[str, D.Dim]) -> tuple[tuple[str, D.Dim], ...]:
    """The data's generic dims for one batch value, shared by name with the function's own."""
    out = []
    for name in data.generics:
        if name not in generics:
            generics[name] = D.generic(name)
        out.append((name, generics[name]))
    return tuple(out)


def describe_names(ctx: Context, wrapper: str) -> str:
    names = list(ctx.data) if wrapper == "Dataset" else list(ctx.models)
    kind = "data types" if wrapper == "Dataset" else "models"
    return f"{kind}: {', '.join(names)}" if names else f"no {kind}"


def index_bound(ctx: Context, node: A.NamedType, generics: dict[str, D.Dim], allow_generic: bool,
                what: str) -> D.Dim | None:
    arg = node.args[0] if len(node.args) == 1 else None
    if arg is None or isinstance(arg, A.ShapeType) or (isinstance(arg, A.NamedType) and arg.args):
        ctx.error("E0204", f"`{node.name}` takes one dim, as `{node.name}[C]`", node.span, f"expected {node.name}[C]")
        return None
    if isinstance(arg, A.NamedType):
        arg = A.DimName(arg.span, arg.name)
    return resolve_dim(ctx, arg, generics, allow_generic, what)


def resolve_axis(ctx: Context, node: A.Axis, generics: dict[str, D.Dim], allow_generic: bool,
                 what: str) -> T.AxisT | None:
    if isinstance(node, A.GroupAxis):
        resolved = [resolve_dim(ctx, p, generics, allow_generic, what) for p in node.parts]
        parts = tuple(p for p in resolved if p is not None)
        if len(parts) != len(resolved):
            return None
        return T.group(parts)
    d = resolve_dim(ctx, node, generics, allow_generic, what)
    return T.axis(d) if d is not None else None


def resolve_dim(ctx: Context, node: A.DimExpr, generics: dict[str, D.Dim], allow_generic: bool,
                what: str) -> D.Dim | None:
    if isinstance(node, A.DimInt):
        if node.value <= 0:
            ctx.error("E0310", f"a dim must be a positive size, not {node.value}", node.span, "not a size")
            return None
        return D.literal(node.value)
    if isinstance(node, A.DimName):
        if node.name in generics:  # a function's generic dim, or a generic model's own (which hides a declared one)
            return generics[node.name]
        if node.name in ctx.dim_values:
            return D.declared(node.name)
        if not allow_generic:
            ctx.error("E0312", f"{what or 'this type'} must have a fixed shape, but `{node.name}` isn't a "
                      "declared dim", node.span, "not declared",
                      similar(node.name, ctx.dim_values) or f"declare it with `dim {node.name} = ...`")
            return None
        if node.name[0].isupper():
            ctx.error("E0201", f"unknown dim `{node.name}`", node.span, "not declared",
                      similar(node.name, ctx.dim_values)
                      or f"declare it with `dim {node.name} = ...`; generic dims are written in lower case")
            return None
        generics[node.name] = D.generic(node.name)
        return generics[node.name]
    left = resolve_dim(ctx, node.left, generics, allow_generic, what)
    right = resolve_dim(ctx, node.right, generics, allow_generic, what)
    if left is None or right is None:
        return None
    result: sympy.Expr = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}[node.op](
        left, right)
    expanded = D.expand_derived(result)  # `D - H*Dh` is 0 when D = H*Dh, sized or not
    exact = sympy.sympify(expanded.xreplace({s: ctx.dim_values[s.name] for s in _declared(expanded)
                                            if ctx.dim_values.get(s.name) is not None}))
    if result.has(sympy.zoo, sympy.nan) or (exact.is_number and (not exact.is_integer or exact <= 0)):
        ctx.error("E0310", f"the dim {D.show(result)} isn't a positive whole size"
                  + (f" (it is {exact})" if exact.is_number and exact.is_finite else ""), node.span, "not a size")
        return None
    return result


def _declared(d: D.Dim) -> set[sympy.Symbol]:
    return {s for s in D.symbols(d) if not D.is_generic(s)}


def show_type_expr(node: A.TypeExpr) -> str:
    return node.name if isinstance(node, A.NamedType) else "shape"


# ---- generic models ---------------------------------------------------------------------------

def instantiate(ctx: Context, model: T.ModelT, node: A.NamedType, generics: dict[str, D.Dim],
                allow_generic: bool, what: str) -> T.Ty:
    """`Linear[D C]`: the generic model `Linear` with its dims given, as a model type of its own
    (one per distinct list of dims, so two uses of `Linear[D C]` are one type)."""
    if not model.params:
        return ctx.error("E0204", f"`{model.name}` has sizes of its own: it takes no dims", node.span,
                         f"write `{model.name}`", f"declare it `model {model.name}[...]:` to give it dims where it's used")
    if len(node.args) != len(model.params):
        return ctx.error("E0204", f"`{model.name}` takes {len(model.params)} dim{'s' * (len(model.params) > 1)}, "
                         f"as `{model.name}[{' '.join(model.params)}]`, but this gives {len(node.args)}",
                         node.span, f"expected {model.name}[{' '.join(model.params)}]",
                         f"`{model.name}` is declared at {model.node.span}")
    args: list[D.Dim] = []
    dtypes: list[str] = []
    for param, arg in zip(model.params, node.args):
        if param in model.dtype_params:
            name = arg.name if isinstance(arg, (A.DimName, A.NamedType)) and not getattr(arg, "args", None) else None
            if name not in DTYPES:
                return ctx.error("E0204", f"`{param}` of `{model.name}` is a dtype, not `{show_arg(arg)}`", arg.span,
                                 "not a dtype", f"give one of {', '.join(DTYPES)}")
            assert name is not None
            dtypes.append(name)
            continue
        if isinstance(arg, A.ShapeType) or (isinstance(arg, A.NamedType) and arg.args):
            return ctx.error("E0204", f"`{model.name}[...]` takes dims, not types", arg.span, "not a dim",
                             f"write `{model.name}[{' '.join(model.params)}]` with dims")
        dim = resolve_dim(ctx, A.DimName(arg.span, arg.name) if isinstance(arg, A.NamedType) else arg,
                          generics, allow_generic, what)
        if dim is None:
            return T.UNKNOWN
        args.append(dim)
    key = (model.name, tuple(args), tuple(dtypes))
    if key in ctx.instances:
        return ctx.instances[key]
    if model.name in ctx.models_within:
        return ctx.error("E0402", f"model `{model.name}` contains itself", node.span, "a use of itself",
                         "through " + " -> ".join([*ctx.models_within, model.name]))
    declare_members(ctx, model)  # its own mistakes, once, where it's declared
    shown, given_dims, given_dtypes = [], iter(args), iter(dtypes)
    for param in model.params:
        shown.append(next(given_dtypes) if param in model.dtype_params else D.show(next(given_dims)))
    name = f"{model.name}[{' '.join(shown)}]"
    used = T.ModelT(name, model.node, params=(), of=model, args=tuple(args), dtypes=tuple(dtypes))
    ctx.instances[key] = used
    if model.name in ctx.broken_models:
        return used
    before = len(ctx.diagnostics)
    dim_params = [p for p in model.params if p not in model.dtype_params]
    dtype_params = [p for p in model.params if p in model.dtype_params]
    with ctx.within_model(model.name):
        members(ctx, used, dict(zip(dim_params, args)), dict(zip(dtype_params, dtypes)))
    found = ctx.diagnostics[before:]
    del ctx.diagnostics[before:]
    for d in found:  # what only these sizes get wrong: said at the use
        ctx.error(d.code, f"in `{name}`: {d.message}", node.span, f"{model.name} with these dims", *d.help,
                  secondary=((d.span, d.label or "here"),))
    return used


def show_arg(arg: A.TypeExpr | A.DimExpr) -> str:
    """A model use's argument as written, for a message."""
    if isinstance(arg, (A.DimName, A.NamedType)):
        return arg.name
    return str(arg.value) if isinstance(arg, A.DimInt) else "this"
