"""A call of one of the program's functions: how its arguments bind the callee's generic dims, and
the check of each argument against its parameter (`check_argument`). The built-in functions' rules
are the op table's (shapescript/ops/); `BUILTIN_NAMES` are their names and the built-in types'.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import sympy

from ..errors import Span
from ..names import similar
from ..ops import RULES
from ..ops.args import labels, same_value
from ..optimizers import OptimizerKind
from ..shapes import dims as D
from ..shapes import value_types as T
from ..syntax import tree as A
from .hints import a_dtype, keeps_values

if TYPE_CHECKING:
    from .bodies import BodyChecker
    from .program import FnInfo, ParamInfo



# ---- binding generic dims at a call ----------------------------------------------------------

def bind_generics(param: T.Ty, arg: T.Ty, mapping: dict[D.Dim, D.Dim], bound_by: dict[D.Dim, str],
                  pname: str) -> None:
    """First pass of a call: each bare generic dim of the callee takes the argument's axis."""
    if isinstance(param, T.TensorT) and isinstance(arg, T.TensorT):
        pairs = list(zip(param.axes, arg.axes)) if param.rank == arg.rank else []
        if param.index is not None and arg.index is not None:
            _bind(param.index, arg.index, mapping, bound_by, pname)
    elif isinstance(param, T.BatchT) and isinstance(arg, T.BatchT) and len(param.axes) == len(arg.axes):
        pairs = list(zip(param.axes, arg.axes))
        theirs = dict(arg.padded)
        for name, dim in param.padded:
            if name in theirs:
                _bind(dim, theirs[name], mapping, bound_by, pname)
    elif isinstance(param, T.AxisArgT) and isinstance(arg, T.AxisArgT):
        _bind(param.dim, arg.dim, mapping, bound_by, pname)
        return
    else:
        p_model, a_model = model_of(param), model_of(arg)
        if p_model is not None and a_model is not None and p_model.of is not None and p_model.of is a_model.of:
            for p_dim, a_dim in zip(p_model.args, a_model.args):  # `Linear[i o]` given a `Linear[D C]`
                _bind(p_dim, a_dim, mapping, bound_by, pname)
        return
    for p, a in pairs:
        if p.parts and a.parts and len(p.parts) == len(a.parts):
            for pp, ap in zip(p.parts, a.parts):
                _bind(pp, ap, mapping, bound_by, pname)
        else:
            _bind(p.size, a.size, mapping, bound_by, pname)


def _bind(p: D.Dim, a: D.Dim, mapping: dict[D.Dim, D.Dim], bound_by: dict[D.Dim, str], pname: str) -> None:
    if D.is_generic(p) and p not in mapping:
        mapping[p] = a
        bound_by[p] = pname


def model_of(t: T.Ty) -> T.ModelT | None:
    """The model type a model, optimizer or gradient value is of."""
    if isinstance(t, T.ModelT):
        return t
    return t.model if isinstance(t, (T.OptT, T.GradT)) else None


def same_model(expected: T.ModelT, t: T.ModelT, mapping: Mapping[D.Dim, D.Dim]) -> bool:
    """Whether a model of type `t` is one of type `expected` (whose generic dims `mapping` binds)."""
    if expected is t:
        return True
    return (expected.of is not None and expected.of is t.of and expected.dtypes == t.dtypes
            and all(D.equal(D.substitute(e, mapping), a) for e, a in zip(expected.args, t.args)))


def substitute(t: T.Ty, mapping: Mapping[D.Dim, D.Dim]) -> T.Ty:
    if isinstance(t, (T.TensorT, T.BatchT)):
        return t.subs(mapping)
    if isinstance(t, T.AxisArgT):
        return T.AxisArgT(D.substitute(t.dim, mapping))
    if isinstance(t, T.TupleT):
        return T.TupleT(tuple(substitute(i, mapping) for i in t.items))
    return t


def check_argument(ck: BodyChecker, fn: FnInfo, p: ParamInfo, arg: A.Arg, t: T.Ty,
                   mapping: Mapping[D.Dim, D.Dim], bound_by: Mapping[D.Dim, str],
                   arg_spans: dict[str, Span] | None = None) -> bool:
    """Second pass: the argument against the parameter's type with every generic bound.
    `arg_spans`: each parameter's argument, by the parameter's name, to point at the one that bound
    a generic dim."""
    if t is T.UNKNOWN or p.ty is T.UNKNOWN:
        return True
    expected = substitute(p.ty, mapping)
    where = f"`{fn.name}`'s parameter `{p.name}`"
    span = arg.value.span
    if isinstance(expected, T.TensorT) and isinstance(t, T.ScalarT) and not expected.axes:
        if t.kind in ("int", "float") and (expected.is_float or t.kind == "int"):
            return True
    if isinstance(expected, (T.TensorT, T.BatchT)) and isinstance(t, (T.TensorT, T.BatchT)) \
            and type(t) is type(expected):
        if isinstance(expected, T.BatchT) and isinstance(t, T.BatchT) and expected.data is not t.data:
            ck.error("E0401", f"{where} is {p.ty.show()}, but this is {t.show()}", span, f"this is {t.show()}")
            return False
        e_axes, a_axes = expected.axes, t.axes
        if len(e_axes) != len(a_axes):
            ck.error("E0302", f"{where} has {len(e_axes)} axes, {p.ty.show()}, but this has {len(a_axes)}",
                     span, f"this is {t.show()}{ck.dim_note(t)}",
                     f"pass a value with {len(e_axes)} axes, as `{p.name}` declares",
                     secondary=((p.node.type.span, f"`{p.name}` is declared {p.ty.show()} here"),))
            return False
        for k, (e, a) in enumerate(zip(e_axes, a_axes)):
            if e.same(a):
                continue
            declared = p.ty
            assert isinstance(declared, (T.TensorT, T.BatchT))  # `expected` is it with the generics bound
            earlier = [s for s in D.symbols(declared.axes[k].size) if s in bound_by and bound_by[s] != p.name]
            if earlier:
                s = earlier[0]
                bound_at = (arg_spans or {}).get(bound_by[s])
                ck.error("E0306", f"dim `{s.name}` of `{fn.name}` is {D.show(mapping[s])} from `{bound_by[s]}`, "
                         f"but `{p.name}` gives {a.show()}", span, f"this is {t.show()}",
                         f"`{fn.name}` takes `{p.name}: {p.ty.show()}`; every `{s.name}` in one call is one size",
                         secondary=labels((bound_at, f"`{s.name}` is {D.show(mapping[s])} here")
                                          if bound_at else None))
            else:
                ck.error("E0301", f"{where} is {expected.show()}{ck.dim_note(expected)}, but this is "
                         f"{t.show()}{ck.dim_note(t)}", span,
                         f"dim {k} is {a.show()}, not {e.show()}",
                         "dims match by name, never by size" if same_value(ck, e, a) else "",
                         misspelled_dim(expected, t), secondary=_declared_axis(p, k))
            return False
        if isinstance(expected, T.TensorT) and isinstance(t, T.TensorT):
            return _check_element(ck, where, expected, t, span)
        return True
    if isinstance(expected, T.AxisArgT) and isinstance(t, T.AxisArgT):
        if D.equal(expected.dim, t.dim):
            return True
        ck.error("E0303", f"{where} is {expected.show()}, but this names {D.show(t.dim)}", span,
                 f"not {D.show(expected.dim)}")
        return False
    if isinstance(expected, T.ScalarT) and isinstance(t, T.ScalarT):
        if expected == t or (expected.kind == "float" and t.kind == "int"):
            return True
    elif expected == t:
        return True
    else:
        e_model, t_model = model_of(expected), model_of(t)
        if (e_model is not None and t_model is not None and type(expected) is type(t)
                and getattr(expected, "kind", None) == getattr(t, "kind", None) and same_model(e_model, t_model, mapping)):
            return True
    ck.error("E0401", f"{where} is {expected.show()}, but this is {t.show()}", span, f"this is {t.show()}",
             model_help(model_of(expected), model_of(t), mapping, bound_by))
    return False


def model_help(expected: T.ModelT | None, t: T.ModelT | None, mapping: Mapping[D.Dim, D.Dim],
               bound_by: Mapping[D.Dim, str]) -> str:
    """Where two uses of one generic model differ: which dim, and which argument fixed it."""
    if expected is None or t is None or expected.of is None or expected.of is not t.of:
        return ""
    dims = [p for p in expected.of.params if p not in expected.of.dtype_params]
    for name, e, a in zip(dims, expected.args, t.args):
        e_now = D.substitute(e, mapping)
        if not D.equal(e_now, a):
            by = next((f" (from `{bound_by[s]}`)" for s in D.symbols(e) if s in bound_by), "")
            return f"its dim `{name}` is {D.show(a)} here, but {D.show(e_now)}{by} is expected"
    dtypes = [p for p in expected.of.params if p in expected.of.dtype_params]
    for name, wanted, given in zip(dtypes, expected.dtypes, t.dtypes):
        if wanted != given:
            return f"its dtype `{name}` is {given} here, but {wanted} is expected"
    return ""


def _declared_axis(p: ParamInfo, k: int) -> tuple[tuple[Span, str], ...]:
    """A secondary label at axis `k` as the parameter's type writes it (the whole type if it can't
    be told apart)."""
    written, declared = p.node.type, p.ty
    assert isinstance(declared, (T.TensorT, T.BatchT))
    if isinstance(written, A.ShapeType) and len(written.axes) == len(declared.axes):
        return ((written.axes[k].span, f"`{p.name}`'s dim {k} is declared {declared.axes[k].show()} here"),)
    return ((written.span, f"`{p.name}` is declared {declared.show()} here"),)


def _check_element(ck: BodyChecker, where: str, expected: T.TensorT, t: T.TensorT, span: Span) -> bool:
    if expected.dtype != t.dtype:
        ck.error("E0308", f"{where} is {expected.dtype}, but this is {t.dtype}", span,
                 f"this is {t.show()}", "the dtypes must be the same",
                 ck.cast_help(span, expected.dtype) if keeps_values(t.dtype, expected.dtype) else
                 f"converting {t.dtype} to {expected.dtype} would lose values: pass {a_dtype(expected.dtype)} value, or "
                 f"declare the parameter {t.dtype}")
        return False
    if expected.index is not None:
        if t.index is None:
            ck.error("E0309", f"{where} is {expected.show()}, but this integer tensor has no bound", span,
                     f"this is {t.show()}", "only values typed `Index[...]` are known to lie in range")
            return False
        if not D.equal(expected.index, t.index):
            ck.error("E0309", f"{where} is {expected.show()}, but this is {t.show()}", span,
                     f"bound {D.show(t.index)}, not {D.show(expected.index)}")
            return False
    return True


def misspelled_dim(expected: T.Ty, actual: T.Ty) -> str:
    """A help when a generic dim is spelled like a declared one (`k` for `K`): a lower-case name in a
    signature is a new generic dim, so the mismatch is really a typo."""
    if not (isinstance(expected, T.TensorT) and isinstance(actual, T.TensorT)):
        return ""
    for e, a in zip(expected.axes, actual.axes):
        sizes = [d for d in (e.size, a.size) if isinstance(d, sympy.Symbol)]
        if e.same(a) or len(sizes) != 2:  # two dims of a name each
            continue
        generic = [d for d in sizes if D.is_generic(d)]
        fixed = [d for d in sizes if not D.is_generic(d)]
        if len(generic) == 1 and len(fixed) == 1 and similar(generic[0].name, [fixed[0].name]):
            return (f"`{generic[0].name}` is a generic dim (any size), not the declared dim `{fixed[0].name}`: "
                    f"did you mean `{fixed[0].name}`?")
    return ""


BUILTIN_NAMES = frozenset(RULES) | {"Dataset", "Sink", "Index", "Axis", "Grad", "Mode"} | frozenset(OptimizerKind)
