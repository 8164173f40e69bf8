"""Operations that take a pattern: rearrange, split, repeat, reduce and einsum (the patterns
themselves are checked by check/patterns.py). They place their own arguments: tensors, then the
pattern, sizes by keyword, and reduce's operation.

On several devices, reduce with sum and einsum that leave out the batch axis add up every device's
partial result; reduce with another operation over the batch axis is refused (E1801)."""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...syntax import ast as A
from .. import dims as D
from .. import types as T
from ..builtins import _unused_args, tensor_arg
from ..patterns import PatternError, Side, bind_lhs, build_rhs, lower_recipe
from .table import (PARTIAL, PARTIAL_PRODUCTS, PER_EXAMPLE, Across, Args, CallView, LowerCall, Op, Typed, register,
                    result_values)

if TYPE_CHECKING:
    from ..bodies import BodyChecker

REDUCE_OPS = ("sum", "mean", "max", "min", "prod")


class _Args:
    def __init__(self) -> None:
        self.tensors: list[A.Arg] = []
        self.pattern: A.Pattern | None = None
        self.sizes: dict[str, D.Dim] = {}
        self.op: A.Arg | None = None


def pattern_args(ck: "BodyChecker", node: A.Call, name: str, takes_op: bool = False) -> _Args | None:
    """Split a pattern call's arguments: tensors, the pattern, keyword sizes (and an op)."""
    out = _Args()
    for arg in node.args:
        if isinstance(arg.value, A.Pattern):
            if out.pattern is not None:
                ck.error("E0307", f"`{name}` takes one pattern", arg.span, "a second pattern")
                return None
            out.pattern = arg.value
        elif takes_op and (arg.keyword == "op" or (arg.keyword is None and out.pattern is not None)):
            out.op = arg
        elif arg.keyword is not None:
            size = _size_value(ck, arg)
            if size is None:
                return None
            out.sizes[arg.keyword] = size
        elif out.pattern is not None:
            ck.error("E0206", f"`{name}`'s tensors come before its pattern", arg.span, "after the pattern")
            return None
        else:
            out.tensors.append(arg)
    if out.pattern is None:
        ck.error("E0307", f"`{name}` needs a pattern, as `{name}(x, b d -> d b)`", node.span, "no pattern")
        return None
    return out


def _size_value(ck: "BodyChecker", arg: A.Arg) -> D.Dim | None:
    v = arg.value
    if isinstance(v, A.IntLit) and v.value > 0:
        return D.literal(v.value)
    if isinstance(v, A.Name) and ck.ctx.dim_values.get(v.id) is not None:
        return D.declared(v.id)
    ck.error("E0307", f"a size in a pattern call is a positive number or a dim of the program, as `{arg.keyword}=4`",
             arg.span, "not a size")
    return None


def _unused_sizes(args: _Args, p: A.Pattern) -> None:
    """A size keyword must name an axis of the pattern."""
    names = {a.name for side in p.lhs + [p.rhs] for ax in side for a in (ax.group or [ax]) if a.name}
    extra = sorted(set(args.sizes) - names)
    if extra:
        raise PatternError(f"`{extra[0]}=` names no axis of the pattern", p, "an unused size",
                           "give sizes only for names in the pattern")


def _fail(ck: "BodyChecker", node: A.Call, e: PatternError) -> T.UnknownT:
    return ck.error("E0307", str(e), e.node.span, e.label, e.help)


def _one_tensor(ck: "BodyChecker", node: A.Call, name: str, takes_op: bool = False
                ) -> tuple[_Args, T.TensorT] | None:
    args = pattern_args(ck, node, name, takes_op)
    if args is None:
        _unused_args(ck, node)
        return None
    if len(args.tensors) != 1:
        ck.error("E0206", f"`{name}` takes one tensor and a pattern", node.span, "")
        _unused_args(ck, node)
        return None
    t = tensor_arg(ck, args.tensors[0], f"`{name}`")
    if t is None:
        return None
    if len(args.pattern.lhs) != 1:  # type: ignore[union-attr]
        ck.error("E0307", f"`{name}`'s pattern has one operand on its left side", args.pattern.span)  # type: ignore
        return None
    return args, t


def _positions(lhs: Side, rhs: Side) -> list[int]:
    names = [a.name for a in lhs.atoms]
    return [names.index(a.name) for a in rhs.atoms if a.name in names]


def _bind_sides(ck: "BodyChecker", args: _Args, t: T.TensorT, p: A.Pattern, new_axes: bool = False
                ) -> tuple[Side, Side, tuple[T.AxisT, ...], dict[str, T.AxisT]]:
    """A one-operand pattern against `t`: its left side bound to t's axes, its right side built
    from them. Sizes given by keyword size the left side's axes or, with `new_axes` (repeat), the
    right side's new ones. Returns both sides, the result's axes and what the names are bound to."""
    _unused_sizes(args, p)
    known: dict[str, T.AxisT] = {}
    lhs = bind_lhs(ck, t, p.lhs[0], known, {} if new_axes else args.sizes, p)
    new = {k: v for k, v in args.sizes.items() if k not in known} if new_axes else {}
    rhs, axes = build_rhs(p.rhs, known, new)
    return lhs, rhs, axes, known


def rearrange(ck: "BodyChecker", node: A.Call, _: Args) -> Typed | T.UnknownT:
    name = node.func.id  # type: ignore[union-attr]
    got = _one_tensor(ck, node, name)
    if got is None:
        return T.UNKNOWN
    args, t = got
    p = args.pattern
    assert p is not None
    try:
        lhs, rhs, axes, _known = _bind_sides(ck, args, t, p)
        on_right = {a.name for a in rhs.atoms}
        dropped = [k for k, a in enumerate(lhs.atoms) if a.name not in on_right or a.name is None]
        literals = [k for k in dropped if lhs.atoms[k].name is None and lhs.atoms[k].size != 1]
        lost = [lhs.atoms[k].name for k in dropped if lhs.atoms[k].name is not None]
        if lost:
            raise PatternError(f"`{lost[0]}` is on the left but not on the right", p,
                               f"`{lost[0]}` would be lost", "use `reduce` to sum or average it away")
        keep = _positions(lhs, rhs)
        if name == "split":
            if len(literals) != 1:
                raise PatternError("`split` needs exactly one literal count on the left, the number of parts, "
                                   "as the 3 in `b (3 D) -> b D`", p, "")
            count = int(lhs.atoms[literals[0]].size)
            recipe = lower_recipe(lhs, rhs, [literals[0]] + keep, p, ck.ctx.dim_values)
            recipe["perm"] = tuple([literals[0]] + keep)  # the parts' axis first, always
        else:
            if literals:
                raise PatternError("a literal size on the left of `rearrange` must stay: to cut an axis into "
                                   "parts use `split`", p, "")
            recipe = lower_recipe(lhs, rhs, keep, p, ck.ctx.dim_values)
    except PatternError as e:
        return _fail(ck, node, e)
    result = T.TensorT(axes, t.dtype, t.index)
    return Typed(T.TupleT((result,) * count) if name == "split" else result, (args.tensors[0].value,), recipe)


def reduce(ck: "BodyChecker", node: A.Call, _: Args) -> Typed | T.UnknownT:
    got = _one_tensor(ck, node, "reduce", takes_op=True)
    if got is None:
        return T.UNKNOWN
    args, t = got
    p = args.pattern
    assert p is not None
    op = args.op.value if args.op is not None else None
    if not (isinstance(op, A.Name) and op.id in REDUCE_OPS):
        return ck.error("E0307", f"`reduce` needs an operation: {', '.join(REDUCE_OPS)}",
                        args.op.span if args.op else node.span, "not a reduction",  # type: ignore[union-attr]
                        "write `reduce(x, b d -> b, sum)`")
    if op.id == "mean" and not t.is_float:
        return ck.error("E0308", "`reduce` with mean takes floats", args.tensors[0].span)
    try:
        lhs, rhs, axes, _known = _bind_sides(ck, args, t, p)
        on_right = {a.name for a in rhs.atoms}
        reduced = tuple(k for k, a in enumerate(lhs.atoms) if a.name is None or a.name not in on_right)
        remaining = [a.name for k, a in enumerate(lhs.atoms) if k not in reduced]
        perm = [remaining.index(a.name) for a in rhs.atoms]
        recipe = lower_recipe(lhs, rhs, list(range(len(lhs.atoms))), p, ck.ctx.dim_values)
    except PatternError as e:
        return _fail(ck, node, e)
    recipe["perm"] = tuple(perm) if perm != sorted(perm) else None
    dtype = "i64" if op.id in ("sum", "prod") and t.dtype in ("bool", "i32") else t.dtype
    return Typed(T.TensorT(axes, dtype), (args.tensors[0].value,), {"dims": reduced, "op": op.id, **recipe})


def repeat(ck: "BodyChecker", node: A.Call, _: Args) -> Typed | T.UnknownT:
    got = _one_tensor(ck, node, "repeat")
    if got is None:
        return T.UNKNOWN
    args, t = got
    p = args.pattern
    assert p is not None
    try:
        lhs, rhs, axes, known = _bind_sides(ck, args, t, p, new_axes=True)
        lost = [a.name for a in lhs.atoms if a.name not in {b.name for b in rhs.atoms}]
        if lost:
            raise PatternError(f"`{lost[0]}` is on the left but not on the right", p, "",
                               "`repeat` keeps every axis and adds new ones")
        keep = _positions(lhs, rhs)
        recipe = lower_recipe(lhs, rhs, keep, p, ck.ctx.dim_values)
        view, sizes = [], []
        for a in rhs.atoms:
            if a.name in known:
                view.append(None)
                sizes.append(None)
            else:
                value = D.value(a.size, ck.ctx.dim_values)
                if value is None:
                    raise PatternError(f"the size of the new axis `{a.name}` must be known", p)
                view.append(1)
                sizes.append(value)
    except PatternError as e:
        return _fail(ck, node, e)
    options = {"split": recipe["split"], "perm": recipe["perm"], "view": tuple(view), "new_sizes": tuple(sizes),
               "merge": recipe["merge"]}
    return Typed(T.TensorT(axes, t.dtype, t.index), (args.tensors[0].value,), options)


def einsum(ck: "BodyChecker", node: A.Call, _: Args) -> Typed | T.UnknownT:
    args = pattern_args(ck, node, "einsum")
    if args is None:
        return _unused_args(ck, node)
    p = args.pattern
    assert p is not None
    tensors = [tensor_arg(ck, a, "`einsum`", floats=True) for a in args.tensors]
    if any(t is None for t in tensors):
        return T.UNKNOWN
    if len(p.lhs) != len(tensors):
        return ck.error("E0307", f"`einsum` has {len(tensors)} tensors but its pattern has {len(p.lhs)} operands",
                        p.span, "", "write one operand per tensor: `einsum(a, b, i k, k j -> i j)`")
    dtypes = {t.dtype for t in tensors}  # type: ignore[union-attr]
    if len(dtypes) > 1:
        return ck.error("E0308", f"`einsum` of {' and '.join(sorted(dtypes))}", node.span, "different dtypes")
    known: dict[str, T.AxisT] = {}
    letters: dict[str, str] = {}
    specs = []
    try:
        _unused_sizes(args, p)
        for side, t in zip(p.lhs, tensors):
            if any(ax.group is not None or ax.size is not None for ax in side):
                raise PatternError("`einsum`'s pattern takes names only", p, "",
                                   "rearrange groups apart first")
            bind_lhs(ck, t, side, known, {}, p)  # type: ignore[arg-type]
            if len(set(letters) | {ax.name for ax in side}) > len(string.ascii_letters):
                raise PatternError(f"`einsum` takes at most {len(string.ascii_letters)} names", p, "too many names")
            specs.append("".join(letters.setdefault(ax.name, string.ascii_letters[len(letters)])  # type: ignore
                                 for ax in side))
        rhs, axes = build_rhs(p.rhs, known, {})
        if any(ax.group is not None for ax in p.rhs):
            raise PatternError("`einsum`'s result takes names only", p, "", "rearrange it afterwards")
    except PatternError as e:
        return _fail(ck, node, e)
    spec = ",".join(specs) + "->" + "".join(letters[a.name] for a in rhs.atoms)  # type: ignore[index]
    return Typed(T.TensorT(axes, tensors[0].dtype), tuple(a.value for a in args.tensors), {"spec": spec})  # type: ignore


def runtime_call(runtime: str, keys: tuple[str, ...]) -> Callable[[LowerCall], str]:
    """A call of the runtime's pattern function with the recipe's parts, as Python literals."""
    def lower(call: LowerCall) -> str:
        return f"_rt.{runtime}({call.args[0]}, {', '.join(call.literal(call.options[k]) for k in keys)})"
    return lower


def drops_batch(view: CallView) -> bool:
    """The batch axis of an operand is not in the result: the call sums or reduces over it."""
    kept = {a.size for a in view.result.axes} if isinstance(view.result, T.TensorT) else set()
    return any(t.axes[k].size not in kept for t in view.arg_types if isinstance(t, T.TensorT)
               for k in view.split_axes(t))


RECIPE = ("split", "perm", "merge")

register(
    Op("rearrange", ("x", "pattern"), 2, rearrange, runtime_call("rearrange", RECIPE), PER_EXAMPLE, own_args=True),
    Op("split", ("x", "pattern"), 2, rearrange, runtime_call("split_parts", RECIPE), PER_EXAMPLE, own_args=True),
    Op("repeat", ("x", "pattern"), 2, repeat,
       runtime_call("repeat", ("split", "perm", "view", "new_sizes", "merge")), PER_EXAMPLE, own_args=True),
    Op("reduce", ("x", "pattern", "op"), 3, reduce, runtime_call("reduce", ("split", "dims", "op", "perm", "merge")),
       Across(drops_batch, lambda view: PARTIAL if view.options.get("op") == "sum" else None,
              payload=result_values(PARTIAL_PRODUCTS),
              refused_as=lambda view: f"`reduce` with {view.options.get('op')}"), own_args=True),
    Op("einsum", ("tensors", "pattern"), 2, einsum,
       lambda call: f"torch.einsum({call.literal(call.options['spec'])}, {', '.join(call.args)})",
       Across(drops_batch, PARTIAL, payload=result_values(PARTIAL_PRODUCTS)), own_args=True),
)
