"""Operations made from dims' sizes: the causal mask, positions along a dim, and the first n
entries along an axis. A generic dim's size is read when the function runs, off the parameter
whose axis it is; so on several devices a size of the batch axis would be each device's part's,
and these ops are refused with it (E1801)."""

from __future__ import annotations

from ..names import similar
from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.options import FirstOptions, SizesOptions, SizeSource
from ..syntax import tree as A
from .args import literal_number, over_axis, tensor_arg
from .checking import RuleChecker, Use
from .table import Across, Args, CallView, LowerCall, Op, Typed, along_batch, register


def dim_source(ck: RuleChecker, node: A.Node) -> tuple[D.Dim, SizeSource | None] | None:
    """A dim named by `node`, and how to get its size when the program runs: an int, or
    (parameter, axis) for a generic dim that a parameter's shape gives."""
    if not isinstance(node, A.Name):
        ck.error("E0303", "expected a dim, as `causal(i, j)`", node.span, "not a dim name")
        return None
    if node.id in ck.dim_values and node.id not in ck.dims:  # declared: its size, or None until loaded
        return D.declared(node.id), ck.dim_values[node.id]
    dim = ck.dims.get(node.id)
    if dim is None:
        ck.error("E0303", f"`{node.id}` isn't a dim here", node.span, "unknown dim",
                 similar(node.id, list(ck.dims) + list(ck.dim_values)))
        return None
    for p in ck.params:
        t = p.ty
        axes = t.axes if isinstance(t, (T.TensorT, T.BatchT)) else ()
        for k, a in enumerate(axes):
            if a.size == dim:
                return dim, (p.name, "size" if isinstance(t, T.BatchT) else k)
    ck.error("E0303", f"the size of `{node.id}` isn't known here", node.span, "no parameter has this axis",
             f"take a parameter with an axis `{node.id}`")
    return None


def count_source(ck: RuleChecker, node: A.Node, what: str) -> tuple[D.Dim, SizeSource | None] | None:
    """A count given as a dim (`n`, its size read as `dim_source` reads it) or as a positive literal."""
    value = literal_number(node)
    if value is None:
        return dim_source(ck, node)
    if not isinstance(node, A.IntLit) or value <= 0:
        ck.error("E0310", f"{what} is a dim or a positive whole number, not {value}", node.span, "not a size")
        return None
    return D.literal(node.value), node.value


def causal_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[SizesOptions] | T.UnknownT:
    i_arg, j_arg = args
    assert i_arg is not None and j_arg is not None
    i, j = dim_source(ck, i_arg.value), dim_source(ck, j_arg.value)
    if i is None or j is None:
        return T.UNKNOWN
    ck.use(Use.TENSORS, node.span)
    return Typed(T.TensorT((T.axis(i[0]), T.axis(j[0])), "bool"), (), SizesOptions((i[1], j[1])))


def positions_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[SizesOptions] | T.UnknownT:
    """`positions(n)`: the positions 0, 1, ..., n-1 along a dim, `[n] Index[n]` (torch.arange)."""
    n = args[0]
    assert n is not None
    count = count_source(ck, n.value, "`positions`'s count")
    if count is None:
        return T.UNKNOWN
    ck.use(Use.TENSORS, node.span)
    return Typed(T.TensorT((T.axis(count[0]),), "i64", count[0]), (), SizesOptions((count[1],)))


def causal_lower(call: LowerCall[SizesOptions]) -> str:
    return f"_rt.causal({', '.join(call.size(s) for s in call.options.sizes)}, DEVICE)"


def positions_lower(call: LowerCall[SizesOptions]) -> str:
    return f"torch.arange({call.size(call.options.sizes[0])}, device=DEVICE)"


def first_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[FirstOptions] | T.UnknownT:
    """`first(x, n, over=T)`: x's first n entries along its axis T (its leading axis without `over=`),
    as a `[T D]` table of position embeddings is read for a sequence of n <= T tokens. n <= T is
    checked here when both sizes are known, and by the lowered call when it runs otherwise."""
    x, n, over = args
    assert x is not None and n is not None
    t = tensor_arg(ck, x, "`first`")
    count = count_source(ck, n.value, "`first`'s count")
    if t is None or count is None:
        return T.UNKNOWN
    if t.rank == 0:
        return ck.error("E0302", f"`first` takes entries along an axis, and {t.show()} has none",
                        x.span, f"this is {t.show()}")
    axis = over_axis(ck, over, t, "`first`") if over is not None else 0
    if axis is None:
        return T.UNKNOWN
    taken, (dim, source) = t.axes[axis], count
    have, want = D.value(taken.size, ck.dim_values), D.value(dim, ck.dim_values)
    if have is not None and want is not None and want > have:
        counted = str(want) if dim.is_Integer else f"{D.show(dim)} = {want}"
        return ck.error("E0310", f"`first` takes {counted} entries along {taken.show()}, which has {have}",
                        n.span, "too many", f"take at most {have}, or give {taken.show()} a size of at least {want}")
    return Typed(T.TensorT(t.axes[:axis] + (T.axis(dim),) + t.axes[axis + 1:], t.dtype, t.index), (x.expr,),
                 FirstOptions(axis=axis, sizes=(source,), names=(D.show(dim), taken.show())))


def first_lower(call: LowerCall[FirstOptions]) -> str:
    """The runtime checks the count against the axis, naming the call's .ss place."""
    return (f"_rt.first({call.args[0]}, {call.size(call.options.sizes[0])}, {call.options.axis}, "
            f"{call.literal(call.options.names)}, {call.where})")


def sized_by_batch(view: CallView[SizesOptions]) -> bool:
    """A size it reads is the batch's: on a device, that would be its part's."""
    return any(view.split_size(s) for s in view.options.sizes)


register(
    Op("causal", ("i", "j"), 2, causal_rule,
       causal_lower,
       Across(over_batch=sized_by_batch), check_rest=False),
    Op("positions", ("n",), 1, positions_rule,
       positions_lower,
       Across(over_batch=sized_by_batch), check_rest=False),
    Op("first", ("x", "n", "over"), 2, first_rule, first_lower,
       Across(over_batch=lambda view: sized_by_batch(view) or along_batch(view)), check_rest=False),
)
