"""Operations that take a pattern: rearrange, split, repeat, reduce and einsum (the patterns
themselves are checked by ops/patterns.py). They place their own arguments: tensors, then the
pattern, sizes by keyword, and reduce's operation. A pattern is checked once into a recipe, which
prints as torch method calls, as `x.unflatten(2, (3, 12, 64)).permute(2, 0, 3, 1, 4).unbind(0)`.

On several devices, reduce with sum and einsum that leave out the batch axis add up every device's
partial result; reduce with another operation over the batch axis is refused (E1801)."""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.options import CallOptions, EinsumOptions, PatternOptions
from ..syntax import tree as A
from .args import _unused_args, called_name, tensor_arg
from .checking import RuleChecker
from .patterns import PatternError, Side, bind_lhs, build_rhs, lower_recipe
from .reductions import widened
from .table import (
    PARTIAL,
    PARTIAL_PRODUCTS,
    PER_EXAMPLE,
    Across,
    Args,
    Autocast,
    CallView,
    Layout,
    Lower,
    LowerCall,
    Op,
    Typed,
    heads_contraction,
    heads_rearrange,
    register,
    result_values,
)

REDUCE_OPS = ("sum", "mean", "max", "min", "prod")


@dataclass(frozen=True)
class _Args:
    tensors: list[A.Arg]
    pattern: A.Pattern
    sizes: dict[str, D.Dim]
    op: A.Arg | None


def pattern_args(ck: RuleChecker, node: A.Call, name: str, takes_op: bool = False) -> _Args | None:
    """Split a pattern call's arguments: tensors, the pattern, keyword sizes (and an op)."""
    tensors: list[A.Arg] = []
    pattern: A.Pattern | None = None
    sizes: dict[str, D.Dim] = {}
    op: A.Arg | None = None
    for arg in node.args:
        if isinstance(arg.value, A.Pattern):
            if pattern is not None:
                ck.error("E0307", f"`{name}` takes one pattern", arg.span, "a second pattern")
                return None
            pattern = arg.value
        elif takes_op and (arg.keyword == "op" or (arg.keyword is None and pattern is not None)):
            op = arg
        elif arg.keyword is not None:
            size = _size_value(ck, arg)
            if size is None:
                return None
            sizes[arg.keyword] = size
        elif pattern is not None:
            ck.error("E0206", f"`{name}`'s tensors come before its pattern", arg.span, "after the pattern")
            return None
        else:
            tensors.append(arg)
    if pattern is None:
        ck.error("E0307", f"`{name}` needs a pattern, as `{name}(x, b d -> d b)`", node.span, "no pattern")
        return None
    return _Args(tensors, pattern, sizes, op)


def _size_value(ck: RuleChecker, arg: A.Arg) -> D.Dim | None:
    v = arg.value
    if isinstance(v, A.IntLit) and v.value > 0:
        return D.literal(v.value)
    if isinstance(v, A.Name) and ck.dim_values.get(v.id) is not None:
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


def _fail(ck: RuleChecker, node: A.Call, e: PatternError) -> T.UnknownT:
    return ck.error("E0307", str(e), e.node.span, e.label, e.help)


def _one_tensor(ck: RuleChecker, node: A.Call, name: str, takes_op: bool = False
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
    if len(args.pattern.lhs) != 1:
        ck.error("E0307", f"`{name}`'s pattern has one operand on its left side", args.pattern.span)
        return None
    return args, t


def _positions(lhs: Side, rhs: Side) -> list[int]:
    names = [a.name for a in lhs.atoms]
    return [names.index(a.name) for a in rhs.atoms if a.name in names]


def _bind_sides(ck: RuleChecker, args: _Args, t: T.TensorT, p: A.Pattern, new_axes: bool = False
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


def rearrange(ck: RuleChecker, node: A.Call, _: Args) -> Typed[PatternOptions] | T.UnknownT:
    name = called_name(node)
    got = _one_tensor(ck, node, name)
    if got is None:
        return T.UNKNOWN
    args, t = got
    p = args.pattern
    try:
        lhs, rhs, axes, _known = _bind_sides(ck, args, t, p)
        on_right = {a.name for a in rhs.atoms}
        dropped = [k for k, a in enumerate(lhs.atoms) if a.name not in on_right or a.name is None]
        literals = [k for k in dropped if lhs.atoms[k].name is None and lhs.atoms[k].size != 1]
        lost = [lhs.atoms[k].name for k in dropped if lhs.atoms[k].name is not None]
        if lost:
            raise PatternError(f"`{lost[0]}` is on the left but not on the right", p,
                               f"`{lost[0]}` would be lost",
                               "to keep one position along it, `take(x, k, over=...)` (`-1`: the last, as an "
                               "RNN's final state); to sum or average it away, `reduce`; rearrange moves axes and "
                               "drops only axes of size 1")
        keep = _positions(lhs, rhs)
        if name == "split":
            if len(literals) != 1:
                raise PatternError("`split` needs exactly one literal count on the left, the number of parts, "
                                   "as the 3 in `b (3 D) -> b D`", p, "")
            count = int(lhs.atoms[literals[0]].size)
            recipe = lower_recipe(lhs, rhs, [literals[0]] + keep, p, ck.dim_values)
            recipe = dataclasses.replace(recipe, perm=tuple([literals[0]] + keep))  # the parts' axis first, always
        else:
            if literals:
                raise PatternError("a literal size on the left of `rearrange` must stay: to cut an axis into "
                                   "parts use `split`", p, "")
            recipe = lower_recipe(lhs, rhs, keep, p, ck.dim_values)
        # The literal 1s are squeezed away.
        recipe = dataclasses.replace(recipe, drop=tuple(k for k in dropped if k not in literals))
    except PatternError as e:
        return _fail(ck, node, e)
    result = T.TensorT(axes, t.dtype, t.index)
    return Typed(T.TupleT((result,) * count) if name == "split" else result, (args.tensors[0].expr,), recipe)


def reduce(ck: RuleChecker, node: A.Call, _: Args) -> Typed[PatternOptions] | T.UnknownT:
    got = _one_tensor(ck, node, "reduce", takes_op=True)
    if got is None:
        return T.UNKNOWN
    args, t = got
    p = args.pattern
    op = args.op.value if args.op is not None else None
    if not (isinstance(op, A.Name) and op.id in REDUCE_OPS):
        return ck.error("E0307", f"`reduce` needs an operation: {', '.join(REDUCE_OPS)}",
                        args.op.span if args.op else node.span, "not a reduction",
                        "write `reduce(x, b d -> b, sum)`")
    if op.id == "mean" and not t.is_float:
        return ck.error("E0308", "`reduce` with mean takes floats", args.tensors[0].span)
    try:
        lhs, rhs, axes, _known = _bind_sides(ck, args, t, p)
        on_right = {a.name for a in rhs.atoms}
        reduced = tuple(k for k, a in enumerate(lhs.atoms) if a.name is None or a.name not in on_right)
        remaining = [a.name for k, a in enumerate(lhs.atoms) if k not in reduced]
        perm = [remaining.index(a.name) for a in rhs.atoms]
        recipe = lower_recipe(lhs, rhs, list(range(len(lhs.atoms))), p, ck.dim_values)
    except PatternError as e:
        return _fail(ck, node, e)
    options = dataclasses.replace(recipe, dims=reduced, op=op.id, perm=tuple(perm) if perm != sorted(perm) else None)
    dtype = widened(op.id, t.dtype)  # as the op of that name widens
    return Typed(T.TensorT(axes, dtype), (args.tensors[0].expr,), options)


def repeat(ck: RuleChecker, node: A.Call, _: Args) -> Typed[PatternOptions] | T.UnknownT:
    got = _one_tensor(ck, node, "repeat")
    if got is None:
        return T.UNKNOWN
    args, t = got
    p = args.pattern
    try:
        lhs, rhs, axes, known = _bind_sides(ck, args, t, p, new_axes=True)
        lost = [a.name for a in lhs.atoms if a.name not in {b.name for b in rhs.atoms}]
        if lost:
            what = f"`{lost[0]}` is" if lost[0] is not None else "a literal size is"
            raise PatternError(f"{what} on the left but not on the right", p, "",
                               "`repeat` keeps every axis and adds new ones; drop a size-1 axis with "
                               "rearrange first" if lost[0] is None else "`repeat` keeps every axis and adds new ones")
        keep = _positions(lhs, rhs)
        recipe = lower_recipe(lhs, rhs, keep, p, ck.dim_values)
        view: list[int | None] = []  # None: an atom of the operand; 1: a new axis, expanded to its size
        sizes: list[int | None] = []
        for a in rhs.atoms:
            if a.name in known:
                view.append(None)
                sizes.append(None)
            else:
                value = D.value(a.size, ck.dim_values)
                if value is None:
                    raise PatternError(f"the size of the new axis `{a.name}` must be known", p)
                view.append(1)
                sizes.append(value)
    except PatternError as e:
        return _fail(ck, node, e)
    options = dataclasses.replace(recipe, view=tuple(view), new_sizes=tuple(sizes))
    return Typed(T.TensorT(axes, t.dtype, t.index), (args.tensors[0].expr,), options)


def einsum(ck: RuleChecker, node: A.Call, _: Args) -> Typed[EinsumOptions] | T.UnknownT:
    args = pattern_args(ck, node, "einsum")
    if args is None:
        return _unused_args(ck, node)
    p = args.pattern
    typed = [tensor_arg(ck, a, "`einsum`", floats=True) for a in args.tensors]
    tensors = [t for t in typed if t is not None]
    if len(tensors) != len(typed):
        return T.UNKNOWN
    if len(p.lhs) != len(tensors):
        return ck.error("E0307", f"`einsum` has {len(tensors)} tensors but its pattern has {len(p.lhs)} operands",
                        p.span, "", "write one operand per tensor: `einsum(a, b, i k, k j -> i j)`")
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        return ck.error("E0308", f"`einsum` of {' and '.join(sorted(dtypes))}", node.span, "different dtypes")
    known: dict[str, T.AxisT] = {}
    letters: dict[str, str] = {}
    specs: list[str] = []
    try:
        _unused_sizes(args, p)
        for side, t in zip(p.lhs, tensors):
            if any(ax.group is not None or ax.size is not None for ax in side):
                raise PatternError("`einsum`'s pattern takes names only", p, "",
                                   "rearrange groups apart first")
            bind_lhs(ck, t, side, known, {}, p)
            if len(set(letters) | {ax.name for ax in side}) > len(string.ascii_letters):
                raise PatternError(f"`einsum` takes at most {len(string.ascii_letters)} names", p, "too many names")
            specs.append("".join(letters.setdefault(_named(ax.name), string.ascii_letters[len(letters)])
                                 for ax in side))
        rhs, axes = build_rhs(p.rhs, known, {})
        if any(ax.group is not None for ax in p.rhs):
            raise PatternError("`einsum`'s result takes names only", p, "", "rearrange it afterwards")
    except PatternError as e:
        return _fail(ck, node, e)
    spec = ",".join(specs) + "->" + "".join(letters[_named(a.name)] for a in rhs.atoms)
    return Typed(T.TensorT(axes, tensors[0].dtype), tuple(a.expr for a in args.tensors), EinsumOptions(spec))


def _named(name: str | None) -> str:
    """A name of einsum's pattern, which has names only: its literal sizes and groups are refused
    before any name is read."""
    assert name is not None
    return name


# The recipes' parts, in the order the runtime's pattern functions take them.
Parts = Callable[[PatternOptions], tuple[object, ...]]


def recipe_parts(o: PatternOptions) -> tuple[object, ...]:
    return o.split, o.perm, o.merge, o.drop


def repeat_parts(o: PatternOptions) -> tuple[object, ...]:
    return o.split, o.perm, o.view, o.new_sizes, o.merge


def reduce_parts(o: PatternOptions) -> tuple[object, ...]:
    return o.split, o.dims, o.op, o.perm, o.merge


def runtime_call(runtime: str, parts: Parts) -> Lower[PatternOptions]:
    """A call of the runtime's pattern function with the recipe's parts, as Python literals."""
    def lower(call: LowerCall[PatternOptions]) -> str:
        return f"_rt.{runtime}({call.args[0]}, {', '.join(call.literal(part) for part in parts(call.options))})"
    return lower


# ---- lowering: a recipe printed as torch ---------------------------------------------------------
# Each recipe step of runtime/patterns.py becomes a method call after the operand, and a step that
# changes nothing prints nothing: the line reads as the PyTorch one would, and nothing interprets the
# recipe when it runs.

Steps = list[str]  # method calls (or an index) printed after the operand, in order
REDUCE_METHODS = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin"}  # prod: one dim a call


def _ints(values: Sequence[int]) -> str:
    """Dims as torch takes them: `1` for one, `(1, 2)` for several."""
    return str(values[0]) if len(values) == 1 else f"({', '.join(map(str, values))})"


def _chain(call: LowerCall[PatternOptions], steps: Steps) -> str:
    """The operand with the steps after it; parenthesized even with none, as the call's result is
    printed as one term (`rearrange(a + b, i j -> i j) @ w` is `(a + b) @ w`)."""
    return call.wrapped[0] + "".join(steps)


def _read_twice(text: str) -> bool:
    """A name or a member (`x`, `m._m_w`): its shape can be read without evaluating anything twice."""
    return all(part.isidentifier() for part in text.split("."))


def _split_steps(call: LowerCall[PatternOptions]) -> Steps | None:
    """`.unflatten(k, sizes)` for each operand axis the pattern splits, k counting the atoms before it.
    A part's size is a number, -1 (inferred) or ("axis", j), the size of the operand's whole axis j:
    as the parts multiply to the axis, one ("axis", j) of a group without a -1 becomes the -1. Any
    other is `x.shape[j]`, which only an operand that is a name gives without evaluating it twice:
    None for the others, whose runtime call reads the shape of the value it is given."""
    operand, steps, at = call.args[0], [], 0
    for parts in call.options.split or ():
        if parts is None:
            at += 1
            continue
        sizes = list(parts)
        read = [k for k, size in enumerate(sizes) if isinstance(size, tuple)]
        if read and -1 not in sizes:
            sizes[read.pop(0)] = -1
        if read and not _read_twice(operand):
            return None
        text = [f"{operand}.shape[{size[1]}]" if isinstance(size, tuple) else str(size) for size in sizes]
        steps.append(f".unflatten({at}, ({', '.join(text)}))")
        at += len(parts)
    return steps


def _perm_steps(perm: tuple[int, ...] | None, drop: tuple[int, ...] = ()) -> Steps:
    """`.squeeze(...)` of the literal 1s the pattern drops, then `.permute(...)` unless the order stays
    (the atoms left after squeezing count from 0 again)."""
    steps = [f".squeeze({_ints(drop)})"] if drop else []
    if perm is not None:
        order = [sorted(perm).index(k) for k in perm]
        if order != sorted(order):
            steps.append(f".permute({', '.join(map(str, order))})")
    return steps


def _merge_steps(merge: tuple[int, ...] | None, first: int = 0) -> Steps:
    """`.flatten(start, end)` for each result axis that merges several atoms, after `first` axes."""
    steps, at = [], first
    for count in merge or ():
        if count > 1:
            steps.append(f".flatten({at}, {at + count - 1})")
        at += 1
    return steps


def _reduce_steps(op: str, dims: tuple[int, ...]) -> Steps:
    """The reduction over the atoms that aren't on the right; none when every atom stays (torch would
    reduce over every axis given no dims)."""
    if not dims:
        return []
    if op == "prod":  # torch.prod takes one dim at a time: the last first, so the others keep their place
        return [f".prod(dim={d})" for d in sorted(dims, reverse=True)]
    return [f".{REDUCE_METHODS[op]}(dim={_ints(dims)})"]


def _new_axes_steps(view: tuple[int | None, ...], sizes: tuple[int | None, ...]) -> Steps:
    """repeat's new axes: an index adds each as an axis of 1 (`[:, None]`), `.expand` sizes it."""
    if all(v is None for v in view):
        return []
    index = [":" if v is None else "None" for v in view]
    while index[-1] == ":":
        index.pop()
    return [f"[{', '.join(index)}]", f".expand({', '.join('-1' if s is None else str(s) for s in sizes)})"]


def _rearranged(o: PatternOptions) -> Steps:
    return _perm_steps(o.perm, o.drop) + _merge_steps(o.merge)


def _parts(o: PatternOptions) -> Steps:
    """split's parts' axis comes first: each part's merge is one on the whole, after that axis."""
    return _perm_steps(o.perm, o.drop) + _merge_steps(o.merge, first=1) + [".unbind(0)"]


def _reduced(o: PatternOptions) -> Steps:
    assert o.op is not None  # reduce's rule records its operation
    return _reduce_steps(o.op, o.dims) + _perm_steps(o.perm) + _merge_steps(o.merge)


def _repeated(o: PatternOptions) -> Steps:
    return _perm_steps(o.perm) + _new_axes_steps(o.view, o.new_sizes) + _merge_steps(o.merge)


def printed(runtime: str, parts: Parts, steps: Callable[[PatternOptions], Steps]) -> Lower[PatternOptions]:
    """The recipe as torch: its split, then `steps` of its options. The runtime's function `runtime`,
    given the recipe's `parts`, only where the split can't be printed: a size read off the shape of an
    operand that isn't a name (see _split_steps)."""
    fallback = runtime_call(runtime, parts)

    def lower(call: LowerCall[PatternOptions]) -> str:
        split = _split_steps(call)
        return fallback(call) if split is None else _chain(call, split + steps(call.options))
    return lower


def drops_batch(view: CallView[CallOptions]) -> bool:
    """The batch axis of an operand is not in the result: the call sums or reduces over it."""
    kept = {a.size for a in view.result.axes} if isinstance(view.result, T.TensorT) else set()
    return any(t.axes[k].size not in kept for t in view.arg_types if isinstance(t, T.TensorT)
               for k in view.split_axes(t))


register(
    Op("rearrange", ("x", "pattern"), 2, rearrange, printed("rearrange", recipe_parts, _rearranged), PER_EXAMPLE,
       own_args=True, layout=Layout(heads=heads_rearrange)),
    Op("split", ("x", "pattern"), 2, rearrange, printed("split_parts", recipe_parts, _parts), PER_EXAMPLE,
       own_args=True),
    Op("repeat", ("x", "pattern"), 2, repeat, printed("repeat", repeat_parts, _repeated), PER_EXAMPLE, own_args=True),
    Op("reduce", ("x", "pattern", "op"), 3, reduce, printed("reduce", reduce_parts, _reduced),
       Across[PatternOptions](drops_batch, lambda view: PARTIAL if view.options.op == "sum" else None,
              payload=result_values("`reduce`'s partial sums, every device's part of the batch added up"),
              refused_as=lambda view: f"`reduce` with {view.options.op}"), own_args=True),
    Op("einsum", ("tensors", "pattern"), 2, einsum,
       lambda call: f"torch.einsum({call.literal(call.options.spec)}, {', '.join(call.args)})",
       Across[EinsumOptions](drops_batch, PARTIAL, payload=result_values(PARTIAL_PRODUCTS)), own_args=True,
       layout=Layout[EinsumOptions](heads=heads_contraction), autocast=Autocast.LOWER),
)
