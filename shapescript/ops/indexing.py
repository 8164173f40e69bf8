"""Picking along one axis: topk, gather, scatter. Refused along the batch axis on several devices
(each device would pick from its own part)."""

from __future__ import annotations

from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.options import AxisOptions, TopKOptions
from ..syntax import tree as A
from .args import int_arg, over_axis, tensor_arg
from .checking import RuleChecker
from .elementwise import refused_dtype
from .table import Across, Args, LowerCall, Op, Typed, along_batch, register


def topk_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[TopKOptions] | T.UnknownT:
    x, k, over = args
    assert x is not None and k is not None and over is not None
    t = tensor_arg(ck, x, "`topk`")
    k_node = k.value
    # k: a positive literal, or a declared dim whose size the check knows (its name is the result's axis)
    declared = isinstance(k_node, A.Name) and k_node.id in ck.dim_values and k_node.id not in ck.dims
    count = ck.dim_values.get(k_node.id) if isinstance(k_node, A.Name) and declared else \
        k_node.value if isinstance(k_node, A.IntLit) else None
    if count is None or count <= 0:
        int_arg(ck, k, "`topk`'s k")
        return ck.error("E0310", "`topk`'s k is a positive literal or a declared dim of known size, as "
                        "`topk(x, 5, over=C)`", k.span)
    if t is None or refused_dtype(ck, "topk", x, t):
        return T.UNKNOWN
    axis = over_axis(ck, over, t, "`topk`")
    if axis is None:
        return T.UNKNOWN
    picked = t.axes[axis]
    size = D.value(picked.size, ck.dim_values)
    if size is not None and count > size:
        return ck.error("E0310", f"`topk` of {count} from {picked.show()} = {size}", k.span, "too many")
    kept = D.declared(k_node.id) if isinstance(k_node, A.Name) else D.literal(count)
    axes = t.axes[:axis] + (T.axis(kept),) + t.axes[axis + 1:]
    result = T.TupleT((T.TensorT(axes, t.dtype), T.TensorT(axes, "i64", picked.size)))
    # An axis of unknown size is checked as the program runs (`label`: the axis as the error names it).
    return Typed(result, (x.expr,), TopKOptions(axis=axis, k=count, label=picked.show() if size is None else None))


def topk_lower(call: LowerCall[TopKOptions]) -> str:
    if call.options.label is not None:
        return (f"_rt.topk({call.args[0]}, {call.options.k}, {call.options.axis}, {call.literal(call.options.label)}, "
                f"{call.where})")
    return f"tuple(torch.topk({call.args[0]}, {call.options.k}, dim={call.options.axis}))"


def picking(name: str) -> Op[AxisOptions]:
    """gather(x, index, over=C): x's values at `index` along C; scatter(x, index, src, over=C): x
    with `src` written at `index` along C."""
    def rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[AxisOptions] | T.UnknownT:
        x_arg, index_arg, over = args[0], args[1], args[-1]
        assert x_arg is not None and index_arg is not None and over is not None
        src_arg = args[2] if name == "scatter" else None
        x = tensor_arg(ck, x_arg, f"`{name}`")
        idx = tensor_arg(ck, index_arg, f"`{name}`'s index")
        src = tensor_arg(ck, src_arg, f"`{name}`'s src") if src_arg is not None else None
        if x is None or idx is None or (name == "scatter" and src is None):
            return T.UNKNOWN
        axis = over_axis(ck, over, x, f"`{name}`")
        if axis is None:
            return T.UNKNOWN
        picked = x.axes[axis]
        if idx.index is None or not D.equal(idx.index, picked.size):
            return ck.error("E0309", f"`{name}`'s index must be `Index[{picked.show()}]`, but is {idx.show()}",
                            index_arg.span, "not known to be in range")
        others_x = x.axes[:axis] + x.axes[axis + 1:]
        others_i = idx.axes[:axis] + idx.axes[axis + 1:] if idx.rank == x.rank else None
        if others_i is None or not all(a.same(b) for a, b in zip(others_x, others_i)):
            return ck.error("E0301", f"`{name}`'s index must be {x.show()} but for its {picked.show()} axis; it is "
                            f"{idx.show()}", index_arg.span, f"this is {idx.show()}")
        if src is not None and src_arg is not None and (
                src.dtype != x.dtype or src.rank != idx.rank or not all(a.same(b) for a, b in zip(src.axes, idx.axes))):
            return ck.error("E0301", f"`scatter`'s src must be {T.TensorT(idx.axes, x.dtype).show()}, like the index",
                            src_arg.span, f"this is {src.show()}")
        result = T.TensorT(idx.axes, x.dtype) if name == "gather" else T.TensorT(x.axes, x.dtype)
        return Typed(result, tuple(a.expr for a in args[:-1] if a is not None), AxisOptions(axis=axis))

    def lower(call: LowerCall[AxisOptions]) -> str:
        rest = ", ".join(call.args[1:])
        return f"torch.{name}({call.args[0]}, {call.options.axis}, {rest})"

    params = ("x", "index", "over") if name == "gather" else ("x", "index", "src", "over")
    return Op(name, params, len(params), rule, lower, Across(over_batch=along_batch))


register(
    Op("topk", ("x", "k", "over"), 3, topk_rule, topk_lower, Across[TopKOptions](over_batch=along_batch), refused_dtypes=("bool",)),
    picking("gather"),
    picking("scatter"),
)
