"""Reductions (sum, mean, max, ..., argmax) and operations along one axis (softmax, cumsum, sort).

On several devices a reduction over the batch axis combines every device's part: `sum` by a sum of
the parts, `mean` by a sum of the parts and of their counts; the others are refused there (E1801).
"""

from __future__ import annotations

from ..shapes import value_types as T
from ..shapes.options import AxisOptions, Placing
from ..syntax import tree as A
from .args import over_axis, placed_within, tensor_arg
from .checking import RuleChecker
from .elementwise import refused_dtype
from .table import (
    OPS,
    OWN,
    PARTIAL,
    Across,
    Args,
    Autocast,
    CallView,
    Layout,
    LowerCall,
    Op,
    Payload,
    Typed,
    along_batch,
    heads_along,
    numel,
    reduces_batch,
    register,
    result_values,
)


def widened(name: str, dtype: str) -> str:
    """The dtype of op `name`'s result of a `dtype` tensor: i64 for a bool or i32 one where the op
    widens (its entry's `widens`: sum, prod, cumsum)."""
    return "i64" if OPS[name].widens and dtype in ("bool", "i32") else dtype


def mask_of(ck: RuleChecker, arg: A.Arg, t: T.TensorT) -> Placing | None:
    """A `mask=` argument: bool, its dims among `t`'s; the index that places it."""
    mask = tensor_arg(ck, arg, "`mask=`")
    if mask is None:
        return None
    if mask.dtype != "bool":
        ck.error("E0308", f"a mask is bool, not {mask.dtype}", arg.span, f"this is {mask.show()}",
                 "compare it first, or use `valid(batch, n)`")
        return None
    return placed_within(ck, arg, t, mask, "the mask")


def reduction(name: str, torch_fn: str, result: str, maskable: bool = False, needs_dims: bool = False,
              autocast: Autocast = Autocast.FOLLOW,
              across: Across[AxisOptions] | None = None, widens: bool = False, refused: tuple[str, ...] = ()) -> Op[AxisOptions]:
    """`name(x, over=D)`, or over everything without `over=`. `result`: the result's dtype, "same"
    as x's (widened for sum and prod), "float" (x must be float), "bool" (x must be bool) or
    "index" (an `Index` into the axis, which `over=` must then name). `needs_dims`: torch's
    function needs `dim=` even to reduce everything."""
    def rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[AxisOptions] | T.UnknownT:
        x, over = args[0], args[1]
        assert x is not None
        t = tensor_arg(ck, x, f"`{name}`", floats=result == "float")
        if t is None or refused_dtype(ck, name, x, t):
            return T.UNKNOWN
        if result == "bool" and t.dtype != "bool":
            return ck.error("E0308", f"`{name}` takes a bool tensor, not {t.dtype}", x.span,
                            f"this is {t.show()}", "compare it first, as `x > 0`")
        axis = None
        if over is not None:
            axis = over_axis(ck, over, t, f"`{name}`")
            if axis is None:
                return T.UNKNOWN
        elif result == "index":
            return ck.error("E0206", f"`{name}` needs `over=`, the axis it picks from", node.span,
                            "missing over=", f"write `{name}(x, over=C)`")
        mask = args[2] if maskable else None
        mask_index = None
        if mask is not None:
            mask_index = mask_of(ck, mask, t)
            if mask_index is None:
                return T.UNKNOWN
        lowered = (x.expr,) + ((mask.expr,) if mask is not None else ())
        options = AxisOptions(axis=axis, rank=t.rank, mask_index=mask_index)
        axes = t.axes[:axis] + t.axes[axis + 1:] if axis is not None else ()
        if result == "index":
            assert axis is not None  # refused above without `over=`
            return Typed(T.TensorT(axes, "i64", t.axes[axis].size), lowered, options)
        dtype = "bool" if result == "bool" else t.dtype
        return Typed(T.TensorT(axes, widened(name, dtype)), lowered, options)

    def lower(call: LowerCall[AxisOptions]) -> str:
        axis, x = call.options.axis, call.args[0]
        if call.options.mask_index is not None:
            return f"_rt.masked_{name}({x}, {call.place(1, call.options.mask_index)}, {axis})"
        if axis is None and needs_dims:
            assert call.options.rank is not None  # the rule records the operand's rank
            return f"{torch_fn}({x}, dim={tuple(range(call.options.rank))!r})"
        return f"{torch_fn}({x}{'' if axis is None else f', dim={axis}'})"

    params = ("x", "over", "mask") if maskable else ("x", "over")
    return Op(name, params, 1, rule, lower, across or Across(over_batch=reduces_batch),
              layout=Layout(heads=heads_along(sums=name == "sum")), refused_dtypes=refused, widens=widens,
              autocast=autocast)


def all_mean(call: LowerCall[AxisOptions]) -> str:
    """The mean of the whole batch: every device's sum and count, added up."""
    axis, x = call.options.axis, call.args[0]
    if call.options.mask_index is not None:
        return f"_rt.all_masked_mean({x}, {call.place(1, call.options.mask_index)}, {axis}, {call.where})"
    return f"_rt.all_mean({x}, {axis}, {call.where})"


def mean_payload(view: CallView[AxisOptions]) -> Payload:
    """The sums and one count, or with a mask a count per value."""
    assert isinstance(view.result, T.TensorT)
    values = numel(view.result)
    return Payload("`mean`'s sum and count",
                   2 * values if view.options.mask_index is not None else values + 1, view.result.dtype)


def along_axis(name: str, template: str, floats: bool = False, widens: bool = False,
               autocast: Autocast = Autocast.FOLLOW) -> Op[AxisOptions]:
    """`name(x, over=D)`: x's type (cumsum widens as sum does), computed along D."""
    def rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[AxisOptions] | T.UnknownT:
        x, over = args
        assert x is not None and over is not None
        t = tensor_arg(ck, x, f"`{name}`", floats=floats)
        if t is None:
            return T.UNKNOWN
        axis = over_axis(ck, over, t, f"`{name}`")
        if axis is None:
            return T.UNKNOWN
        return Typed(T.TensorT(t.axes, widened(name, t.dtype)), (x.expr,), AxisOptions(axis=axis))

    def lower(call: LowerCall[AxisOptions]) -> str:
        return template.format(x=call.args[0], axis=call.options.axis)

    return Op(name, ("x", "over"), 2, rule, lower, Across(over_batch=along_batch),
              layout=Layout(heads=heads_along(sums=False)), widens=widens, autocast=autocast)


register(
    reduction("sum", "torch.sum", "same", maskable=True, widens=True, autocast=Autocast.FP32_ON_CUDA, across=Across(
        reduces_batch, PARTIAL, payload=result_values("`sum`'s partial sums, every device's part of the batch added up"))),
    reduction("mean", "torch.mean", "float", maskable=True,
              across=Across(reduces_batch, OWN, all_mean, mean_payload)),
    reduction("max", "torch.amax", "same", needs_dims=True),
    reduction("min", "torch.amin", "same", needs_dims=True),
    reduction("prod", "torch.prod", "same", widens=True, autocast=Autocast.FP32),
    reduction("logsumexp", "torch.logsumexp", "float", needs_dims=True),
    reduction("std", "torch.std", "float"),
    reduction("var", "torch.var", "float"),
    reduction("argmax", "torch.argmax", "index", refused=("bool",)),
    reduction("argmin", "torch.argmin", "index", refused=("bool",)),
    reduction("any", "torch.any", "bool"),
    reduction("all", "torch.all", "bool"),
    along_axis("softmax", "torch.softmax({x}, dim={axis})", floats=True, autocast=Autocast.FP32_ON_CUDA),
    along_axis("log_softmax", "torch.log_softmax({x}, dim={axis})", floats=True, autocast=Autocast.FP32_ON_CUDA),
    along_axis("cumsum", "torch.cumsum({x}, dim={axis})", widens=True, autocast=Autocast.FP32_ON_CUDA),
    along_axis("sort", "torch.sort({x}, dim={axis}).values"),
)
