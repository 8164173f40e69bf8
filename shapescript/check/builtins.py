"""The typing rules of built-in functions and operators, and how calls bind generic dims.

Each rule takes the body checker and the call, checks the arguments, records how the call
resolved (and a recipe for lowering, such as the axis a reduction runs over) and returns the
result's type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..errors import Span
from ..syntax import ast as A
from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.options import Recipe
from .origins import axis_label, labels, type_label

if TYPE_CHECKING:
    from .bodies import BodyChecker
    from .program import FnInfo, ParamInfo

Rule = Callable[["BodyChecker", A.Call], T.Ty]
RULES: dict[str, Rule] = {}  # each built-in function's, by its name: the op table's (check/ops/)


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


def substitute(t: T.Ty, mapping: Mapping[D.Dim, D.Dim]) -> T.Ty:
    if isinstance(t, (T.TensorT, T.BatchT)):
        return t.subs(mapping)
    if isinstance(t, T.AxisArgT):
        return T.AxisArgT(D.substitute(t.dim, mapping))
    if isinstance(t, T.TupleT):
        return T.TupleT(tuple(substitute(i, mapping) for i in t.items))
    return t


def check_argument(ck: "BodyChecker", fn: "FnInfo", p: "ParamInfo", arg: A.Arg, t: T.Ty,
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
                     span, f"this is {t.show()}{ck.ctx.dim_note(t)}",
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
                from .checker import misspelled_dim  # the checker imports this module
                ck.error("E0301", f"{where} is {expected.show()}{ck.ctx.dim_note(expected)}, but this is "
                         f"{t.show()}{ck.ctx.dim_note(t)}", span,
                         f"dim {k} is {a.show()}, not {e.show()}",
                         "dims match by name, never by size" if _same_value(ck, e, a) else "",
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
    elif expected == t or isinstance(expected, T.ModelT) and expected is t:
        return True
    ck.error("E0401", f"{where} is {expected.show()}, but this is {t.show()}", span, f"this is {t.show()}")
    return False


def _declared_axis(p: "ParamInfo", k: int) -> tuple[tuple[Span, str], ...]:
    """A secondary label at axis `k` as the parameter's type writes it (the whole type if it can't
    be told apart)."""
    written, declared = p.node.type, p.ty
    assert isinstance(declared, (T.TensorT, T.BatchT))
    if isinstance(written, A.ShapeType) and len(written.axes) == len(declared.axes):
        return ((written.axes[k].span, f"`{p.name}`'s dim {k} is declared {declared.axes[k].show()} here"),)
    return ((written.span, f"`{p.name}` is declared {declared.show()} here"),)


def _check_element(ck: "BodyChecker", where: str, expected: T.TensorT, t: T.TensorT, span: Span) -> bool:
    if expected.dtype != t.dtype:
        from .bodies import cast_help  # the body checker imports this module
        ck.error("E0308", f"{where} is {expected.dtype}, but this is {t.dtype}", span,
                 f"this is {t.show()}", "the dtypes must be the same", cast_help(ck, span, expected.dtype))
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


def _same_value(ck: "BodyChecker", a: T.AxisT, b: T.AxisT) -> bool:
    va, vb = D.value(a.size, ck.ctx.dim_values), D.value(b.size, ck.ctx.dim_values)
    return va is not None and va == vb


# ---- operators -------------------------------------------------------------------------------

def broadcast(ck: "BodyChecker", node: A.Node, left: T.TensorT, right: T.TensorT) -> tuple[T.AxisT, ...] | None:
    """Axes of an elementwise result. Dims match by name: the smaller operand's axes must appear,
    in order, among the larger's; the recipe says where to insert its missing axes."""
    if left.rank == right.rank and all(a.same(b) for a, b in zip(left.axes, right.axes)):
        return left.axes
    if left.rank == 0 or right.rank == 0:
        return left.axes if left.rank else right.axes
    big, small = (left, right) if left.rank >= right.rank else (right, left)
    positions = _match_from_right(big.axes, small.axes) if big.rank > small.rank else None
    if positions is None:
        op = getattr(node, "op", "this operation")
        ck.error("E0301", f"`{op}` of {left.show()} and {right.show()}: their dims don't match", node.span,
                 f"{left.show()} and {right.show()}",
                 "dims match by name; the smaller side's dims must all be in the larger, in order",
                 "rearrange one side first if its axes are in another order",
                 secondary=labels(type_label(ck, node.left, left), type_label(ck, node.right, right))
                 if isinstance(node, A.Binary) else ())
        return None
    if positions != list(range(big.rank - small.rank, big.rank)):
        index = tuple(":" if k in positions else None for k in range(big.rank))
        ck.checked.recipes[id(node)] = Recipe(right=index) if small is right else Recipe(left=index)
    return big.axes


def placed_within(ck: "BodyChecker", node: A.Node, big: T.TensorT, small: T.TensorT, what: str
                  ) -> tuple[str | None, ...] | None:
    """Where `small`'s axes sit in `big`'s (by name, in order): the index to lower it with ('()' when
    torch's own broadcasting places it), or None after an error."""
    if small.rank == big.rank and all(a.same(b) for a, b in zip(small.axes, big.axes)):
        return ()
    positions = _match_from_right(big.axes, small.axes) if small.rank <= big.rank else None
    if positions is None:
        ck.error("E0301", f"{what} is {small.show()}, which doesn't fit {big.show()}", node.span,
                 f"this is {small.show()}", "its dims must all be dims of the other, in the same order")
        return None
    if positions == list(range(big.rank - small.rank, big.rank)):
        return ()
    return tuple(":" if k in positions else None for k in range(big.rank))


def _match_from_right(big: tuple[T.AxisT, ...], small: tuple[T.AxisT, ...]) -> list[int] | None:
    out: list[int] = []
    j = len(small) - 1
    for k in range(len(big) - 1, -1, -1):
        if j >= 0 and big[k].same(small[j]):
            out.append(k)
            j -= 1
    return sorted(out) if j < 0 else None


def matmul(ck: "BodyChecker", node: A.Node, left: T.Ty, right: T.Ty, lnode: A.Node, rnode: A.Node) -> T.Ty:
    for side, t in ((lnode, left), (rnode, right)):
        if not isinstance(t, T.TensorT) or t.rank == 0:
            return ck.error("E0304", f"`@` needs tensors with at least one axis, not {t.show()}", side.span,
                            f"this is {t.show()}", "multiply by a number with `*`")
        if not t.is_float:
            return ck.error("E0308", f"`@` of {t.dtype} values", side.span, f"this is {t.show()}",
                            "`@` multiplies float tensors")
    assert isinstance(left, T.TensorT) and isinstance(right, T.TensorT)
    if left.dtype != right.dtype:
        return ck.error("E0308", f"`@` of {left.dtype} and {right.dtype}", node.span, "different dtypes")
    a, b = left.axes[-1], right.axes[0]
    if not a.same(b):
        return ck.error("E0304", f"`@` contracts {left.show()}'s last axis {a.show()} with {right.show()}'s "
                        f"first axis {b.show()}, and they differ", node.span,
                        f"{a.show()} vs {b.show()}",
                        "`@` multiplies the last axis of the left side by the first axis of the right",
                        "dims match by name, never by size" if _same_value(ck, a, b) else "",
                        secondary=labels(axis_label(ck, lnode, left, -1, "last axis"),
                                         axis_label(ck, rnode, right, 0, "first axis")))
    ck.checked.recipes[id(node)] = Recipe(tensordot=right.rank > 2)
    return T.TensorT(left.axes[:-1] + right.axes[1:], left.dtype)


# ---- argument helpers ------------------------------------------------------------------------

def tensor_arg(ck: "BodyChecker", arg: A.Arg | None, what: str, floats: bool = False) -> T.TensorT | None:
    if arg is None:
        return None
    t = ck.expr(arg.expr)
    if isinstance(t, T.TensorT):
        ck.use("tensors", arg.span)
        if floats and not t.is_float:
            from .bodies import cast_help  # the body checker imports this module
            ck.error("E0308", f"{what} takes float tensors, not {t.dtype}", arg.span, f"this is {t.show()}",
                     cast_help(ck, arg.value, "f32"))
            return None
        return t
    if t is not T.UNKNOWN:
        ck.error("E0401", f"{what} takes a tensor, not {t.show()}", arg.span, f"this is {t.show()}")
    return None


def over_axis(ck: "BodyChecker", arg: A.Arg, t: T.TensorT, what: str) -> int | None:
    """The index of the axis named by `over=NAME` in `t`."""
    node = arg.value
    if not isinstance(node, A.Name):
        ck.error("E0303", f"`over=` names a dim, as `over=D`", arg.span, "not a dim name")
        return None
    dim = ck.dims.get(node.id)
    if dim is None and node.id in ck.ctx.dim_values:
        dim = D.declared(node.id)
    if dim is None:
        from .checker import similar  # the checker imports this module
        known = sorted(set(ck.dims) | set(ck.ctx.dim_values))
        ck.error("E0303", f"`{node.id}` isn't a dim", node.span, "unknown dim",
                 similar(node.id, [a.show() for a in t.axes] + known) or f"dims here: {', '.join(known)}")
        return None
    hits = [k for k, a in enumerate(t.axes) if D.equal(a.size, dim)]
    if not hits:
        ck.error("E0303", f"{what} over {node.id}, but {t.show()} has no axis {node.id}", node.span,
                 f"not an axis of {t.show()}", f"name one of its axes: {', '.join(a.show() for a in t.axes)}")
        return None
    if len(hits) > 1:
        ck.error("E0303", f"{t.show()} has {node.id} twice, so `over={node.id}` is ambiguous", node.span,
                 "which one?", "rearrange it so the axes have different names")
        return None
    return hits[0]


def called_name(node: A.Call) -> str:
    """The name a built-in was called by: the body checker looks up a rule only for a call of a name."""
    assert isinstance(node.func, A.Name)
    return node.func.id


def literal_number(node: A.Node) -> int | float | None:
    """The value of a literal number, negated ones included (`-1` parses as a unary minus)."""
    if isinstance(node, (A.IntLit, A.FloatLit)):
        return node.value
    if isinstance(node, A.Unary) and node.op == "-" and isinstance(node.operand, (A.IntLit, A.FloatLit)):
        return -node.operand.value
    return None


def int_arg(ck: "BodyChecker", arg: A.Arg | None, what: str) -> bool:
    if arg is None:
        return True
    t = ck.expr(arg.expr)
    if t == T.INT or t is T.UNKNOWN:
        return True
    ck.error("E0401", f"{what} is a whole number, not {t.show()}", arg.span, f"this is {t.show()}")
    return False


def number_arg(ck: "BodyChecker", arg: A.Arg | None, what: str) -> bool:
    """A plain number (int or float), or absent; E0401 otherwise."""
    if arg is None:
        return True
    t = ck.expr(arg.expr)
    if t in (T.INT, T.FLOAT) or t is T.UNKNOWN:
        return True
    ck.error("E0401", f"{what} is a number, not {t.show()}", arg.span, f"this is {t.show()}")
    return False


def _unused_args(ck: "BodyChecker", node: A.Call) -> T.UnknownT:
    for a in node.args:
        if not isinstance(a.value, A.Pattern) and id(a.value) not in ck.checked.types:
            ck.expr(a.value)
    return T.UNKNOWN


from . import ops  # noqa: E402,F401  (registers every built-in function's rule)

BUILTIN_NAMES = frozenset(RULES) | {"Dataset", "Sink", "AdamW", "Sgd", "Index", "Axis", "Grad", "Mode"}
