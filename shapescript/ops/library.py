"""The standard library's other tensor operations, each value by itself: maximum and minimum,
clamp, where, masked_fill, `to` (a dtype conversion), one_hot, embedding lookups, and `valid` (the
mask of a padded batch's own positions)."""

from __future__ import annotations

from ..dtypes import DTYPES, ELEMENTS
from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.options import CallOptions, CastOptions, ClampOptions, LabelOptions, MaskOptions, OneHotOptions
from ..syntax import tree as A
from .args import broadcast, literal_number, number_arg, placed_within, tensor_arg
from .checking import RuleChecker, Use
from .table import LOCAL_LAYOUT, PER_EXAMPLE, Args, LowerCall, Op, Typed, register, typed


def _with_numbers(dtype: str, numbers: list[T.Ty]) -> str:
    """The dtype torch gives a tensor of `dtype` with these numbers (clamp's bounds, where's other
    branch): an integer or bool tensor with a float is f32, a bool tensor with an int is i64."""
    for t in numbers:
        if isinstance(t, T.ScalarT):
            dtype = T.promoted(dtype, t.kind, "+")
    return dtype


def pairwise(name: str) -> Op[CallOptions]:
    """maximum(a, b), minimum(a, b): broadcast by name, one dtype."""
    def rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[CallOptions] | T.UnknownT:
        a, b = (tensor_arg(ck, x, f"`{name}`") for x in args)
        if a is None or b is None:
            return T.UNKNOWN
        if a.dtype != b.dtype:
            return ck.error("E0308", f"`{name}` of {a.dtype} and {b.dtype}", node.span, "different dtypes")
        axes = broadcast(ck, node, a, b)
        if axes is None:
            return T.UNKNOWN
        return typed(T.TensorT(axes, a.dtype), tuple(x.expr for x in args if x is not None))

    def lower(call: LowerCall[CallOptions]) -> str:
        return f"torch.{name}({call.place(0, call.recipe.left)}, {call.place(1, call.recipe.right)})"

    return Op(name, ("a", "b"), 2, rule, lower, PER_EXAMPLE, layout=LOCAL_LAYOUT)


def clamp_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[ClampOptions] | T.UnknownT:
    x, low, high = args
    assert x is not None
    t = tensor_arg(ck, x, "`clamp`")
    ok = number_arg(ck, low, "`clamp`'s min") and number_arg(ck, high, "`clamp`'s max")
    if t is None or not ok:
        return T.UNKNOWN
    if low is None and high is None:
        return ck.error("E0206", "`clamp` needs `min=`, `max=` or both", node.span, "no bounds")
    given = [(name, a) for name, a in (("min", low), ("max", high)) if a is not None]
    bounds = [ck.type_of(a.value) or T.UNKNOWN for _, a in given]  # number_arg typed each
    return Typed(T.TensorT(t.axes, _with_numbers(t.dtype, bounds)), (x.expr,) + tuple(a.expr for _, a in given),
                 ClampOptions(tuple(name for name, _ in given)))


def clamp_lower(call: LowerCall[ClampOptions]) -> str:
    bounds = [f"{name}={text}" for name, text in zip(call.options.bounds, call.args[1:])]
    return f"torch.clamp({call.args[0]}, {', '.join(bounds)})"


def where_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[MaskOptions] | T.UnknownT:
    cond_arg, a_arg, b_arg = args
    assert cond_arg is not None and a_arg is not None and b_arg is not None
    cond = tensor_arg(ck, cond_arg, "`where`'s condition")
    a, b = ck.operand(a_arg.expr), ck.operand(b_arg.expr)
    if cond is None or T.UNKNOWN in (a, b):
        return T.UNKNOWN
    if cond.dtype != "bool":
        return ck.error("E0308", f"`where`'s condition must be bool, not {cond.dtype}", cond_arg.span,
                        f"this is {cond.show()}", "compare it first, as `x > 0`")
    values = (cond_arg.expr, a_arg.expr, b_arg.expr)
    tensors = [t for t in (a, b) if isinstance(t, T.TensorT)]
    if not tensors:  # two numbers: a tensor of the condition's shape
        dtype = "f32" if T.FLOAT in (a, b) else "bool" if a == b == T.BOOL else "i64"
        return Typed(T.TensorT(cond.axes, dtype), values, MaskOptions(()))
    if len(tensors) == 1 and T.FLOAT in (a, b) and not tensors[0].is_float:
        return ck.error("E0308", f"`where` chooses between {tensors[0].dtype} and a float", node.span,
                        "different dtypes", "write the number as an integer, or convert the tensor")
    if len(tensors) == 2 and isinstance(a, T.TensorT) and isinstance(b, T.TensorT) and (
            a.dtype != b.dtype or a.rank != b.rank or not all(x.same(y) for x, y in zip(a.axes, b.axes))):
        return ck.error("E0301", f"`where` chooses between {a.show()} and {b.show()}, which must be the same",
                        node.span, "different types")
    result = tensors[0]
    index = placed_within(ck, cond_arg, result, cond, "the condition")
    if index is None:
        return T.UNKNOWN
    return Typed(T.TensorT(result.axes, _with_numbers(result.dtype, [a, b])), values, MaskOptions(index))


def where_lower(call: LowerCall[MaskOptions]) -> str:
    return f"torch.where({call.place(0, call.options.mask_index)}, {call.args[1]}, {call.args[2]})"


def masked_fill_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[MaskOptions] | T.UnknownT:
    x_arg, mask_arg, value = args
    assert x_arg is not None and mask_arg is not None and value is not None
    x = tensor_arg(ck, x_arg, "`masked_fill`")
    mask = tensor_arg(ck, mask_arg, "`masked_fill`'s mask")
    if not number_arg(ck, value, "the fill value") or x is None or mask is None:
        return T.UNKNOWN
    if mask.dtype != "bool":
        return ck.error("E0308", f"a mask is bool, not {mask.dtype}", mask_arg.span, f"this is {mask.show()}")
    fill, largest = literal_number(value.value), ELEMENTS[x.dtype].largest
    if fill is not None and not -largest <= fill <= largest:
        return ck.error("E0401", f"the fill value {fill:g} doesn't fit {x.dtype}, whose values lie within "
                        f"±{largest:g}", value.span, f"too large for {x.dtype}",
                        "fill with a value that fits, as -1e4 for f16, or convert first, as `to(x, f32)`")
    index = placed_within(ck, mask_arg, x, mask, "the mask")
    if index is None:
        return T.UNKNOWN
    return Typed(T.TensorT(x.axes, x.dtype), (x_arg.expr, mask_arg.expr, value.expr), MaskOptions(index))


def masked_fill_lower(call: LowerCall[MaskOptions]) -> str:
    return f"{call.wrapped[0]}.masked_fill({call.place(1, call.options.mask_index)}, {call.args[2]})"


def to_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[CastOptions] | T.UnknownT:
    """`to(x, f32)`: the same tensor with another dtype, value by value (torch's `.to`); an `Index`
    bound doesn't survive, since nothing is known of the values' range after a conversion.
    `to(0.0, f32)`: a number as a `[]` tensor, as a loop's running total starts."""
    x, dtype_arg = args
    assert x is not None and dtype_arg is not None
    t = ck.operand(x.expr)  # a tensor or a number; anything else is reported
    dtype = dtype_arg.value
    if not (isinstance(dtype, A.Name) and dtype.id in DTYPES):
        return ck.error("E0401", "`to` takes a dtype second, as `to(x, f32)`", dtype_arg.span,
                        "not a dtype", f"the dtypes: {', '.join(DTYPES)}")
    if isinstance(t, T.ScalarT):
        ck.use(Use.TENSORS, x.span)
        return Typed(T.TensorT((), dtype.id), (x.expr,), CastOptions(dtype.id, number=True))
    if not isinstance(t, T.TensorT):
        return T.UNKNOWN
    return Typed(T.TensorT(t.axes, dtype.id), (x.expr,), CastOptions(dtype.id))


def to_lower(call: LowerCall[CastOptions]) -> str:
    assert call.options.dtype is not None  # the rule records the dtype converted to
    dtype = f"torch.{ELEMENTS[call.options.dtype].torch}"
    if call.options.number:
        return f"torch.tensor({call.args[0]}, dtype={dtype}, device=DEVICE)"
    return f"{call.wrapped[0]}.to({dtype})"


def one_hot_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[OneHotOptions] | T.UnknownT:
    labels = args[0]
    assert labels is not None
    t = tensor_arg(ck, labels, "`one_hot`")
    if t is None:
        return T.UNKNOWN
    count = D.value(t.index, ck.dim_values) if t.index is not None else None
    if count is None or t.index is None:
        return ck.error("E0309", f"`one_hot` takes labels typed `Index[C]` with a declared C, not {t.show()}",
                        labels.span, "no known bound")
    return Typed(T.TensorT(t.axes + (T.axis(t.index),), ck.precision), (labels.expr,), OneHotOptions(count, ck.precision))


def one_hot_lower(call: LowerCall[OneHotOptions]) -> str:
    return f"_F.one_hot({call.args[0]}, {call.options.classes}).to(torch.{ELEMENTS[call.options.dtype].torch})"


def embedding_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[CallOptions] | T.UnknownT:
    table_arg, ids_arg = args
    assert table_arg is not None and ids_arg is not None
    table = tensor_arg(ck, table_arg, "`embedding`", floats=True)
    ids = tensor_arg(ck, ids_arg, "`embedding`'s ids")
    if table is None or ids is None:
        return T.UNKNOWN
    if table.rank != 2:
        return ck.error("E0302", f"an embedding table has two axes, [V D], not {table.show()}", table_arg.span)
    if ids.index is None or not D.equal(ids.index, table.axes[0].size):
        return ck.error("E0309", f"the ids must be `Index[{table.axes[0].show()}]`, the table's rows, but are "
                        f"{ids.show()}", ids_arg.span, "not known to be in range")
    return typed(T.TensorT(ids.axes + table.axes[1:], table.dtype), (table_arg.expr, ids_arg.expr))


def valid_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[LabelOptions] | T.UnknownT:
    """`valid(batch, n)`: true at the positions along `n` that hold an item's own values, false at
    the padding the loader added to reach the batch's longest item."""
    batch_arg, dim_arg = args
    assert batch_arg is not None and dim_arg is not None
    batch = ck.expr(batch_arg.expr)
    if not isinstance(batch, T.BatchT):
        return batch if batch is T.UNKNOWN else ck.error(
            "E0401", f"`valid` takes a batch, not {batch.show()}", batch_arg.span, f"this is {batch.show()}")
    name = dim_arg.value
    dim = ck.dims.get(name.id) if isinstance(name, A.Name) else None
    label = next((n for n, d in batch.padded if dim is not None and d == dim), None)
    if label is None or dim is None:
        padded = ", ".join(n for n, _ in batch.padded) or "none"
        return ck.error("E0303", f"`valid` takes a dim the batch pads; {batch.data.name}'s are: {padded}",
                        dim_arg.span, "not a padded dim",
                        "a data type's generic dims, as `n` in `tokens: [n]`, are padded per batch")
    ck.use(Use.TENSORS, node.span)
    return Typed(T.TensorT(batch.axes + (T.axis(dim),), "bool"), (batch_arg.expr,), LabelOptions(label))


def valid_lower(call: LowerCall[LabelOptions]) -> str:
    return f"_rt.valid({call.args[0]}, {call.literal(call.options.label)})"


register(
    pairwise("maximum"),
    pairwise("minimum"),
    Op("clamp", ("x", "min", "max"), 1, clamp_rule, clamp_lower, PER_EXAMPLE, layout=LOCAL_LAYOUT),
    Op("where", ("cond", "a", "b"), 3, where_rule, where_lower, PER_EXAMPLE, layout=LOCAL_LAYOUT),
    Op("masked_fill", ("x", "mask", "value"), 3, masked_fill_rule, masked_fill_lower, PER_EXAMPLE,
       layout=LOCAL_LAYOUT),
    Op("to", ("x", "dtype"), 2, to_rule, to_lower, PER_EXAMPLE, layout=LOCAL_LAYOUT),
    Op("one_hot", ("labels",), 1, one_hot_rule,
       one_hot_lower, PER_EXAMPLE),
    Op("embedding", ("table", "ids"), 2, embedding_rule,
       lambda call: f"_F.embedding({call.args[1]}, {call.args[0]})", PER_EXAMPLE),
    Op("valid", ("batch", "dim"), 2, valid_rule,
       valid_lower, PER_EXAMPLE),
)
