"""Losses that compare a value with a target of its own type, mse_loss, l1_loss, smooth_l1_loss,
binary_cross_entropy_with_logits and kl_div, and cosine_similarity, which compares two values
along one axis.

Each loss is the mean over its operand's values (kl_div: over its distributions), a `[]`. On
several devices a loss whose operand has the batch axis is the mean over the whole batch: every
device's sum of losses and their count, added up in one all-reduce, as cross_entropy's (and
kl_div over the batch axis itself sums each distribution's parts first). cosine_similarity works
on each example by itself; along the batch axis it is refused there (E1801), as softmax is.
"""

from __future__ import annotations

import dataclasses

import sympy

from ..shapes import value_types as T
from ..shapes.options import LossOptions
from ..syntax import tree as A
from .args import keyword_numbers, labels, over_axis, tensor_arg
from .checking import RuleChecker
from .losses import NONE, all_mean_loss, first_split, mean_loss, sum_and_count
from .reductions import mask_of
from .table import (
    OWN,
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
    register,
)


def paired(ck: RuleChecker, name: str, x_arg: A.Arg | None, y_arg: A.Arg | None, second: str,
           ) -> tuple[T.TensorT, T.TensorT] | None:
    """Two float tensors of one type, `name`'s first argument and its `second` (the target): both,
    or None after an error."""
    x = tensor_arg(ck, x_arg, f"`{name}`", floats=True)
    y = tensor_arg(ck, y_arg, f"`{name}`'s {second}", floats=True)
    if x is None or y is None or x_arg is None or y_arg is None:
        return None
    if x.dtype != y.dtype:
        ck.error("E0308", f"`{name}` of {x.dtype} and {y.dtype}: its {second} must have the first argument's dtype",
                 y_arg.span, f"this is {y.show()}", ck.cast_help(y_arg.value, x.dtype))
        return None
    if x.rank != y.rank or not all(a.same(b) for a, b in zip(x.axes, y.axes)):
        ck.error("E0301", f"`{name}`'s {second} must be {x.show()}, its first argument's type, but is "
                 f"{y.show()}", y_arg.span, f"this is {y.show()}",
                 f"the {second} holds one value per value of the first argument, on the same axes in the same order",
                 "rearrange one side first if its axes are in another order",
                 secondary=labels(ck.type_label(x_arg.value, x), ck.type_label(y_arg.value, y)))
        return None
    return x, y


def _keyword_text(call: LowerCall[LossOptions]) -> str:
    """The keyword numbers as torch takes them, after the two tensors: `, beta=0.5`."""
    return "".join(f", {k}={text}" for k, text in zip(call.options.keywords, call.args[2:]))


def _mask_at(call: LowerCall[LossOptions]) -> int:
    """The mask's place among the arguments: after the tensors and the keyword numbers."""
    return 2 + len(call.options.keywords)


def pointwise_loss(name: str, torch_fn: str, keywords: tuple[str, ...] = ()) -> Op[LossOptions]:
    """`name(x, target, keywords..., mask=)`: torch's loss of each value of x against the target's,
    averaged over the values (where the mask holds); `[]`, x's dtype."""
    def rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[LossOptions] | T.UnknownT:
        x_arg, target_arg, mask = args[0], args[1], args[-1]
        pair = paired(ck, name, x_arg, target_arg, "target")
        given = keyword_numbers(ck, name, keywords, args[2:-1], at_least_zero=True)
        if pair is None or given is None or x_arg is None or target_arg is None:
            return T.UNKNOWN
        x = pair[0]
        mask_index = None
        if mask is not None:
            mask_index = mask_of(ck, mask, x)
            if mask_index is None:
                return T.UNKNOWN
        numbers = tuple(a.expr for a in args[2:-1] if a is not None)
        lowered = (x_arg.expr, target_arg.expr) + numbers + ((mask.expr,) if mask is not None else ())
        return Typed(T.TensorT((), x.dtype), lowered, LossOptions(mask_index=mask_index, keywords=given))

    def losses(call: LowerCall[LossOptions], reduction: str = "") -> str:
        return f"{torch_fn}({call.args[0]}, {call.args[1]}{_keyword_text(call)}{reduction})"

    def lower(call: LowerCall[LossOptions]) -> str:
        if call.options.mask_index is None:
            return losses(call)  # torch's own mean
        return mean_loss(losses(call, f", {NONE}"), call, _mask_at(call))

    def all_lower(call: LowerCall[LossOptions]) -> str:
        return all_mean_loss(losses(call, f", {NONE}"), call, _mask_at(call))

    return Op(name, ("x", "target", *keywords, "mask"), 2, rule, lower,
              Across(first_split, OWN, all_lower, sum_and_count(name)), autocast=Autocast.FP32)


def kl_div_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[LossOptions] | T.UnknownT:
    """`kl_div(logp, target, over=C, mask=)`: log-probabilities and target probabilities of one
    type, distributions along C; the mean over the distributions of each one's divergence."""
    logp_arg, target_arg, over, mask = args
    assert logp_arg is not None and target_arg is not None and over is not None
    pair = paired(ck, "kl_div", logp_arg, target_arg, "target")
    if pair is None:
        return T.UNKNOWN
    logp = pair[0]
    axis = over_axis(ck, over, logp, "`kl_div`")
    if axis is None:
        return T.UNKNOWN
    mask_index = None
    if mask is not None:
        mask_index = mask_of(ck, mask, T.TensorT(logp.axes[:axis] + logp.axes[axis + 1:], logp.dtype))
        if mask_index is None:
            return T.UNKNOWN
    lowered = (logp_arg.expr, target_arg.expr) + ((mask.expr,) if mask is not None else ())
    return Typed(T.TensorT((), logp.dtype), lowered, LossOptions(axis=axis, rank=logp.rank, mask_index=mask_index))


def _divergences(call: LowerCall[LossOptions]) -> str:
    """Each distribution's divergence: torch's terms, summed along the distributions' axis."""
    return f"_F.kl_div({call.args[0]}, {call.args[1]}, {NONE}).sum({call.options.axis})"


def kl_div_lower(call: LowerCall[LossOptions]) -> str:
    return mean_loss(_divergences(call), call, 2)


def all_kl_div(call: LowerCall[LossOptions]) -> str:
    """The distributions split across the devices: each device's sum and count, added up. Split
    along the distributions' own axis: each distribution's parts added up (every device then holds
    every distribution's divergence), and their mean taken on each device."""
    if call.options.batch_axis is not None and call.options.batch_axis == call.options.axis:
        return mean_loss(f"_rt.all_sum({_divergences(call)}, {call.where})", call, 2)
    return all_mean_loss(_divergences(call), call, 2)


def kl_div_split_options(view: CallView[LossOptions]) -> LossOptions:
    """A split operand: where its batch axis lies, for the lowering to see whether it is the axis summed."""
    where = view.split_axes(view.arg_types[0])
    return dataclasses.replace(view.options, batch_axis=where[0]) if where else view.options


def kl_div_payload(view: CallView[LossOptions]) -> Payload:
    """The sum and the count; split along the distributions' axis, each distribution's part of its divergence."""
    logp = view.arg_types[0]
    assert isinstance(logp, T.TensorT) and view.options.axis is not None
    if view.options.axis in view.split_axes(logp):
        rest = T.TensorT(logp.axes[:view.options.axis] + logp.axes[view.options.axis + 1:], logp.dtype)
        return Payload("kl_div's partial sums of each distribution over the batch axis", numel(rest), logp.dtype)
    return Payload("kl_div's sum and count", sympy.Integer(2), logp.dtype)


def cosine_similarity_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[LossOptions] | T.UnknownT:
    """`cosine_similarity(a, b, over=D, eps=)`: two float tensors of one type; the cosine of the
    angle between their vectors along D, the operand's type without D."""
    a_arg, b_arg, over, eps = args
    assert a_arg is not None and b_arg is not None and over is not None
    pair = paired(ck, "cosine_similarity", a_arg, b_arg, "second argument")
    given = keyword_numbers(ck, "cosine_similarity", ("eps",), [eps], at_least_zero=True)
    if pair is None or given is None:
        return T.UNKNOWN
    a = pair[0]
    axis = over_axis(ck, over, a, "`cosine_similarity`")
    if axis is None:
        return T.UNKNOWN
    lowered = (a_arg.expr, b_arg.expr) + ((eps.expr,) if eps is not None else ())
    return Typed(T.TensorT(a.axes[:axis] + a.axes[axis + 1:], a.dtype), lowered,
                 LossOptions(axis=axis, keywords=given))


def cosine_similarity_lower(call: LowerCall[LossOptions]) -> str:
    return f"_F.cosine_similarity({call.args[0]}, {call.args[1]}, dim={call.options.axis}{_keyword_text(call)})"


register(
    pointwise_loss("mse_loss", "_F.mse_loss"),
    pointwise_loss("l1_loss", "_F.l1_loss"),
    pointwise_loss("smooth_l1_loss", "_F.smooth_l1_loss", ("beta",)),
    pointwise_loss("binary_cross_entropy_with_logits", "_F.binary_cross_entropy_with_logits"),
    Op("kl_div", ("logp", "target", "over", "mask"), 3, kl_div_rule, kl_div_lower,
       Across(first_split, OWN, all_kl_div, kl_div_payload, split_options=kl_div_split_options), autocast=Autocast.FP32),
    Op("cosine_similarity", ("a", "b", "over", "eps"), 3, cosine_similarity_rule, cosine_similarity_lower,
       Across[LossOptions](over_batch=along_batch), layout=Layout[LossOptions](heads=heads_along(sums=False)),
       autocast=Autocast.FP32_ON_CUDA),
)
