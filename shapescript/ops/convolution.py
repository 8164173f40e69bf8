"""Convolutions and pooling over a value's trailing axes, channels first as torch's: `conv1d(x, w)`
with x `[.. C L]` and w `[O C K]`, `conv2d(x, w)` with x `[.. C H W]` and w `[O C Kh Kw]` (w's
second axis `C / groups` with `groups=`), `max_pool2d(x, k)` and `avg_pool2d(x, k)` over x's last
two axes (a k by k window, `stride=` k unless given). `stride=`, `padding=` and `dilation=` are
whole literals, the same along each spatial axis.

Each output size is torch's arithmetic, floor((n + 2p - d(k - 1) - 1) / s) + 1: a number where n
and k are known (E0315 where the window can't fit, or pads more than half of it for pooling), an
expression of the dims otherwise. The leading axes are untouched, the batch axis among them, so on
several devices each device works on its own examples; sliding along the batch axis is E1801.
Under `split H`, a convolution whose weight is split along its output channels (and whose input
is whole along the axes it slides over) gives each device its own output channels; any other
split of those axes takes the operands whole."""

from __future__ import annotations

import sympy

from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.options import WindowOptions
from ..shapes.plans import HeadsKind
from ..syntax import tree as A
from .args import literal_number, tensor_arg
from .checking import RuleChecker
from .sizes import count_source
from .table import GATHER, LOCAL, Across, Args, Autocast, CallView, Layout, Lower, LowerCall, Op, Rule, Typed, register


def _whole(ck: RuleChecker, arg: A.Arg | None, op: str, setting: str, default: int, least: int) -> int | None:
    """A setting given as a whole literal of at least `least`; `default` where it isn't given."""
    if arg is None:
        return default
    ck.expr(arg.expr)
    value = literal_number(arg.value)
    if not isinstance(value, int) or value < least:
        ck.error("E0310", f"`{op}`'s {setting} is a whole number of at least {least}, written as a number",
                 arg.span, "not such a number", f"as `{op}(..., {setting}={max(least, 1)})`")
        return None
    return value


def _known(ck: RuleChecker, d: D.Dim) -> D.Dim:
    """`d` with each declared dim of known size replaced by its size: a window's arithmetic on
    known sizes is a number (a 28-wide axis and a 3-wide kernel give 26)."""
    d = D.expand_derived(d)
    sizes = {s: sympy.Integer(v) for s in D.symbols(d) if not D.is_generic(s)
             and (v := ck.dim_values.get(s.name)) is not None}
    return d.xreplace(sizes) if sizes else d


def out_size(n: D.Dim, k: D.Dim, stride: int, padding: int, dilation: int) -> D.Dim:
    """torch's output size along one axis, as dim arithmetic (exact where the stride is 1)."""
    span = n + 2 * padding - dilation * (k - 1) - 1
    size: D.Dim = span + 1 if stride == 1 else sympy.floor(span / stride) + 1
    return size


def _fits(ck: RuleChecker, node: A.Call, what: str, n: T.AxisT, k: D.Dim, size: D.Dim, padding: int) -> bool:
    """Whether a known output size is at least 1 (E0315 where it isn't)."""
    have, window, out = (D.value(d, ck.dim_values) for d in (n.size, k, size))
    if have is not None and window is not None and out is not None and out < 1:
        axis = f"an axis of {have}" if n.size.is_Integer else f"{n.show()} = {have}"
        ck.error("E0315", f"{what}'s window of {window} doesn't fit along {axis} (padded by {padding} on each side)",
                 node.span, "no output", "pad more, take a smaller window, or a larger input")
        return False
    return True


def conv_rule(spatial: int) -> Rule[WindowOptions]:
    name = f"conv{spatial}d"

    def rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[WindowOptions] | T.UnknownT:
        x_arg, w_arg, stride_arg, padding_arg, dilation_arg, groups_arg = args
        x = tensor_arg(ck, x_arg, f"`{name}`", floats=True)
        w = tensor_arg(ck, w_arg, f"`{name}`'s weight", floats=True)
        stride = _whole(ck, stride_arg, name, "stride", 1, 1)
        padding = _whole(ck, padding_arg, name, "padding", 0, 0)
        dilation = _whole(ck, dilation_arg, name, "dilation", 1, 1)
        groups = _whole(ck, groups_arg, name, "groups", 1, 1)
        if x is None or w is None or None in (stride, padding, dilation, groups):
            return T.UNKNOWN
        assert x_arg is not None and w_arg is not None and stride and dilation and groups and padding is not None
        if x.rank < spatial + 1 or w.rank != spatial + 2:
            return ck.error("E0302", f"`{name}` takes x with a channel axis and {spatial} more last, and a weight "
                            f"[O C{' K' * spatial}], not {x.show()} and {w.show()}", node.span, "wrong axes",
                            f"channels first, as torch's: x [.. C{' H W' if spatial == 2 else ' L'}]")
        if x.dtype != w.dtype:
            return ck.error("E0308", f"`{name}` of {x.dtype} and {w.dtype}", node.span, "two dtypes",
                            ck.cast_help(w_arg.value, x.dtype))
        channels, per_group, out_channels = x.axes[-spatial - 1], w.axes[1], w.axes[0]
        if not D.equal(_known(ck, per_group.size) * groups, _known(ck, channels.size)):
            grouped = f" × groups {groups}" if groups > 1 else ""
            return ck.error("E0301", f"`{name}`'s weight takes {per_group.show()}{grouped} channels, and x has "
                            f"{channels.show()}", w_arg.span, f"{w.show()} against {x.show()}",
                            "the weight's second axis is x's channels (divided by groups)")
        o = D.value(out_channels.size, ck.dim_values)
        if groups > 1 and o is not None and o % groups:
            return ck.error("E0301", f"`{name}`'s {o} output channels don't split into {groups} groups",
                            w_arg.span, "not a multiple of groups")
        outs = []
        for n, k in zip(x.axes[-spatial:], w.axes[2:]):
            size = out_size(_known(ck, n.size), _known(ck, k.size), stride, padding, dilation)
            if not _fits(ck, node, f"`{name}`", n, k.size, size, padding):
                return T.UNKNOWN
            outs.append(T.axis(size))
        result = T.TensorT(x.axes[:-spatial - 1] + (out_channels,) + tuple(outs), x.dtype)
        return Typed(result, (x_arg.expr, w_arg.expr), WindowOptions(spatial, (), stride, padding, dilation, groups))
    return rule


def transposed_size(n: D.Dim, k: D.Dim, stride: int, padding: int, dilation: int, extra: int) -> D.Dim:
    """conv_transpose2d's output size along one axis: (n - 1) s - 2p + d (k - 1) + extra + 1."""
    size: D.Dim = (n - 1) * stride - 2 * padding + dilation * (k - 1) + extra + 1
    return size


def conv_transpose_rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[WindowOptions] | T.UnknownT:
    """`conv_transpose2d(x, w)`: x `[.. C H W]`, w `[C O/groups Kh Kw]` as torch keeps it."""
    name = "conv_transpose2d"
    x_arg, w_arg, stride_arg, padding_arg, extra_arg, dilation_arg, groups_arg = args
    x = tensor_arg(ck, x_arg, f"`{name}`", floats=True)
    w = tensor_arg(ck, w_arg, f"`{name}`'s weight", floats=True)
    stride = _whole(ck, stride_arg, name, "stride", 1, 1)
    padding = _whole(ck, padding_arg, name, "padding", 0, 0)
    extra = _whole(ck, extra_arg, name, "output_padding", 0, 0)
    dilation = _whole(ck, dilation_arg, name, "dilation", 1, 1)
    groups = _whole(ck, groups_arg, name, "groups", 1, 1)
    if x is None or w is None or None in (stride, padding, extra, dilation, groups):
        return T.UNKNOWN
    assert x_arg is not None and w_arg is not None and stride and dilation and groups
    assert padding is not None and extra is not None
    if x.rank < 3 or w.rank != 4:
        return ck.error("E0302", f"`{name}` takes x with a channel axis and 2 more last, and a weight "
                        f"[C O K K], not {x.show()} and {w.show()}", node.span, "wrong axes",
                        "channels first, as torch's: x [.. C H W]")
    if x.dtype != w.dtype:
        return ck.error("E0308", f"`{name}` of {x.dtype} and {w.dtype}", node.span, "two dtypes",
                        ck.cast_help(w_arg.value, x.dtype))
    if extra >= max(stride, dilation):
        return ck.error("E0315", f"`{name}`'s output_padding {extra} must be below its stride or its dilation",
                        extra_arg.span if extra_arg is not None else node.span, "too much",
                        "output_padding picks among the sizes a stride leaves open")
    channels = x.axes[-3]
    if not D.equal(_known(ck, w.axes[0].size), _known(ck, channels.size)):
        return ck.error("E0301", f"`{name}`'s weight takes {w.axes[0].show()} channels, and x has {channels.show()}",
                        w_arg.span, f"{w.show()} against {x.show()}", "the weight's first axis is x's channels")
    c = D.value(channels.size, ck.dim_values)
    if groups > 1 and c is not None and c % groups:
        return ck.error("E0301", f"`{name}`'s {c} channels don't split into {groups} groups", w_arg.span,
                        "not a multiple of groups")
    out_channels = w.axes[1] if groups == 1 else T.axis(_known(ck, w.axes[1].size) * groups)
    outs = []
    for n, k in zip(x.axes[-2:], w.axes[2:]):
        size = transposed_size(_known(ck, n.size), _known(ck, k.size), stride, padding, dilation, extra)
        if not _fits(ck, node, f"`{name}`", n, k.size, size, padding):
            return T.UNKNOWN
        outs.append(T.axis(size))
    return Typed(T.TensorT(x.axes[:-3] + (out_channels,) + tuple(outs), x.dtype), (x_arg.expr, w_arg.expr),
                 WindowOptions(2, (), stride, padding, dilation, groups, extra))


def adaptive_rule(name: str) -> Rule[WindowOptions]:
    """`adaptive_avg_pool2d(x, h, w)` (and max): x's last two axes pooled to h by w, each a literal or
    a declared dim of known size (1 and 1: global pooling)."""
    def rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[WindowOptions] | T.UnknownT:
        x_arg, h_arg, w_arg = args
        x = tensor_arg(ck, x_arg, f"`{name}`", floats=True)
        sizes = [count_source(ck, a.value, f"`{name}`'s size") if a is not None else None for a in (h_arg, w_arg)]
        if x is None or x_arg is None or None in sizes:
            return T.UNKNOWN
        dims = [s[0] for s in sizes if s is not None]
        known = [D.value(d, ck.dim_values) for d in dims]
        if None in known:
            return ck.error("E0310", f"`{name}`'s sizes are literals or declared dims of known size", node.span,
                            "a size known only as it runs")
        if x.rank < 2:
            return ck.error("E0302", f"`{name}` pools the last two axes, and {x.show()} has {x.rank}", x_arg.span,
                            "too few axes")
        return Typed(T.TensorT(x.axes[:-2] + tuple(T.axis(d) for d in dims), x.dtype), (x_arg.expr,),
                     WindowOptions(2, tuple(int(k) for k in known if k is not None)))
    return rule


def pool_rule(name: str) -> Rule[WindowOptions]:
    def rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[WindowOptions] | T.UnknownT:
        x_arg, k_arg, stride_arg, padding_arg = args
        x = tensor_arg(ck, x_arg, f"`{name}`", floats=True)
        k = _whole(ck, k_arg, name, "window", 1, 1)
        stride = _whole(ck, stride_arg, name, "stride", k or 1, 1)
        padding = _whole(ck, padding_arg, name, "padding", 0, 0)
        if x is None or k is None or stride is None or padding is None:
            return T.UNKNOWN
        assert x_arg is not None
        if x.rank < 2:
            return ck.error("E0302", f"`{name}` slides over the last two axes, and {x.show()} has {x.rank}",
                            x_arg.span, "too few axes")
        if 2 * padding > k:
            return ck.error("E0315", f"`{name}` pads {padding} on each side of a window of {k}: at most half "
                            "of it", node.span, "too much padding", f"pad at most {k // 2}")
        outs = []
        for n in x.axes[-2:]:
            size = out_size(_known(ck, n.size), D.literal(k), stride, padding, 1)
            if not _fits(ck, node, f"`{name}`", n, D.literal(k), size, padding):
                return T.UNKNOWN
            outs.append(T.axis(size))
        return Typed(T.TensorT(x.axes[:-2] + tuple(outs), x.dtype), (x_arg.expr,),
                     WindowOptions(2, (k, k), stride, padding))
    return rule


def conv_lower(call: LowerCall[WindowOptions]) -> str:
    o = call.options
    return f"_rt.conv({call.args[0]}, {call.args[1]}, {o.spatial}, {o.stride}, {o.padding}, {o.dilation}, {o.groups})"


def conv_transpose_lower(call: LowerCall[WindowOptions]) -> str:
    o = call.options
    return (f"_rt.conv_transpose({call.args[0]}, {call.args[1]}, {o.stride}, {o.padding}, {o.output_padding}, "
            f"{o.dilation}, {o.groups})")


def pool_lower(kind: str) -> Lower[WindowOptions]:
    def lower(call: LowerCall[WindowOptions]) -> str:
        o = call.options
        return f"_rt.pool({call.args[0]}, {kind!r}, {o.kernel[0]}, {o.stride}, {o.padding})"
    return lower


def adaptive_lower(kind: str) -> Lower[WindowOptions]:
    def lower(call: LowerCall[WindowOptions]) -> str:
        return f"_rt.adaptive_pool({call.args[0]}, {kind!r}, {call.options.kernel})"
    return lower


def slides_over_batch(view: CallView[WindowOptions]) -> bool:
    """Whether the batch axis is among the axes the call slides over, or the channels."""
    x = view.arg_types[0] if view.arg_types else None
    rank = x.rank if isinstance(x, T.TensorT) else 0
    reach = view.options.spatial + (1 if len(view.arg_types) > 1 else 0)
    return any(a >= rank - reach for a in view.split_axes(x))


def heads(view: CallView[WindowOptions]) -> HeadsKind:
    """Each device's output channels where only the weight's are split; otherwise whole."""
    if slides_over_batch(view):
        return GATHER
    w = view.arg_types[1] if len(view.arg_types) > 1 else None
    return LOCAL if all(a == 0 for a in view.split_axes(w)) else GATHER


CONVOLUTION_ARGS = ("x", "w", "stride", "padding", "dilation", "groups")
POOL_ARGS = ("x", "k", "stride", "padding")
SLIDING: Across[WindowOptions] = Across(over_batch=slides_over_batch)

register(
    Op("conv1d", CONVOLUTION_ARGS, 2, conv_rule(1), conv_lower, SLIDING, Layout(heads=heads), autocast=Autocast.LOWER),
    Op("conv2d", CONVOLUTION_ARGS, 2, conv_rule(2), conv_lower, SLIDING, Layout(heads=heads), autocast=Autocast.LOWER),
    Op("max_pool2d", POOL_ARGS, 2, pool_rule("max_pool2d"), pool_lower("max"), SLIDING,
       Layout(heads=heads)),
    Op("avg_pool2d", POOL_ARGS, 2, pool_rule("avg_pool2d"), pool_lower("avg"), SLIDING, Layout(heads=heads)),
    Op("conv_transpose2d", ("x", "w", "stride", "padding", "output_padding", "dilation", "groups"), 2,
       conv_transpose_rule, conv_transpose_lower, SLIDING, Layout(heads=heads), autocast=Autocast.LOWER),
    Op("adaptive_avg_pool2d", ("x", "h", "w"), 3, adaptive_rule("adaptive_avg_pool2d"), adaptive_lower("avg"),
       SLIDING, Layout(heads=heads)),
    Op("adaptive_max_pool2d", ("x", "h", "w"), 3, adaptive_rule("adaptive_max_pool2d"), adaptive_lower("max"),
       SLIDING, Layout(heads=heads)),
)
