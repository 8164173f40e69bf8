"""`range`, what a counted loop goes through: `for k in range(K):` runs its body K times with k = 0,
1, ..., K - 1, and `range(a, b)` counts from a to b - 1, as Python's. The bounds are whole numbers
(literals, dims, int parameters, arithmetic on them); where both are literals or dims the checker
knows the count, so the DeviceTable multiplies the loop's collectives by it and a value that grows by
a fixed size each pass has a known size after the loop (check/bodies.py). Nothing in it is split
across the devices: each device counts the same."""

from __future__ import annotations

from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.options import NO_OPTIONS, CallOptions
from ..syntax import tree as A
from .args import int_arg, literal_number
from .checking import RuleChecker
from .table import PER_EXAMPLE, Args, LowerCall, Op, Typed, register


def known_count(ck: RuleChecker, node: A.Node) -> D.Dim | None:
    """A bound the checker knows: a whole-number literal or a dim's name (None: only the run knows)."""
    value = literal_number(node)
    if value is not None:
        return D.literal(value) if isinstance(value, int) else None
    if isinstance(node, A.Name):
        if node.id in ck.dims:
            return ck.dims[node.id]
        if node.id in ck.dim_values:
            return D.declared(node.id)
    return None


def range_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[CallOptions] | T.UnknownT:
    first, second = args
    assert first is not None
    if not all(int_arg(ck, a, "a bound of `range`") for a in (first, second)):
        return T.UNKNOWN
    stop = known_count(ck, (second or first).value)
    start = D.literal(0) if second is None else known_count(ck, first.value)
    if stop is None or start is None:
        return Typed(T.RangeT(None), tuple(a.expr for a in (first, second) if a is not None), NO_OPTIONS)
    count = stop - start
    if count.is_Integer and int(count) < 0:
        return ck.error("E0310", f"`range` from {D.show(start)} to {D.show(stop)} counts backwards", node.span,
                        "no passes", "a range counts up: `range(a, b)` with a <= b")
    return Typed(T.RangeT(count), tuple(a.expr for a in (first, second) if a is not None), NO_OPTIONS)


def range_lower(call: LowerCall[CallOptions]) -> str:
    return f"range({', '.join(call.args)})"


register(Op("range", ("start", "stop"), 1, range_rule, range_lower, PER_EXAMPLE))
