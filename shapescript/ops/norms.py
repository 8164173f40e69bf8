"""The norms of a value along its own axes, with their optional affine params: `layer_norm(x,
over=D)`, `rms_norm(x, over=D)` and `group_norm(x, groups, over=C)`, each torch's one kernel.

`layer_norm(x, weight, bias, over=D, eps=1e-5)` normalizes each vector along D to mean 0 and
variance 1, then scales it by `weight` and adds `bias` (both `[D]`, either may be left out);
`rms_norm(x, weight, over=D, eps=)` scales each vector to unit root-mean-square (torch's has no bias;
eps defaults to torch's, the machine epsilon of x's dtype); `group_norm(x, groups, weight, bias,
over=C, eps=1e-5)` is channels first, as torch's: the axes before C are examples, each normalized
by itself, over each group of C / groups channels and every axis after C, with `weight` and
`bias` `[C]`. The weights and biases may be given by keyword (`weight=`, `bias=`).

The run time gives torch's kernels the layout they take: the axis normalized moved last and back
(layer_norm, rms_norm), the axes before the channels made one, torch's N (group_norm). On several devices each works on each example by itself; normalizing along the
batch axis (group_norm: the batch axis at or after the channels) is refused (E1801). Under `split H`
each device normalizes its own part where the axes normalized aren't split; otherwise the operands
are taken whole.
"""

from __future__ import annotations

from collections.abc import Callable

from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.options import NormalizeOptions
from ..shapes.plans import HeadsKind
from ..syntax import tree as A
from .args import keyword_numbers, labels, literal_number, over_axis, tensor_arg
from .checking import RuleChecker
from .sizes import count_source
from .table import (
    GATHER,
    LOCAL,
    Across,
    Args,
    Autocast,
    CallView,
    HeadsRule,
    Layout,
    Lower,
    LowerCall,
    Op,
    Rule,
    Typed,
    register,
)


def _over(ck: RuleChecker, node: A.Call, over: A.Arg | None, x: T.TensorT, name: str) -> int | None:
    """The axis named by `over=`, which every norm needs (E0206 where it is missing)."""
    if over is None:
        ck.error("E0206", f"`{name}` is missing `over`", node.span, "missing argument",
                 f"name the axis it normalizes, as `{name}(x, over={x.axes[-1].show() if x.rank else 'D'})`")
        return None
    return over_axis(ck, over, x, f"`{name}`")


def _affine(ck: RuleChecker, name: str, x_arg: A.Arg, x: T.TensorT, axis: int,
            given: tuple[tuple[str, A.Arg | None], ...]) -> tuple[str, ...] | None:
    """The affine params given (their names, in order), each `[A] dtype` of x's axis `axis`; None
    after an error (E0301, E0308)."""
    want = T.TensorT((x.axes[axis],), x.dtype)
    out: list[str] = []
    for param, arg in given:
        if arg is None:
            continue
        t = tensor_arg(ck, arg, f"`{name}`'s {param}")
        if t is None:
            return None
        if t.dtype != x.dtype:
            ck.error("E0308", f"`{name}` of {x.dtype} and a {param} of {t.dtype}", arg.span, f"this is {t.show()}",
                     ck.cast_help(arg.value, x.dtype))
            return None
        if t.rank != 1 or not t.axes[0].same(x.axes[axis]):
            ck.error("E0301", f"`{name}`'s {param} is {want.show()}, one value along the axis it normalizes, "
                     f"not {t.show()}", arg.span, f"this is {t.show()}",
                     f"declare it `{want.show()}`",
                     secondary=labels(ck.type_label(arg.value, t), ck.type_label(x_arg.value, x)))
            return None
        out.append(param)
    return tuple(out)


def _lowered(x_arg: A.Arg, given: tuple[A.Arg | None, ...], eps: A.Arg | None) -> tuple[A.Expr, ...]:
    """The arguments the lowering prints: x, the affine params given, then eps if given."""
    return (x_arg.expr,) + tuple(a.expr for a in given if a is not None) + ((eps.expr,) if eps is not None else ())


def along_rule(name: str, params: tuple[str, ...]) -> Rule[NormalizeOptions]:
    """`layer_norm` and `rms_norm`: x, its affine params (`params`), `over=`, `eps=`."""
    def rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[NormalizeOptions] | T.UnknownT:
        x_arg, *affine_args, over, eps = args
        assert x_arg is not None
        x = tensor_arg(ck, x_arg, f"`{name}`", floats=True)
        eps_given = keyword_numbers(ck, name, ("eps",), [eps], at_least_zero=True)
        if x is None or eps_given is None:
            return T.UNKNOWN
        axis = _over(ck, node, over, x, name)
        if axis is None:
            return T.UNKNOWN
        affine = _affine(ck, name, x_arg, x, axis, tuple(zip(params, affine_args)))
        if affine is None:
            return T.UNKNOWN
        return Typed(T.TensorT(x.axes, x.dtype), _lowered(x_arg, tuple(affine_args), eps),
                     NormalizeOptions(axis=axis, rank=x.rank, affine=affine, eps=eps is not None))
    return rule


def group_norm_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[NormalizeOptions] | T.UnknownT:
    """`group_norm(x, groups, weight, bias, over=C, eps=)`: C's channels in `groups` groups (a whole
    literal or a declared dim of known size, dividing C where C's size is known)."""
    name = "group_norm"
    x_arg, groups_arg, weight, bias, over, eps = args
    assert x_arg is not None and groups_arg is not None
    x = tensor_arg(ck, x_arg, f"`{name}`", floats=True)
    written = isinstance(groups_arg.value, A.Name) or literal_number(groups_arg.value) is not None
    count = count_source(ck, groups_arg.value, f"`{name}`'s groups") if written else None
    eps_given = keyword_numbers(ck, name, ("eps",), [eps], at_least_zero=True)
    groups = D.value(count[0], ck.dim_values) if count is not None else None
    if not written or (count is not None and groups is None):  # an expression, or a size known as it runs
        return ck.error("E0310", f"`{name}`'s groups is a whole number written as a literal, or a declared dim "
                        "of known size", groups_arg.span, "not such a number", f"as `{name}(x, 2, over=C)`")
    if x is None or groups is None or eps_given is None:
        return T.UNKNOWN
    axis = _over(ck, node, over, x, name)
    if axis is None:
        return T.UNKNOWN
    channels = D.value(x.axes[axis].size, ck.dim_values)
    if channels is not None and channels % groups:
        return ck.error("E0301", f"`{name}`'s {channels} channels ({x.axes[axis].show()}) don't split into "
                        f"{groups} groups", groups_arg.span, "not a divisor of the channels",
                        f"give a number of groups that divides {channels}")
    affine = _affine(ck, name, x_arg, x, axis, (("weight", weight), ("bias", bias)))
    if affine is None:
        return T.UNKNOWN
    return Typed(T.TensorT(x.axes, x.dtype), _lowered(x_arg, (weight, bias), eps),
                 NormalizeOptions(axis=axis, rank=x.rank, affine=affine, eps=eps is not None, groups=groups))


def _params_text(call: LowerCall[NormalizeOptions], params: tuple[str, ...], default_eps: str) -> str:
    """The affine params (None where not given) and eps, as the run time's norms take them."""
    given = dict(zip(call.options.affine, call.args[1:]))
    eps = call.args[1 + len(call.options.affine)] if call.options.eps else default_eps
    return ", ".join([given.get(p, "None") for p in params] + [eps])


def layer_norm_lower(call: LowerCall[NormalizeOptions]) -> str:
    return f"_rt.layer_norm({call.args[0]}, {call.options.axis}, {_params_text(call, ('weight', 'bias'), '1e-05')})"


def rms_norm_lower(call: LowerCall[NormalizeOptions]) -> str:
    return f"_rt.rms_norm({call.args[0]}, {call.options.axis}, {_params_text(call, ('weight',), 'None')})"


def group_norm_lower(call: LowerCall[NormalizeOptions]) -> str:
    o = call.options
    return (f"_rt.group_norm({call.args[0]}, {o.groups}, {o.axis}, {_params_text(call, ('weight', 'bias'), '1e-05')}, "
            f"{call.where})")


# ---- several devices ------------------------------------------------------------------------------

def _normalizes(over_trailing: bool, axis: int, k: int) -> bool:
    """Whether x's axis k is among those a call normalizes over: the axis named, or (group_norm,
    `over_trailing`) the channels and every axis after them."""
    return k >= axis if over_trailing else k == axis


def over_batch_rule(over_trailing: bool) -> Callable[[CallView[NormalizeOptions]], bool]:
    """Whether a call normalizes over the batch axis, which each device holds only a part of."""
    def over_batch(view: CallView[NormalizeOptions]) -> bool:
        axis = view.options.axis
        where = view.split_axes(view.arg_types[0] if view.arg_types else None)
        return axis is not None and any(_normalizes(over_trailing, axis, k) for k in where)
    return over_batch


def heads_rule(over_trailing: bool) -> HeadsRule[NormalizeOptions]:
    """Each device's part alone where x is split only along axes it isn't normalized over (and the
    affine params are whole); otherwise the operands whole."""
    def heads(view: CallView[NormalizeOptions]) -> HeadsKind:
        axis = view.options.axis
        where = view.split_axes(view.arg_types[0] if view.arg_types else None)
        if axis is None or any(view.split_axes(t) for t in view.arg_types[1:]):
            return GATHER
        return GATHER if any(_normalizes(over_trailing, axis, k) for k in where) else LOCAL
    return heads


def norm_op(name: str, params: tuple[str, ...], rule: Rule[NormalizeOptions], lower: Lower[NormalizeOptions],
            required: int = 1, over_trailing: bool = False) -> Op[NormalizeOptions]:
    return Op(name, params, required, rule, lower, Across(over_batch=over_batch_rule(over_trailing)),
              Layout(heads=heads_rule(over_trailing)), autocast=Autocast.FP32_ON_CUDA)


register(
    norm_op("layer_norm", ("x", "weight", "bias", "over", "eps"), along_rule("layer_norm", ("weight", "bias")),
            layer_norm_lower),
    norm_op("rms_norm", ("x", "weight", "over", "eps"), along_rule("rms_norm", ("weight",)), rms_norm_lower),
    norm_op("group_norm", ("x", "groups", "weight", "bias", "over", "eps"), group_norm_rule, group_norm_lower,
            required=2, over_trailing=True),
)
