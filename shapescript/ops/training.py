"""Operations of training: norms (of a tensor, or of a model's gradients), clipping gradients,
dropout and batch_norm.

On several devices: a norm over the batch axis is refused; dropout draws the whole batch's mask
and each device keeps its part's rows (the lowering is told where the batch axis lies); batch_norm
over a split batch takes its statistics from every device, in one all-reduce.
"""

from __future__ import annotations

import dataclasses

import sympy

from ..shapes import value_types as T
from ..shapes.options import AxisOptions, CallOptions, DropoutOptions, NormOptions
from ..syntax import tree as A
from .args import literal_number, number_arg, over_axis, tensor_arg
from .checking import RuleChecker, Use
from .table import (
    OWN,
    PER_EXAMPLE,
    Across,
    Args,
    CallView,
    Layout,
    LowerCall,
    Op,
    Payload,
    Typed,
    reduces_batch,
    register,
    typed,
)

BATCH_NORM_SENDS = "batch_norm's sums, sums of squares and count for each channel, in f64 (under Train)"


def _param_dtypes(model: T.ModelT) -> set[str]:
    out: set[str] = set()
    for m in model.members.values():
        if m.kind == A.MemberKind.PARAM and m.tensor is not None:
            out.add(m.tensor.dtype)
        elif m.model is not None:
            out |= _param_dtypes(m.model)
    return out


def norm_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[NormOptions] | T.UnknownT:
    """The 2-norm of a tensor (over one axis, or all), or of a model's gradients taken together."""
    x, over = args
    assert x is not None
    t = ck.expr(x.expr)
    if isinstance(t, T.GradT):
        if over is not None:
            return ck.error("E0206", "the norm of gradients is over all of them; it takes no `over=`",
                            over.span, "unexpected")
        dtypes = _param_dtypes(t.model)
        return Typed(T.scalar_tensor(dtypes.pop() if len(dtypes) == 1 else "f32"), (x.expr,), NormOptions(grads=True))
    if not isinstance(t, T.TensorT) or not t.is_float:
        return t if t is T.UNKNOWN else ck.error("E0401", f"`norm` takes float tensors or gradients, not "
                                                 f"{t.show()}", x.span, f"this is {t.show()}")
    ck.use(Use.TENSORS, node.span)
    axis = over_axis(ck, over, t, "`norm`") if over is not None else None
    if over is not None and axis is None:
        return T.UNKNOWN
    return Typed(T.TensorT(t.axes[:axis] + t.axes[axis + 1:] if axis is not None else (), t.dtype),
                 (x.expr,), NormOptions(axis=axis))


def norm_lower(call: LowerCall[NormOptions]) -> str:
    if call.options.grads:
        return f"_rt.grad_norm({call.args[0]}, {call.where})"
    axis = call.options.axis
    return f"torch.linalg.vector_norm({call.args[0]}{'' if axis is None else f', dim={axis}'})"


def clip_norm_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[CallOptions] | T.UnknownT:
    grads, most = args
    assert grads is not None and most is not None
    g = ck.expr(grads.expr)
    if not number_arg(ck, most, "`clip_norm`'s max"):
        return T.UNKNOWN
    if not isinstance(g, T.GradT):
        return g if g is T.UNKNOWN else ck.error("E0401", f"`clip_norm` takes gradients, not {g.show()}",
                                                 grads.span, f"this is {g.show()}")
    return typed(g, (grads.expr, most.expr))


def dropout_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[DropoutOptions] | T.UnknownT:
    x, p, mode_arg = args
    assert x is not None and p is not None and mode_arg is not None
    t = tensor_arg(ck, x, "`dropout`", floats=True)
    if not number_arg(ck, p, "`dropout`'s p"):
        return T.UNKNOWN
    p_value = literal_number(p.value)
    if p_value is not None and not 0 <= p_value < 1:
        return ck.error("E0310", f"`dropout`'s p is a probability below 1, not {p_value}", p.span)
    mode = ck.expr(mode_arg.expr)
    if mode != T.MODE and mode is not T.UNKNOWN:
        return ck.error("E0401", f"`dropout`'s mode is Train(seed=...) or Eval, not {mode.show()}",
                        mode_arg.span, f"this is {mode.show()}", "take a `mode: Mode` parameter")
    if t is None:
        return T.UNKNOWN
    # batch_axis: the operand's axis split across the devices (None: unsplit), see DROPOUT_ACROSS
    return Typed(T.TensorT(t.axes, t.dtype), (x.expr, p.expr, mode_arg.expr), DropoutOptions(batch_axis=None))


def dropout_split_options(view: CallView[DropoutOptions]) -> DropoutOptions:
    """A split operand: the mask is drawn for the whole batch, each device keeping its rows."""
    where = view.split_axes(view.arg_types[0])
    return dataclasses.replace(view.options, batch_axis=where[0]) if where else view.options


def dropout_lower(call: LowerCall[DropoutOptions]) -> str:
    return f"_rt.dropout({call.args[0]}, {call.args[1]}, {call.args[2]}, {call.options.batch_axis})"


def batch_norm_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[AxisOptions] | T.UnknownT:
    """`batch_norm(x, stats, mode, over=C)`: normalize each C-channel over every other axis; `stats`
    is a model with buffers `mean: [C]` and `var: [C]`, the running statistics that Train updates
    (as PyTorch's buffers are, without `mut`) and Eval uses."""
    x, stats_arg, mode_arg, over = args
    assert x is not None and stats_arg is not None and mode_arg is not None and over is not None
    t = tensor_arg(ck, x, "`batch_norm`", floats=True)
    stats = ck.expr(stats_arg.expr)
    mode = ck.expr(mode_arg.expr)
    if mode != T.MODE and mode is not T.UNKNOWN:
        return ck.error("E0401", f"`batch_norm`'s mode is Train(seed=...) or Eval, not {mode.show()}",
                        mode_arg.span, f"this is {mode.show()}")
    if t is None or stats is T.UNKNOWN:
        return T.UNKNOWN
    axis = over_axis(ck, over, t, "`batch_norm`")
    if axis is None:
        return T.UNKNOWN
    if t.rank < 2:
        return ck.error("E0302", f"`batch_norm` needs an axis to take statistics over besides "
                        f"{t.axes[axis].show()}", x.span, f"this is {t.show()}")
    channel = T.TensorT((t.axes[axis],), t.dtype)
    ok = isinstance(stats, T.ModelT) and all(
        (mem := stats.members.get(name)) is not None and mem.kind == A.MemberKind.BUFFER and mem.tensor is not None
        and mem.tensor.rank == 1 and mem.tensor.axes[0].same(channel.axes[0]) and mem.tensor.dtype == t.dtype
        for name in ("mean", "var"))
    if not ok:
        return ck.error("E0401", f"`batch_norm`'s statistics are a model with buffers `mean: {channel.show()}` and "
                        f"`var: {channel.show()}`, not {stats.show()}", stats_arg.span,
                        f"this is {stats.show()}",
                        f"declare `model Stats:` with `buffer mean: {channel.show()} = zeros()` and "
                        f"`buffer var: {channel.show()} = ones()`")
    return Typed(T.TensorT(t.axes, t.dtype), (x.expr, stats_arg.expr, mode_arg.expr), AxisOptions(axis=axis))


def batch_norm_lower(call: LowerCall[AxisOptions]) -> str:
    return f"_rt.batch_norm({call.args[0]}, {call.args[1]}, {call.args[2]}, {call.options.axis})"


def all_batch_norm(call: LowerCall[AxisOptions]) -> str:
    return (f"_rt.all_batch_norm({call.args[0]}, {call.args[1]}, {call.args[2]}, {call.options.axis}, "
            f"{call.where})")


def statistics_over_batch(view: CallView[AxisOptions]) -> bool:
    """The batch axis is among the axes the statistics are taken over (all but the channels')."""
    return any(k != view.options.axis for k in view.split_axes(view.arg_types[0]))


def batch_norm_payload(view: CallView[AxisOptions]) -> Payload:
    """Each channel's sum and sum of squares, and the count."""
    x = view.arg_types[0]
    assert isinstance(x, T.TensorT) and view.options.axis is not None
    return Payload(BATCH_NORM_SENDS, 2 * x.axes[view.options.axis].size + 1, "f64")


SQUARES = "the sums of the squares of every device's pieces of the gradients"


def grads_squares(view: CallView[CallOptions]) -> Payload | None:
    """The norm of sharded gradients: each device's sum of its pieces' squares, added up (one number)."""
    grads = view.arg_types[0]
    if not isinstance(grads, T.GradT):
        return None  # the norm of a tensor: nothing of the pieces
    dtypes = _param_dtypes(grads.model)
    return Payload(SQUARES, sympy.Integer(1), dtypes.pop() if len(dtypes) == 1 else "f32")


register(
    Op("norm", ("x", "over"), 1, norm_rule, norm_lower, Across[NormOptions](over_batch=reduces_batch),
       layout=Layout[NormOptions](sharded=grads_squares), reads_gradients=True),
    Op("clip_norm", ("grads", "max"), 2, clip_norm_rule,
       lambda call: f"_rt.clip_norm({call.args[0]}, {call.args[1]}, {call.where})", PER_EXAMPLE,
       layout=Layout(sharded=grads_squares), reads_gradients=True),
    Op("dropout", ("x", "p", "mode"), 3, dropout_rule,
       dropout_lower,
       Across(split_options=dropout_split_options)),
    Op("batch_norm", ("x", "stats", "mode", "over"), 4, batch_norm_rule, batch_norm_lower,
       Across(statistics_over_batch, OWN, all_batch_norm, batch_norm_payload)),
)
