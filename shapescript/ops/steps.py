"""The built-ins of a training step: `value_and_grad` (a function's value and its gradient with
respect to the model it takes first), `update` (one optimizer step) and `ema` (a second model
moved toward the first: an exponential moving average of its params).

Both are device work (plan/placement.py reads `device_work`): on several devices they run on the
workers. `value_and_grad` works across the batch axis: each device's gradients are of its part of
the batch, and the run time adds them up (plan/comms.py's `gradients` counts that all-reduce, one
per dtype of the model's params). `update` gets whole gradients and does the same step on every
device.

A call of `value_and_grad` resolves as a call of the function it differentiates (kind "grad": the
batch split and the DeviceTable follow it into that function), and the IR keeps it as a GradCall;
the code generator prints it with this entry's lowering.
"""

from __future__ import annotations

from ..shapes import value_types as T
from ..shapes.options import CallOptions
from ..syntax import tree as A
from .args import _unused_args
from .checking import RuleChecker
from .table import OWN, PER_EXAMPLE, Across, Args, CallView, LowerCall, Op, Typed, register, runtime_function, typed


def value_and_grad_rule(ck: RuleChecker, node: A.Call, args: Args) -> T.Ty:
    """`value_and_grad(f, m, args...)`: `f(m, args...)` checked as a call of the program's `f`, which
    must take a model first and return a float scalar; the call is recorded as that call (kind
    "grad"), so the rule gives the type itself rather than a Typed."""
    named = node.args[0].value if node.args and not node.args[0].keyword else None
    fn = ck.function_named(named, node) if isinstance(named, A.Name) else None
    if fn is None:
        _unused_args(ck, node)
        return ck.error("E0601", "`value_and_grad` takes a function first, then its arguments",
                        node.args[0].span if node.args else node.span, "not a function",
                        "write `value_and_grad(loss, m, batch)`")
    ck.device_work("`value_and_grad`", node.span)
    if not fn.params or not isinstance(fn.params[0].ty, T.ModelT):
        _unused_args(ck, node)
        return ck.error("E0601", f"`{fn.name}` must take the model it differentiates as its first parameter",
                        node.args[0].span, "no model first", f"declare `fn {fn.name}(m: Model, ...)`")
    result = ck.call_as_grad(node, fn.name)
    if result is T.UNKNOWN:
        return result
    if not (isinstance(result, T.TensorT) and result.rank == 0 and result.is_float):
        return ck.error("E0601", f"`value_and_grad` needs a function whose result is a float scalar [], "
                        f"but `{fn.name}` returns {result.show()}", node.args[0].span, "not a scalar",
                        "reduce it first, as `mean(x)`")
    return T.TupleT((result, T.GradT(fn.params[0].ty)))


def value_and_grad_on_devices(call: LowerCall[CallOptions]) -> str:
    """On several devices: the same, saying where the call is, for the workers' reports of the
    gradients' all-reduce."""
    return f"_rt.value_and_grad({', '.join(call.args + [f'where={call.where}'])})"


def _always(view: CallView[CallOptions]) -> bool:
    return True


def update_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[CallOptions] | T.Ty:
    """`update(mut m, mut opt, g)`: one step of `m`'s optimizer with gradients of `m`."""
    model, opt_arg, grads = args
    assert model is not None and opt_arg is not None and grads is not None
    m, opt, g = (ck.expr(a.expr) for a in (model, opt_arg, grads))
    ck.device_work("`update`", node.span)
    ck.check_mut(model, True, "model", "`update`")
    ck.check_mut(opt_arg, True, "opt", "`update`")
    ck.check_mut(grads, False, "grads", "`update`")
    if T.UNKNOWN in (m, opt, g):
        return T.NONE  # an argument's error is reported; the step has no call to record
    if not isinstance(m, T.ModelT):
        return ck.error("E0401", f"`update` changes a model, not {m.show()}", model.span,
                        f"this is {m.show()}")
    if not (isinstance(opt, T.OptT) and opt.model is m):
        return ck.error("E0401", f"`update` needs an optimizer of `{m.name}`, not {opt.show()}",
                        opt_arg.span, f"this is {opt.show()}", f"declare it `AdamW[{m.name}]`, or another optimizer of it")
    if not (isinstance(g, T.GradT) and g.model is m):
        return ck.error("E0401", f"`update` needs gradients of `{m.name}`, not {g.show()}", grads.span,
                        f"this is {g.show()}", "take them from `value_and_grad`")
    return typed(T.NONE, (model.expr, opt_arg.expr, grads.expr))


def ema_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[CallOptions] | T.Ty:
    """`ema(mut avg, m, decay)`: avg's params moved toward m's, `avg = decay·avg + (1 − decay)·m`,
    two models of one type; `decay` a number or a float `[]`."""
    avg_arg, model_arg, decay_arg = args
    assert avg_arg is not None and model_arg is not None and decay_arg is not None
    avg, m, decay = (ck.expr(a.expr) for a in (avg_arg, model_arg, decay_arg))
    ck.device_work("`ema`", node.span)
    ck.check_mut(avg_arg, True, "avg", "`ema`")
    ck.check_mut(model_arg, False, "model", "`ema`")
    if T.UNKNOWN in (avg, m, decay):
        return T.NONE
    if not isinstance(m, T.ModelT):
        return ck.error("E0401", f"`ema` averages a model's params, not {m.show()}", model_arg.span,
                        f"this is {m.show()}")
    if avg is not m:
        return ck.error("E0401", f"`ema` moves a {m.name} toward a model of its own type, not {avg.show()}",
                        avg_arg.span, f"this is {avg.show()}", f"keep the average in a second {m.name}: "
                        f"`ema(mut avg, m, decay=0.999)` with `avg: {m.name}`")
    if not (decay in (T.INT, T.FLOAT) or isinstance(decay, T.TensorT) and decay.rank == 0 and decay.is_float):
        return ck.error("E0401", f"`ema`'s decay is a number or a float [], not {decay.show()}", decay_arg.span,
                        f"this is {decay.show()}")
    return typed(T.NONE, (avg_arg.expr, model_arg.expr, decay_arg.expr))


register(
    # Lowered with the function differentiated first, then its arguments.
    Op("value_and_grad", ("f", "args"), 1, value_and_grad_rule, runtime_function("value_and_grad"),
       Across(_always, OWN, value_and_grad_on_devices), own_args=True, checks_mut=True),
    Op("update", ("model", "opt", "grads"), 3, update_rule, runtime_function("update"), PER_EXAMPLE, checks_mut=True,
       reads_gradients=True),
    Op("ema", ("avg", "model", "decay"), 3, ema_rule, runtime_function("ema"), PER_EXAMPLE, checks_mut=True),
)
