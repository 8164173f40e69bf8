"""What the op table's typing rules share: the checks of their arguments (a tensor, a number, an
axis named by `over=`), how operands broadcast and `@` contracts, and the place of a secondary
label. Each takes the checker as a `RuleChecker`, the narrow view a rule has of it."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import Span
from ..names import similar
from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.options import Recipe
from ..syntax import tree as A
from .checking import Label, RuleChecker, Use


def labels(*found: Label | None) -> tuple[Label, ...]:
    """The labels that were found, each place once."""
    out: dict[Span, str] = {}
    for item in found:
        if item is not None and item[0] not in out:
            out[item[0]] = item[1]
    return tuple(out.items())


def same_value(ck: RuleChecker, a: T.AxisT, b: T.AxisT) -> bool:
    va, vb = D.value(a.size, ck.dim_values), D.value(b.size, ck.dim_values)
    return va is not None and va == vb


# ---- operators -------------------------------------------------------------------------------

def broadcast(ck: RuleChecker, node: A.Node, left: T.TensorT, right: T.TensorT) -> tuple[T.AxisT, ...] | None:
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
                 secondary=labels(ck.type_label(node.left, left), ck.type_label(node.right, right))
                 if isinstance(node, A.Binary) else ())
        return None
    if positions != list(range(big.rank - small.rank, big.rank)):
        index = tuple(":" if k in positions else None for k in range(big.rank))
        ck.set_recipe(node, Recipe(right=index) if small is right else Recipe(left=index))
    return big.axes


def placed_within(ck: RuleChecker, node: A.Node, big: T.TensorT, small: T.TensorT, what: str
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


def matmul(ck: RuleChecker, node: A.Node, left: T.Ty, right: T.Ty, lnode: A.Node, rnode: A.Node) -> T.Ty:
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
                        "dims match by name, never by size" if same_value(ck, a, b) else "",
                        secondary=labels(ck.axis_label(lnode, left, -1, "last axis"),
                                         ck.axis_label(rnode, right, 0, "first axis")))
    ck.set_recipe(node, Recipe(tensordot=right.rank > 2))
    return T.TensorT(left.axes[:-1] + right.axes[1:], left.dtype)


# ---- argument helpers ------------------------------------------------------------------------

def tensor_arg(ck: RuleChecker, arg: A.Arg | None, what: str, floats: bool = False) -> T.TensorT | None:
    if arg is None:
        return None
    t = ck.expr(arg.expr)
    if isinstance(t, T.TensorT):
        ck.use(Use.TENSORS, arg.span)
        if floats and not t.is_float:
            ck.error("E0308", f"{what} takes float tensors, not {t.dtype}", arg.span, f"this is {t.show()}",
                     ck.cast_help(arg.value, "f32"))
            return None
        return t
    if t is not T.UNKNOWN:
        ck.error("E0401", f"{what} takes a tensor, not {t.show()}", arg.span, f"this is {t.show()}")
    return None


def over_axis(ck: RuleChecker, arg: A.Arg, t: T.TensorT, what: str) -> int | None:
    """The index of the axis named by `over=NAME` in `t`."""
    node = arg.value
    if not isinstance(node, A.Name):
        ck.error("E0303", "`over=` names a dim, as `over=D`", arg.span, "not a dim name")
        return None
    dim = ck.dims.get(node.id)
    if dim is None and node.id in ck.dim_values:
        dim = D.declared(node.id)
    if dim is None:
        known = sorted(set(ck.dims) | set(ck.dim_values))
        ck.error("E0303", f"`{node.id}` isn't a dim", node.span, "unknown dim",
                 similar(node.id, [a.show() for a in t.axes] + known) or f"dims here: {', '.join(known)}")
        return None
    hits = [k for k, a in enumerate(t.axes) if D.equal(a.size, dim)] or grown_from(ck, t, dim)
    if not hits:
        ck.error("E0303", f"{what} over {node.id}, but {t.show()} has no axis {node.id}", node.span,
                 f"not an axis of {t.show()}", f"name one of its axes: {', '.join(a.show() for a in t.axes)}")
        return None
    if len(hits) > 1:
        ck.error("E0303", f"{t.show()} has {node.id} twice, so `over={node.id}` is ambiguous", node.span,
                 "which one?", "rearrange it so the axes have different names")
        return None
    return hits[0]


def grown_from(ck: RuleChecker, t: T.TensorT, dim: D.Dim) -> list[int]:
    """The axes of `t` that are `dim` grown by whole sizes, or cut from it: `n+1` after a `cat`, `n+i`
    in a loop that appends, `min(n,T)` after `last` (`over=n` names them where no axis is `n` itself)."""
    def base(size: D.Dim) -> D.Dim:
        return D.expand_derived(D.substitute(size, ck.grown)) if ck.grown else D.expand_derived(size)
    return [k for k, a in enumerate(t.axes) if (base(a.size) - D.expand_derived(dim)).is_Integer]


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


def int_arg(ck: RuleChecker, arg: A.Arg | None, what: str) -> bool:
    if arg is None:
        return True
    t = ck.expr(arg.expr)
    if t == T.INT or t is T.UNKNOWN:
        return True
    ck.error("E0401", f"{what} is a whole number, not {t.show()}", arg.span, f"this is {t.show()}")
    return False


def number_arg(ck: RuleChecker, arg: A.Arg | None, what: str) -> bool:
    """A plain number (int or float), or absent; E0401 otherwise."""
    if arg is None:
        return True
    t = ck.expr(arg.expr)
    if t in (T.INT, T.FLOAT) or t is T.UNKNOWN:
        return True
    ck.error("E0401", f"{what} is a number, not {t.show()}", arg.span, f"this is {t.show()}")
    return False


def keyword_numbers(ck: RuleChecker, name: str, keywords: tuple[str, ...], given: Sequence[A.Arg | None],
                    whole: bool = False, at_least_zero: bool = False) -> tuple[str, ...] | None:
    """The keyword numbers given (`beta=`, `mean=`, `low=`...), each a plain number (`whole`: a whole
    one; `at_least_zero`: not below 0 where it is written as a number, E0310); their names, or None
    after an error."""
    out: list[str] = []
    for keyword, arg in zip(keywords, given):
        if arg is None:
            continue
        what = f"`{name}`'s {keyword}"
        if not (int_arg(ck, arg, what) if whole else number_arg(ck, arg, what)):
            return None
        value = literal_number(arg.value) if at_least_zero else None
        if value is not None and value < 0:
            ck.error("E0310", f"{what} is at least 0, not {value}", arg.span, "below 0",
                     f"give `{keyword}=` a number of 0 or more")
            return None
        out.append(keyword)
    return tuple(out)


def _unused_args(ck: RuleChecker, node: A.Call) -> T.UnknownT:
    for a in node.args:
        if not isinstance(a.value, A.Pattern) and ck.type_of(a.value) is None:
            ck.expr(a.value)
    return T.UNKNOWN
