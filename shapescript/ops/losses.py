"""The losses of labels, cross_entropy and nll_loss, and `matmul` (the function form of `@`); the
lowerings of a mean loss that every loss shares (target_losses.py's too).

On several devices, a loss whose labels have the batch axis is the mean over the whole batch:
every device's sum of losses and count, added up; a product that contracts the batch axis is
every device's partial product, added up.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy

from ..shapes import value_types as T
from ..shapes.options import AxisOptions, CallOptions
from ..syntax import tree as A
from .args import matmul, over_axis, tensor_arg
from .checking import RuleChecker
from .reductions import mask_of
from .table import (
    OWN,
    PARTIAL,
    PARTIAL_PRODUCTS,
    Across,
    Args,
    Autocast,
    CallView,
    Layout,
    LowerCall,
    Op,
    Payload,
    Rule,
    Typed,
    heads_contraction,
    register,
    result_values,
    typed,
)

NONE = 'reduction="none"'  # torch's loss of each value (or row), which a mean over the batch takes apart


def class_loss(name: str, inputs: str) -> Rule[AxisOptions]:
    """The rule of `name(inputs, labels, over=C, mask=)`: a float tensor with a classes axis C, and
    labels typed `Index[C]` of its shape without C; the mean loss, a `[]` of its dtype. `inputs`:
    what the first argument holds (logits, log-probabilities), as messages name it."""
    def rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[AxisOptions] | T.UnknownT:
        logits_arg, labels_arg, over, mask = args
        assert logits_arg is not None and labels_arg is not None and over is not None
        logits = tensor_arg(ck, logits_arg, f"`{name}`", floats=True)
        labels = tensor_arg(ck, labels_arg, f"`{name}`'s labels")
        if logits is None or labels is None:
            return T.UNKNOWN
        axis = over_axis(ck, over, logits, f"`{name}`")
        if axis is None:
            return T.UNKNOWN
        classes = logits.axes[axis]
        rest = logits.axes[:axis] + logits.axes[axis + 1:]
        if len(rest) != labels.rank or not all(a.same(b) for a, b in zip(rest, labels.axes)):
            return ck.error("E0301", f"`{name}`'s labels must be {T.show_axes(rest)}, the {inputs} without "
                            f"{classes.show()}, but are {labels.show()}", labels_arg.span,
                            f"this is {labels.show()}", f"one label per row of {inputs}")
        if labels.index is None:
            return ck.error("E0309", f"`{name}`'s labels must be `Index[{classes.show()}]`, "
                            f"but are {labels.show()}", labels_arg.span,
                            "not known to be in range", "declare the labels as `[] Index[C]`")
        if not classes.same(T.AxisT(labels.index)):
            return ck.error("E0309", f"labels are {labels.show()}, but the classes are {classes.show()}",
                            labels_arg.span, "a different bound",
                            f"declare the labels as `Index[{classes.show()}]`, the {inputs}' classes axis")
        mask_index = None
        if mask is not None:
            mask_index = mask_of(ck, mask, labels)
            if mask_index is None:
                return T.UNKNOWN
        lowered = (logits_arg.expr, labels_arg.expr) + ((mask.expr,) if mask is not None else ())
        return Typed(T.TensorT((), logits.dtype), lowered, AxisOptions(axis=axis, rank=logits.rank, mask_index=mask_index))
    return rule


def _logits(call: LowerCall[AxisOptions]) -> str:
    """torch takes the classes on axis 1."""
    axis, rank = call.options.axis, call.options.rank
    return call.args[0] if axis == 1 or rank == 1 else f"{call.wrapped[0]}.movedim({axis}, 1)"


def cross_entropy_lower(call: LowerCall[AxisOptions]) -> str:
    if call.options.mask_index is not None:
        return (f"_rt.masked_cross_entropy({_logits(call)}, {call.args[1]}, "
                f"{call.place(2, call.options.mask_index)})")
    return f"_F.cross_entropy({_logits(call)}, {call.args[1]})"


def all_cross_entropy(call: LowerCall[AxisOptions]) -> str:
    if call.options.mask_index is not None:
        return (f"_rt.all_masked_cross_entropy({_logits(call)}, {call.args[1]}, "
                f"{call.place(2, call.options.mask_index)}, {call.where})")
    return f"_rt.all_cross_entropy({_logits(call)}, {call.args[1]}, {call.where})"


def mean_loss(losses: str, call: LowerCall[AxisOptions], mask_at: int) -> str:
    """The mean of `losses` (the Python text of each value's or row's loss), over the values where
    the call's mask (its argument `mask_at`) holds if it has one: on one device."""
    if call.options.mask_index is None:
        return f"{losses}.mean()"
    return f"_rt.masked_mean({losses}, {call.place(mask_at, call.options.mask_index)}, None)"


def all_mean_loss(losses: str, call: LowerCall[AxisOptions], mask_at: int) -> str:
    """The same mean over the whole batch, split across the devices: every device's sum and count
    (of the values where the mask holds), added up in one all-reduce, as `mean` does."""
    if call.options.mask_index is None:
        return f"_rt.all_mean({losses}, None, {call.where})"
    return f"_rt.all_masked_mean({losses}, {call.place(mask_at, call.options.mask_index)}, None, {call.where})"


def nll_loss_lower(call: LowerCall[AxisOptions]) -> str:
    if call.options.mask_index is None:
        return f"_F.nll_loss({_logits(call)}, {call.args[1]})"
    return mean_loss(f"_F.nll_loss({_logits(call)}, {call.args[1]}, {NONE})", call, 2)


def all_nll_loss(call: LowerCall[AxisOptions]) -> str:
    return all_mean_loss(f"_F.nll_loss({_logits(call)}, {call.args[1]}, {NONE})", call, 2)


def labels_split(view: CallView[CallOptions]) -> bool:
    return bool(view.split_axes(view.arg_types[1]))


def first_split(view: CallView[CallOptions]) -> bool:
    """The first operand has the batch axis."""
    return bool(view.split_axes(view.arg_types[0]))


def sum_and_count(name: str) -> Callable[[CallView[CallOptions]], Payload]:
    """A loss's payload over the batch: the sum of the losses and their count, two values of the
    first operand's dtype."""
    def payload(view: CallView[CallOptions]) -> Payload:
        first = view.arg_types[0]
        assert isinstance(first, T.TensorT)
        return Payload(f"{name}'s sum and count", sympy.Integer(2), first.dtype)
    return payload


def matmul_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[CallOptions] | T.UnknownT:
    a, b = args
    assert a is not None and b is not None
    left, right = ck.operand(a.expr), ck.operand(b.expr)
    if T.UNKNOWN in (left, right):
        return T.UNKNOWN
    result = matmul(ck, node, left, right, a, b)
    if result is T.UNKNOWN:
        return T.UNKNOWN
    return typed(result, (a.expr, b.expr))


def matmul_lower(call: LowerCall[CallOptions]) -> str:
    if call.recipe.tensordot:
        return f"torch.tensordot({call.args[0]}, {call.args[1]}, dims=1)"
    return f"{call.wrapped[0]} @ {call.wrapped[1]}"


def contracts_batch(view: CallView[CallOptions]) -> bool:
    """The left side's last axis, which `@` sums over, is the batch axis."""
    left = view.arg_types[0]
    return isinstance(left, T.TensorT) and left.rank > 0 and left.rank - 1 in view.split_axes(left)


register(
    Op("cross_entropy", ("logits", "labels", "over", "mask"), 3, class_loss("cross_entropy", "logits"),
       cross_entropy_lower, Across(labels_split, OWN, all_cross_entropy, sum_and_count("cross_entropy")),
       autocast=Autocast.FP32),
    Op("nll_loss", ("logp", "labels", "over", "mask"), 3, class_loss("nll_loss", "log-probabilities"),
       nll_loss_lower, Across(labels_split, OWN, all_nll_loss, sum_and_count("nll_loss")), autocast=Autocast.FP32),
    Op("matmul", ("a", "b"), 2, matmul_rule, matmul_lower,
       Across(contracts_batch, PARTIAL, payload=result_values(PARTIAL_PRODUCTS)),
       layout=Layout(heads=heads_contraction), autocast=Autocast.LOWER),
)
