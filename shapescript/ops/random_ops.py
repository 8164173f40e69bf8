"""The random ops: random_normal, random_uniform, bernoulli, randint and categorical, each one
draw of a `Train(seed=...)` mode, as dropout's mask is.

A draw is for the whole batch: on several devices every device draws the whole batch's values and
keeps its own part's (the batch split tells the lowering where the result's batch axis lies), so N
devices draw for each example exactly what one device draws (runtime/modes.py's `draw`). categorical
along the batch axis itself is refused there (E1801): each device holds only part of each
distribution. With `split H` they take their operand whole and draw the whole value, as one device
does; they read no param of their own, so `shard params` changes nothing of them.

The shape of a draw is a tensor's: `random_normal(x, mode)` draws a value of `x`'s type (its
values aren't read). The names of `normal` and `uniform` stay the initializers' of a model's params
(`param w: [D] = normal(std=0.02)`, with no tensor to take a shape from): a random op is a call in a
function's body, and its name says that it draws.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..shapes import value_types as T
from ..shapes.options import DrawOptions
from ..syntax import tree as A
from .args import keyword_numbers, literal_number, over_axis, tensor_arg
from .checking import RuleChecker
from .table import Across, Args, CallView, LowerCall, Op, Typed, along_batch, register

NO_SEED = "Eval"  # the mode that draws nothing


def mode_arg(ck: RuleChecker, arg: A.Arg, name: str) -> bool:
    """A Mode to draw from: a value of type Mode, and not `Eval()` itself (it has no seed)."""
    t = ck.expr(arg.expr)
    if t != T.MODE and t is not T.UNKNOWN:
        ck.error("E0401", f"`{name}` draws from a mode, Train(seed=...), not {t.show()}", arg.span,
                 f"this is {t.show()}", "take a `mode: Mode` parameter, or give Train(seed=...)")
        return False
    value = arg.value
    if isinstance(value, A.Call) and isinstance(value.func, A.Name) and value.func.id == NO_SEED:
        ck.error("E0401", f"`{name}` draws from a Train(seed=...) mode, and Eval() has no seed to draw from",
                 arg.span, "draws nothing", "give it Train(seed=...), or a `mode: Mode` parameter")
        return False
    return True


def bounds_in_order(ck: RuleChecker, name: str, low: A.Arg | None, high: A.Arg | None, default_low: float,
                    strict: bool) -> bool:
    """`low` below `high` (at most `high` unless `strict`), where both are written as numbers."""
    low_value = literal_number(low.value) if low is not None else default_low
    high_value = literal_number(high.value) if high is not None else None
    if low_value is None or high_value is None or high is None:
        return True
    if high_value > low_value or (high_value == low_value and not strict):
        return True
    ck.error("E0310", f"`{name}` draws from low={low_value} up to high={high_value}, an empty range", high.span,
             f"at most low={low_value}", f"give `high=` a number above {low_value}")
    return False


# What a drawing op finds from its first argument's type: the result's type and the axis it works
# along (categorical's), or None after an error.
ResultOf = Callable[[RuleChecker, A.Call, Args, T.TensorT], tuple[T.TensorT, int | None] | None]


def drawn(name: str, params: tuple[str, ...], required: int, result_of: ResultOf, first: str | None = None,
          floats: bool = True, keywords: tuple[str, ...] = (), whole: bool = False) -> Op[DrawOptions]:
    """An op that draws: its first argument, a tensor (`floats`: a float one; `first`: how messages
    name it), gives the shape, and `result_of` the result's type; its second is the mode, then come
    `keywords`, numbers (`whole`: whole numbers), and `over=` last if it has one."""
    def rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[DrawOptions] | T.UnknownT:
        x, mode = args[0], args[1]
        assert x is not None and mode is not None
        t = tensor_arg(ck, x, first or f"`{name}`", floats=floats)
        good_mode = mode_arg(ck, mode, name)
        numbers = args[2:2 + len(keywords)]
        given = keyword_numbers(ck, name, keywords, numbers, whole)
        found = result_of(ck, node, args, t) if t is not None and good_mode and given is not None else None
        if found is None or given is None:
            return T.UNKNOWN
        result, axis = found
        lowered = (x.expr, mode.expr) + tuple(a.expr for a in numbers if a is not None)
        return Typed(result, lowered, DrawOptions(axis=axis, keywords=given))

    def lower(call: LowerCall[DrawOptions]) -> str:
        o = call.options
        axis = "" if o.axis is None else f"{o.axis}, "
        given = "".join(f", {k}={text}" for k, text in zip(o.keywords, call.args[2:]))
        return f"_rt.{name}({call.args[0]}, {call.args[1]}, {axis}{o.batch_axis}, {call.where}{given})"

    over_batch = along_batch if "over" in params else None  # categorical along the batch axis: refused
    return Op(name, params, required, rule, lower, Across(over_batch=over_batch, split_options=result_batch_axis))


def result_batch_axis(view: CallView[DrawOptions]) -> DrawOptions:
    """A result with the batch axis: drawn for the whole batch, each device keeping its part."""
    where = view.split_axes(view.result)
    return dataclasses.replace(view.options, batch_axis=where[0]) if where else view.options


def normal_type(ck: RuleChecker, node: A.Call, args: Args, t: T.TensorT) -> tuple[T.TensorT, int | None] | None:
    """random_normal(like, mode, mean=0.0, std=1.0): a value of `like`'s type, a float tensor."""
    std = args[3]
    std_value = literal_number(std.value) if std is not None else None
    if std is not None and std_value is not None and std_value < 0:
        ck.error("E0310", f"`random_normal`'s std is at least 0, not {std_value}", std.span, "below 0",
                 "give `std=` a number of 0 or more")
        return None
    return T.TensorT(t.axes, t.dtype), None


def uniform_type(ck: RuleChecker, node: A.Call, args: Args, t: T.TensorT) -> tuple[T.TensorT, int | None] | None:
    """random_uniform(like, mode, low=0.0, high=1.0): a value of `like`'s type, a float tensor."""
    if not bounds_in_order(ck, "random_uniform", args[2], args[3], 0.0, strict=False):
        return None
    return T.TensorT(t.axes, t.dtype), None


def bernoulli_type(ck: RuleChecker, node: A.Call, args: Args, t: T.TensorT) -> tuple[T.TensorT, int | None] | None:
    """bernoulli(p, mode): a bool of p's axes, true with probability p."""
    return T.TensorT(t.axes, "bool"), None


def randint_type(ck: RuleChecker, node: A.Call, args: Args, t: T.TensorT) -> tuple[T.TensorT, int | None] | None:
    """randint(like, mode, low=0, high=): whole numbers of `like`'s axes, i64."""
    if args[3] is None:
        ck.error("E0206", "`randint` needs `high=`, one past the largest number it draws", node.span,
                 "missing high=", "write `randint(x, mode, high=10)`, or with `low=` too")
        return None
    if not bounds_in_order(ck, "randint", args[2], args[3], 0, strict=True):
        return None
    return T.TensorT(t.axes, "i64"), None


def categorical_type(ck: RuleChecker, node: A.Call, args: Args, t: T.TensorT) -> tuple[T.TensorT, int | None] | None:
    """categorical(probs, mode, over=V): an index along V of each distribution, `Index[V]`."""
    over = args[2]
    assert over is not None
    axis = over_axis(ck, over, t, "`categorical`")
    if axis is None:
        return None
    return T.TensorT(t.axes[:axis] + t.axes[axis + 1:], "i64", t.axes[axis].size), axis


register(
    drawn("random_normal", ("like", "mode", "mean", "std"), 2, normal_type, keywords=("mean", "std")),
    drawn("random_uniform", ("like", "mode", "low", "high"), 2, uniform_type, keywords=("low", "high")),
    drawn("bernoulli", ("p", "mode"), 2, bernoulli_type, first="`bernoulli`'s p"),
    drawn("randint", ("like", "mode", "low", "high"), 2, randint_type, floats=False, keywords=("low", "high"),
          whole=True),
    drawn("categorical", ("probs", "mode", "over"), 3, categorical_type),
)
