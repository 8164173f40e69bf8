"""Functions applied to each value by itself: relu, exp, log, sin, erf, sign, ..., each one torch call."""

from __future__ import annotations

from ..shapes import value_types as T
from ..shapes.options import CallOptions
from ..syntax import tree as A
from .args import tensor_arg
from .checking import RuleChecker
from .table import LOCAL_LAYOUT, OPS, PER_EXAMPLE, Args, Autocast, LowerCall, Op, Typed, register, typed


def refused_dtype(ck: RuleChecker, name: str, arg: A.Arg, t: T.TensorT) -> bool:
    """True, with E0308 given, where torch has no `name` for `t`'s dtype (its entry's `refused_dtypes`)."""
    if t.dtype not in OPS[name].refused_dtypes:
        return False
    ck.error("E0308", f"`{name}` of a {t.dtype} tensor: torch has none", arg.span, f"this is {t.show()}",
             "convert it first, as `to(x, i64)`")
    return True


def unary(name: str, torch_fn: str, floats: bool, refused: tuple[str, ...] = (),
          autocast: Autocast = Autocast.FOLLOW) -> Op[CallOptions]:
    """`name(x)`: x's type, value by value; `floats`: only for float tensors."""
    def rule(ck: RuleChecker, node: A.Call, args: Args) -> Typed[CallOptions] | T.UnknownT:
        arg = args[0]
        assert arg is not None
        t = tensor_arg(ck, arg, f"`{name}`", floats=floats)
        if t is None or refused_dtype(ck, name, arg, t):
            return T.UNKNOWN
        return typed(T.TensorT(t.axes, t.dtype), (arg.expr,))

    def lower(call: LowerCall[CallOptions]) -> str:
        return f"{torch_fn}({call.args[0]})"

    return Op(name, ("x",), 1, rule, lower, PER_EXAMPLE, layout=LOCAL_LAYOUT, refused_dtypes=refused, autocast=autocast)


CUDA_FP32 = Autocast.FP32_ON_CUDA  # torch's cuda autocast list: in f32 there
register(
    unary("relu", "torch.relu", True), unary("exp", "torch.exp", True, autocast=CUDA_FP32),
    unary("log", "torch.log", True, autocast=CUDA_FP32), unary("sqrt", "torch.sqrt", True),
    unary("tanh", "torch.tanh", True), unary("sigmoid", "torch.sigmoid", True), unary("gelu", "_F.gelu", True),
    unary("silu", "_F.silu", True), unary("abs", "torch.abs", False, ("bool",)), unary("sin", "torch.sin", True),
    unary("cos", "torch.cos", True), unary("softplus", "_F.softplus", True, autocast=CUDA_FP32),
    unary("log1p", "torch.log1p", True, autocast=CUDA_FP32), unary("expm1", "torch.expm1", True, autocast=CUDA_FP32),
    unary("erf", "torch.erf", True), unary("sign", "torch.sign", False),
)
