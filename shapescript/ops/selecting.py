"""Selecting and joining along an axis named by its dim: `take` (one position, the axis dropped),
`put` (one position written), `window` (a run of positions), `last` (the last k, or all where there are fewer), `cat` (operands end to end), `stack` (operands along a new leading
axis) and `pad` (entries added at either end). A result's size follows by dim arithmetic: a window
of `k` has `k`, `cat` along `n` of `[b n]` and `[b 1]` gives `[b n+1]`, `pad(x, 1, 2, over=n)`
`[b n+3]`. A position may be a run-time number (negative ones count from the end, as Python's);
it is checked here when it and the axis's size are known, and by the lowered call when it runs
otherwise. Along the batch axis each device would select from, or join, its own part: refused on
several devices (E1801), as are sizes read off the batch. Under `split H` each works on each
device's part along another axis than H, and takes its operands whole along H."""

from __future__ import annotations

from typing import NamedTuple

import sympy

from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.options import AxisOptions, FirstOptions, SizeSource
from ..syntax import tree as A
from .args import literal_number, number_arg, over_axis, tensor_arg
from .checking import RuleChecker
from .sizes import count_source, sized_by_batch
from .table import (
    PER_EXAMPLE,
    Across,
    Args,
    CallView,
    Layout,
    LowerCall,
    Op,
    Typed,
    along_batch,
    heads_along,
    heads_local,
    register,
)


def _along(ck: RuleChecker, x: A.Arg, over: A.Arg, what: str) -> tuple[T.TensorT, int] | None:
    """The operand, a tensor with at least one axis, and the index of its axis `over=` names."""
    t = tensor_arg(ck, x, what)
    if t is None:
        return None
    if t.rank == 0:
        ck.error("E0302", f"{what} works along an axis, and {t.show()} has none", x.span, f"this is {t.show()}")
        return None
    axis = over_axis(ck, over, t, what)
    return None if axis is None else (t, axis)


class Position(NamedTuple):
    literal: int | None  # a literal whole number's value (None: known when the program runs)
    tensor: bool = False  # a `[] Index[...]` tensor of the axis


def _position(ck: RuleChecker, arg: A.Arg, along: T.AxisT, what: str, tensors: bool) -> Position | None:
    """A position along `along`: a whole number, or (`tensors`) a `[] Index[...]` of that axis;
    None after an error."""
    t = ck.expr(arg.expr)
    if t == T.INT:
        value = literal_number(arg.value)
        return Position(value if isinstance(value, int) else None)
    index = f" or a `[] Index[{along.show()}]`" if tensors else ""
    if isinstance(t, T.TensorT):
        if tensors and t.rank == 0 and t.index is not None and D.equal(t.index, along.size):
            return Position(None, tensor=True)
        ck.error("E0309" if tensors else "E0401", f"{what} is a whole number{index}, not {t.show()}", arg.span,
                 "not a position along " + along.show(),
                 "pick a position per example with `gather`" if t.rank else "")
    elif t is not T.UNKNOWN:
        ck.error("E0401", f"{what} is a whole number{index}, not {t.show()}", arg.span, f"this is {t.show()}")
    return None


def _without(t: T.TensorT, axis: int) -> tuple[T.AxisT, ...]:
    return t.axes[:axis] + t.axes[axis + 1:]


def _replaced(t: T.TensorT, axis: int, size: D.Dim, index: D.Dim | None) -> T.TensorT:
    return T.TensorT(t.axes[:axis] + (T.axis(size),) + t.axes[axis + 1:], t.dtype, index)


# ---- take and window -------------------------------------------------------------------------

def take_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[FirstOptions] | T.UnknownT:
    """`take(x, i, over=T)`: x at position i along T, without that axis."""
    x, i, over = args
    assert x is not None and i is not None and over is not None
    found = _along(ck, x, over, "`take`")
    if found is None:
        return T.UNKNOWN
    t, axis = found
    taken = t.axes[axis]
    position = _position(ck, i, taken, "`take`'s position", tensors=True)
    if position is None:
        return T.UNKNOWN
    size, at = D.value(taken.size, ck.dim_values), position.literal
    if at is not None and size is not None and not -size <= at < size:
        return ck.error("E0309", f"`take` at position {at} along {taken.show()}, which has {size}", i.span,
                        "out of range", f"a position is in 0..{size - 1}, or -{size}..-1 from the end")
    return Typed(T.TensorT(_without(t, axis), t.dtype, t.index), (x.expr, i.expr),
                 FirstOptions(axis=axis, names=(taken.show(),)))


def take_lower(call: LowerCall[FirstOptions]) -> str:
    """The run time checks a whole number against the axis, naming the call's .ss place."""
    x, i = call.args
    return f"_rt.take({x}, {i}, {call.options.axis}, {call.literal(call.options.names[0])}, {call.where})"


class Counted(NamedTuple):
    """A tensor, the axis an op works along and a count of entries along it (window's, last's)."""
    t: T.TensorT
    axis: int
    dim: D.Dim
    source: SizeSource | None


def _counted(ck: RuleChecker, x: A.Arg | None, count_arg: A.Arg | None, over: A.Arg | None, what: str) -> Counted | None:
    assert x is not None and count_arg is not None and over is not None
    found = _along(ck, x, over, f"`{what}`")
    count = count_source(ck, count_arg.value, f"`{what}`'s " + ("size" if what == "window" else "count"))
    if found is None or count is None:
        return None
    return Counted(found[0], found[1], count[0], count[1])


def put_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[FirstOptions] | T.UnknownT:
    """`put(x, i, v, over=T)`: x with its entry at position i along T replaced by v (x's type without
    T): the step of a loop over T that writes each position's result (an RNN's outputs)."""
    x, i, v, over = args
    assert x is not None and i is not None and v is not None and over is not None
    found = _along(ck, x, over, "`put`")
    value = tensor_arg(ck, v, "`put`'s value")
    if found is None or value is None:
        return T.UNKNOWN
    t, axis = found
    taken = t.axes[axis]
    position = _position(ck, i, taken, "`put`'s position", tensors=True)
    if position is None:
        return T.UNKNOWN
    entry = T.TensorT(_without(t, axis), t.dtype, t.index)
    if not T.same_type(entry, T.TensorT(value.axes, value.dtype, value.index)):
        return ck.error("E0301", f"`put` writes an entry of {t.show()} along {taken.show()}, {entry.show()}, not "
                        f"{value.show()}", v.span, f"this is {value.show()}",
                        f"the value has x's axes without {taken.show()}, and its dtype")
    size, at = D.value(taken.size, ck.dim_values), position.literal
    if at is not None and size is not None and not -size <= at < size:
        return ck.error("E0309", f"`put` at position {at} along {taken.show()}, which has {size}", i.span,
                        "out of range", f"a position is in 0..{size - 1}, or -{size}..-1 from the end")
    return Typed(t, (x.expr, i.expr, v.expr), FirstOptions(axis=axis, names=(taken.show(),)))


def put_lower(call: LowerCall[FirstOptions]) -> str:
    x, i, v = call.args
    return f"_rt.put({x}, {i}, {v}, {call.options.axis}, {call.literal(call.options.names[0])}, {call.where})"


def window_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[FirstOptions] | T.UnknownT:
    """`window(x, start, size, over=T)`: `size` entries of x along T from position `start`."""
    x, start, size_arg, over = args
    along = _counted(ck, x, size_arg, over, "window")
    if along is None or start is None or x is None or size_arg is None:
        return T.UNKNOWN
    t, axis, dim, source = along
    taken = t.axes[axis]
    position = _position(ck, start, taken, "`window`'s start", tensors=False)
    if position is None:
        return T.UNKNOWN
    begin = position.literal
    have, want = D.value(taken.size, ck.dim_values), D.value(dim, ck.dim_values)
    if have is not None and want is not None:
        counted = str(want) if dim.is_Integer else f"{D.show(dim)} = {want}"
        first = None if begin is None else (begin if begin >= 0 else have + begin)
        if want > have or (first is not None and not 0 <= first <= have - want):
            at = "" if begin is None or want > have else f" from {begin}"
            return ck.error("E0310", f"`window` takes {counted} entries along {taken.show()}{at}, which has {have}",
                            size_arg.span if begin is None or want > have else start.span, "out of range",
                            f"start at most at {have - want}, or -{want} for the last {want}" if want <= have
                            else f"take at most {have}")
    return Typed(_replaced(t, axis, dim, t.index), (x.expr, start.expr),
                 FirstOptions(axis=axis, sizes=(source,), names=(D.show(dim), taken.show())))


def window_lower(call: LowerCall[FirstOptions]) -> str:
    x, start = call.args
    return (f"_rt.window({x}, {start}, {call.size(call.options.sizes[0])}, {call.options.axis}, "
            f"{call.literal(call.options.names)}, {call.where})")


def last_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[FirstOptions] | T.UnknownT:
    """`last(x, k, over=T)`: x's last k entries along T, or all of them where T has fewer. Its size
    is k or T where the checker knows which is smaller, else a size of its own, `min(T,k)`, that
    the run finds; `over=T` still names that axis."""
    x, count_arg, over = args
    counted = _counted(ck, x, count_arg, over, "last")
    if counted is None or x is None:
        return T.UNKNOWN
    t, axis, dim, source = counted
    taken = t.axes[axis]
    have, want = D.value(taken.size, ck.dim_values), D.value(dim, ck.dim_values)
    if have is not None and want is not None:
        size = dim if want <= have else taken.size
    else:
        size = D.generic(f"min({taken.show()},{D.show(dim)})")
        ck.came_from(size, taken.size)  # `over=n` names it, as the axis it was cut from
    return Typed(_replaced(t, axis, size, t.index), (x.expr,),
                 FirstOptions(axis=axis, sizes=(source,), names=(D.show(dim), taken.show())))


def last_lower(call: LowerCall[FirstOptions]) -> str:
    return f"_rt.last({call.args[0]}, {call.size(call.options.sizes[0])}, {call.options.axis})"


# ---- cat and stack ---------------------------------------------------------------------------

def _operands(ck: RuleChecker, node: A.Call, what: str, keywords: list[str]) -> tuple[list[A.Arg], Args] | None:
    """Any number (two or more) of tensors, then the keywords: each placed by `arrange`."""
    count = sum(1 for a in node.args if a.keyword is None)
    names = [f"x{k + 1}" for k in range(count)] + keywords
    args = ck.arrange(node, names, what, count + (1 if what == "`cat`" else 0))
    if args is None:
        return None
    operands = [a for a in args[:count] if a is not None]
    if count < 2:
        ck.error("E0206", f"{what} joins two tensors or more, and is given {count}", node.span,
                 "one tensor" if count == 1 else "no tensor")
        return None
    return operands, args[count:]


def _alike(ck: RuleChecker, what: str, first: T.TensorT, arg: A.Arg, t: T.TensorT, skip: int | None) -> bool:
    """An operand of the first's dtype and axes (but for axis `skip`); E0308, E0301 otherwise."""
    if t.dtype != first.dtype:
        ck.error("E0308", f"{what} of {first.dtype} and {t.dtype}", arg.span, f"this is {t.show()}",
                 ck.cast_help(arg.value, first.dtype))
        return False
    if t.rank != first.rank or not all(a.same(b) for k, (a, b) in enumerate(zip(t.axes, first.axes)) if k != skip):
        but = "" if skip is None else f" but along {first.axes[skip].show()}"
        ck.error("E0301", f"{what} joins tensors of one shape{but}: {first.show()} and {t.show()}", arg.span,
                 f"this is {t.show()}")
        return False
    return True


def _join_axis(ck: RuleChecker, over: A.Arg, types: list[T.TensorT]) -> int | None:
    """The axis `over=` names in the first operand that has it (`cat(window(x, 0, 2, over=n), x,
    over=n)`: the window's axis is 2), at the same place in the others."""
    name = over.value.id if isinstance(over.value, A.Name) else ""
    dim = ck.dims.get(name, D.declared(name) if name in ck.dim_values else None)
    for t in types:
        hits = [k for k, a in enumerate(t.axes) if dim is not None and D.equal(a.size, dim)]
        if len(hits) == 1:
            return hits[0]
    return over_axis(ck, over, types[0], "`cat`")  # none has it: the first one's error


def _shared_index(types: list[T.TensorT]) -> D.Dim | None:
    """The `Index[...]` bound every operand has; None where one has none, or another."""
    bound = types[0].index
    if bound is None or not all(t.index is not None and D.equal(t.index, bound) for t in types):
        return None
    return bound


def cat_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[AxisOptions] | T.UnknownT:
    """`cat(a, b, ..., over=T)`: the operands end to end along T, whose sizes add up."""
    placed = _operands(ck, node, "`cat`", ["over"])
    if placed is None:
        return T.UNKNOWN
    operands, (over,) = placed
    assert over is not None
    found = [tensor_arg(ck, a, "`cat`") for a in operands]
    types = [t for t in found if t is not None]
    if len(types) < len(found):
        return T.UNKNOWN
    axis = _join_axis(ck, over, types)
    if axis is None:
        return T.UNKNOWN
    first = types[0]
    if not all(_alike(ck, "`cat`", first, a, t, axis) for a, t in zip(operands[1:], types[1:])):
        return T.UNKNOWN
    size = sympy.Add(*(t.axes[axis].size for t in types))
    return Typed(_replaced(first, axis, size, _shared_index(types)), tuple(a.expr for a in operands),
                 AxisOptions(axis=axis))


def stack_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[AxisOptions] | T.UnknownT:
    """`stack(a, b, ...)`: the operands, of one type, along a new leading axis of their count."""
    placed = _operands(ck, node, "`stack`", [])
    if placed is None:
        return T.UNKNOWN
    operands, _ = placed
    found = [tensor_arg(ck, a, "`stack`") for a in operands]
    types = [t for t in found if t is not None]
    if len(types) < len(found):
        return T.UNKNOWN
    first = types[0]
    if not all(_alike(ck, "`stack`", first, a, t, None) for a, t in zip(operands[1:], types[1:])):
        return T.UNKNOWN
    result = T.TensorT((T.axis(D.literal(len(operands))),) + first.axes, first.dtype, _shared_index(types))
    return Typed(result, tuple(a.expr for a in operands), AxisOptions(axis=0))


def joined(name: str) -> Op[AxisOptions]:
    """cat and stack: torch's own function of the operands along the axis."""
    def lower(call: LowerCall[AxisOptions]) -> str:
        return f"torch.{name}(({', '.join(call.args)},), {call.options.axis})"
    if name == "cat":
        return Op("cat", ("x1", "x2", "over"), 3, cat_rule, lower, Across(over_batch=any_along_batch),
                  Layout(heads=heads_along(False)), own_args=True)
    return Op("stack", ("x1", "x2"), 2, stack_rule, lower, PER_EXAMPLE, Layout(heads=heads_local), own_args=True)


def any_along_batch(view: CallView[AxisOptions]) -> bool:
    """Along an axis that is the batch axis in one operand or more."""
    return any(view.options.axis in view.split_axes(t) for t in view.arg_types)


# ---- pad -------------------------------------------------------------------------------------

def _pad_count(ck: RuleChecker, arg: A.Arg) -> tuple[D.Dim, SizeSource | None] | None:
    """How many entries `pad` adds at one end: 0, a positive literal or a dim."""
    if isinstance(arg.value, A.IntLit) and arg.value.value == 0:
        return D.literal(0), 0
    return count_source(ck, arg.value, "`pad`'s count")


def pad_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[FirstOptions] | T.UnknownT:
    """`pad(x, before, after, over=T, value=0)`: x with `before` entries of `value` ahead of it
    along T and `after` behind it: T's size grows by both."""
    x, before, after, over, value = args
    assert x is not None and before is not None and after is not None and over is not None
    found = _along(ck, x, over, "`pad`")
    counts = _pad_count(ck, before), _pad_count(ck, after)
    if found is None or counts[0] is None or counts[1] is None or not number_arg(ck, value, "`pad`'s value"):
        return T.UNKNOWN
    t, axis = found
    if t.dtype == "bool":
        return ck.error("E0308", "`pad` of bool values", x.span, f"this is {t.show()}", ck.cast_help(x.value, "i64"))
    if value is not None and not t.is_float and ck.expr(value.expr) == T.FLOAT:
        return ck.error("E0308", f"`pad` of {t.dtype} values with a float", value.span, "a float",
                        "pad with a whole number")
    (b_dim, b_src), (a_dim, a_src) = counts[0], counts[1]
    zero = value is None or literal_number(value.value) == 0
    index = t.index if zero else None  # 0 is in range of every Index[...]
    return Typed(_replaced(t, axis, t.axes[axis].size + b_dim + a_dim, index),
                 (x.expr,) + ((value.expr,) if value is not None else ()),
                 FirstOptions(axis=axis, rank=t.rank, sizes=(b_src, a_src)))


def pad_lower(call: LowerCall[FirstOptions]) -> str:
    """torch's F.pad, which lists each axis's two counts from the last axis back."""
    o = call.options
    assert o.rank is not None and o.axis is not None
    counts = ["0"] * (2 * (o.rank - 1 - o.axis)) + [call.size(s) for s in o.sizes]
    value = f", value={call.args[1]}" if len(call.args) > 1 else ""
    return f"_F.pad({call.args[0]}, ({', '.join(counts)}){value})"


def sized_or_along_batch(view: CallView[FirstOptions]) -> bool:
    return sized_by_batch(view) or along_batch(view)


ALONG: Layout[FirstOptions] = Layout(heads=heads_along(False))

register(
    Op("take", ("x", "i", "over"), 3, take_rule, take_lower, Across[FirstOptions](over_batch=along_batch), ALONG),
    Op("put", ("x", "i", "value", "over"), 4, put_rule, put_lower, Across[FirstOptions](over_batch=along_batch), ALONG),
    Op("window", ("x", "start", "size", "over"), 4, window_rule, window_lower,
       Across(over_batch=sized_or_along_batch), ALONG),
    Op("last", ("x", "count", "over"), 3, last_rule, last_lower, Across(over_batch=sized_or_along_batch), ALONG),
    joined("cat"),
    joined("stack"),
    Op("pad", ("x", "before", "after", "over", "value"), 4, pad_rule, pad_lower,
       Across(over_batch=sized_or_along_batch), ALONG),
)
