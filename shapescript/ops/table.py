"""The op table: each built-in operation declared once, with everything every stage needs of it.

An `Op` is one entry: its parameters, its typing rule (the checker), its lowering (the code
generator prints it), what it does along the batch axis when a program runs on several devices
(the batch split marks it, the code generator prints the all-reduce, the DeviceTable counts what
it sends), and its layout rule: what it sends when each device holds a piece of every param
(`shard params`; `split H` to come). The stages read the table; none of them lists ops of its own.

The built-ins of training steps (steps.py), of the controller's statements and the modes
(controller.py) are ops of the table too; `value_and_grad` is one whose call resolves as a call of
the function it differentiates (the IR keeps it as a GradCall, printed with its entry's lowering).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import sympy

from ..shapes import value_types as T
from ..shapes.kinds import CallKind
from ..shapes.options import NO_OPTIONS, AxisOptions, CallOptions, PatternOptions, Placing, Recipe
from ..shapes.plans import Combine, HeadsKind
from ..syntax import tree as A
from .args import _unused_args
from .checking import RuleChecker

Args = list[A.Arg | None]

# An op's kind of options (shapes/options.py): its entry's rule gives them, its lowering and its
# rules along the batch axis and the layout read them, and mypy checks that they agree.
Opts = TypeVar("Opts", bound=CallOptions)
Opts_co = TypeVar("Opts_co", bound=CallOptions, covariant=True)


@dataclass(frozen=True)
class Typed(Generic[Opts_co]):
    """What a typing rule found: the result's type, the arguments the lowering prints (in order),
    and the options it reads (the axis a reduction runs over, a mask's placing index...)."""

    result: T.Ty
    args: tuple[A.Expr, ...]
    options: Opts_co


def typed(result: T.Ty, args: tuple[A.Expr, ...]) -> Typed[CallOptions]:
    """What the rule of an op that reads no options found."""
    return Typed(result, args, NO_OPTIONS)


# A typing rule gets the checker, the call and its arguments in parameter order (keywords placed,
# absent optional ones None); it returns what it found, or an UnknownT after reporting an error (or
# a type with no call recorded: `value_and_grad`, recorded as a call of the function it differentiates).
Rule = Callable[[RuleChecker, A.Call, Args], "Typed[Opts] | T.Ty"]


@dataclass(frozen=True)
class LowerCall(Generic[Opts_co]):
    """A checked call as the code generator hands it to an op's lowering."""

    args: list[str]  # each argument's Python text
    wrapped: list[str]  # the same, parenthesized where an index or a method call follows it
    options: Opts_co
    where: str  # the call's .ss location as a Python string literal, for run-time messages
    place: Callable[[int, Placing | None], str]  # argument k with the index placing its axes
    recipe: Recipe  # how the checker said to lower it (a broadcast operand's placing, `@` as a tensordot)
    size: Callable[[object], str]  # a dim's size as the function reads it (an int, or off a parameter)
    literal: Callable[[object], str]  # a value as a Python literal (user text goes through it)
    spec: Callable[[str], str]  # the module's name for a data type's spec (`batches` hands it to the run time)


Lower = Callable[[LowerCall[Opts]], str]


def runtime_function(name: str) -> Lower[CallOptions]:
    """The lowering of a call of the run time's function `name` with the call's arguments."""
    def lower(call: LowerCall[CallOptions]) -> str:
        return f"_rt.{name}({', '.join(call.args)})"
    return lower


@dataclass(frozen=True)
class CallView(Generic[Opts_co]):
    """A checked call as the batch split and the DeviceTable see it."""

    options: Opts_co
    arg_types: tuple[T.Ty | None, ...]
    result: T.Ty | None
    split_axes: Callable[[T.Ty | None], list[int]]  # where a type has the batch axis
    split_size: Callable[[object], bool]  # a size read off a parameter is the batch's (each device's part)


@dataclass(frozen=True)
class Payload:
    """What one all-reduce of the op sends: what it combines, in the DeviceTable's words, how many
    values, of which dtype."""

    what: str
    values: sympy.Expr
    dtype: str


# What a sum of every device's partial results combines: `@` and einsum over the batch axis too.
PARTIAL_PRODUCTS = "the partial products of a contraction over the batch axis"
PARTIAL, OWN = Combine.PARTIAL, Combine.OWN


@dataclass(frozen=True)
class Across(Generic[Opts]):
    """The op along the batch axis, split across the devices. `over_batch` says whether a call
    works across that axis (None: never, the op works on each example alone). If it does, either
    the op has a combined lowering (`kind`: what the batch split records, PARTIAL when the devices'
    results are added up, the op itself followed by an all-reduce of the result; OWN with `lower`,
    its lowering for several devices; `payload`: what it sends), or it is refused (E1801)."""

    over_batch: Callable[[CallView[Opts]], bool] | None = None
    kind: Combine | Callable[[CallView[Opts]], Combine | None] | None = None  # by the call, for one op of several kinds
    lower: Lower[Opts] | None = None
    payload: Callable[[CallView[Opts]], Payload] | None = None
    # The options a call takes instead of its own when its operand is split: where its batch axis
    # lies, for an op that works on its part of something drawn for the whole batch (dropout's mask).
    split_options: Callable[[CallView[Opts]], Opts] | None = None
    refused_as: Callable[[CallView[Opts]], str] | None = None  # how E1801 names a refused call (default: the op)

    @property
    def refused(self) -> bool:
        """Always refused over the batch axis (a kind decided by the call may be refused or not)."""
        return self.over_batch is not None and self.kind is None

    def kind_of(self, view: CallView[Opts]) -> Combine | None:
        return self.kind(view) if callable(self.kind) else self.kind


PER_EXAMPLE: Across[Any] = Across()  # each example by itself, or nothing with the batch axis


# What an op does with values split along H (`split H`), given its call (CallView.split_axes says
# where a type is split): shapes/plans.py's HeadsKind.
LOCAL, SUM, GATHER, CUT = HeadsKind.LOCAL, HeadsKind.SUM, HeadsKind.GATHER, HeadsKind.CUT
HeadsRule = Callable[[CallView[Opts]], HeadsKind]


@dataclass(frozen=True)
class Layout(Generic[Opts]):
    """An op's layout rule. `sharded`: what a call sends when each device holds a piece of every
    param (`shard params`): norm and clip_norm of gradients add up every device's pieces' squares.
    (A read of a param, gathered from the pieces, is no op: plan/layout.py plans those.) `heads`:
    how it works on values split along H; None: it takes them whole (GATHER), always right."""

    sharded: Callable[[CallView[Opts]], Payload | None] | None = None
    heads: HeadsRule[Opts] | None = None


def heads_local(view: CallView[CallOptions]) -> HeadsKind:
    """Value by value (and broadcasting): each device's part alone."""
    return LOCAL


def heads_contraction(view: CallView[CallOptions]) -> HeadsKind:
    """`@`, matmul, einsum: H kept in the result is each device's own; H contracted, partial sums,
    where every operand is split (a weight whose axis is a plain `H*Dh`, not the group `(H Dh)`, is
    whole: then the operands are taken whole)."""
    if view.split_axes(view.result):
        return LOCAL
    return SUM if all(view.split_axes(t) for t in view.arg_types if isinstance(t, T.TensorT)) else GATHER


def heads_along(sums: bool) -> HeadsRule[AxisOptions]:
    """An op along one axis (`over=`), or over everything: along another axis than H, each device's
    part alone; along H (or over everything), a sum is partial sums (`sums`), anything else whole."""
    def rule(view: CallView[AxisOptions]) -> HeadsKind:
        where = view.split_axes(view.arg_types[0] if view.arg_types else None)
        if not where or (view.options.axis is not None and view.options.axis not in where):
            return LOCAL
        return SUM if sums else GATHER
    return rule


def heads_rearrange(view: CallView[PatternOptions]) -> HeadsKind:
    """A pattern that moves H's axis without splitting it (permutes, merges it first into a group)
    works on each device's heads; one that splits it into atoms needs its size, so the whole."""
    where = view.split_axes(view.arg_types[0] if view.arg_types else None)
    split = view.options.split
    if where and view.split_axes(view.result) and (split is None or split[where[0]] is None):
        return LOCAL
    return LOCAL if not where else GATHER


LOCAL_LAYOUT: Layout[Any] = Layout(heads=heads_local)


class Autocast(enum.Enum):
    """What torch.autocast does with an op's floats (`precision mixed bf16`), as our lowering of it
    calls torch: LOWER computes in the narrow dtype (products, convolutions), FP32 in f32 (losses),
    FP32_ON_CUDA in f32 on a cuda device and as its inputs on the CPU (softmax, norms, sums: torch's
    lists differ by device), FOLLOW as its inputs, the widest of them. tests/compiler/test_mixed_precision.py
    runs each op's lowering under autocast on the CPU and checks its result's dtype against this."""

    LOWER = "lower"
    FP32 = "fp32"
    FP32_ON_CUDA = "fp32 on cuda"
    FOLLOW = "follow"


@dataclass(frozen=True)
class Op(Generic[Opts]):
    """One entry of the table; `Opts` is its kind of options, which its rule gives and the rest read."""
    name: str
    params: tuple[str, ...]
    required: int
    rule: Rule[Opts]
    lower: Lower[Opts]
    across: Across[Opts]
    layout: Layout[Opts] | None = None  # what it does with the layout options' pieces (None: nothing of its own)
    # After an error in the arguments' places, check each argument for errors of its own; not for
    # ops whose arguments name dims (`causal(i, j)`), which aren't values.
    check_rest: bool = True
    # The rule places the arguments itself (a pattern, sizes by keyword): it gets none placed.
    own_args: bool = False
    # The rule checks `mut` on the arguments itself (update and load change a model); any other op
    # changes none of its arguments, and `mut` on one is E0503.
    checks_mut: bool = False
    refused_dtypes: tuple[str, ...] = ()  # dtypes torch has no kernel of it for (E0308): abs of bool
    widens: bool = False  # its result of a bool or i32 tensor is i64, as torch's sum is (an i32 sum overflows)
    writes_record: bool = False  # it writes a record to a sink (`write`): a step's result it only logs needn't wait
    makes_record: bool = False  # it makes a sink's record of its arguments (`logs`)
    # It reads gradients whole (update, clip_norm, norm): gradients each device kept its own while
    # they added up are averaged there (plan/accumulate.py, runtime/grads.py).
    reads_gradients: bool = False
    autocast: Autocast = Autocast.FOLLOW  # its compute dtype under `precision mixed bf16`


OPS: dict[str, Op[Any]] = {}
# Each op's rule with the boilerplate every rule shares (`_checker`): what the checker calls, by name.
RULES: dict[str, Callable[[RuleChecker, A.Call], T.Ty]] = {}


def register(*ops: object) -> None:
    """Add ops to the table; the checker finds each one's rule by its name. (`object`, not `Op[Any]`:
    built where the expected type is `Op[Any]`, an op could take any options at all; built with none,
    mypy finds the one options type its rule gives and its lowering and other rules read.)"""
    for op in ops:
        if not isinstance(op, Op):
            raise TypeError(f"the op table holds ops, not {type(op).__name__}")
        assert op.name not in OPS and op.name not in RULES, f"`{op.name}` is declared twice"
        OPS[op.name] = op
        RULES[op.name] = _checker(op)


def _checker(op: Op[Any]) -> Callable[[RuleChecker, A.Call], T.Ty]:
    """The boilerplate of every rule, written once: place the arguments (an error checks the rest
    of them for errors of their own), run the op's rule, record what it found for the stages after."""
    def check(ck: RuleChecker, node: A.Call) -> T.Ty:
        args = [] if op.own_args else ck.arrange(node, list(op.params), f"`{op.name}`", op.required)
        if args is None:
            return _unused_args(ck, node) if op.check_rest else T.UNKNOWN
        if not op.checks_mut:
            _refuse_mut(ck, op, node)
        typed = op.rule(ck, node, args)
        if not isinstance(typed, Typed):
            return typed
        ck.record_call(node, CallKind.BUILTIN, op.name, list(typed.args), typed.options)
        return typed.result
    return check


def _refuse_mut(ck: RuleChecker, op: Op[Any], node: A.Call) -> None:
    for k, a in enumerate(node.args):
        if a.mut:
            param = a.keyword or (op.params[k] if k < len(op.params) else "its argument")
            ck.error("E0503", f"`mut` given, but `{op.name}` doesn't change `{param}`", a.span, "not changed",
                     "remove `mut`")


def numel(t: T.TensorT) -> sympy.Expr:
    """How many values a tensor of type `t` holds."""
    return sympy.Mul(*(a.size for a in t.axes))


def result_values(what: str) -> Callable[[CallView[CallOptions]], Payload]:
    """A payload of the result's values (a sum of every device's partial result)."""
    def payload(view: CallView[CallOptions]) -> Payload:
        assert isinstance(view.result, T.TensorT)
        return Payload(what, numel(view.result), view.result.dtype)
    return payload


def reduces_batch(view: CallView[AxisOptions]) -> bool:
    """A reduction whose operand has the batch axis, over everything or over that axis."""
    where = view.split_axes(view.arg_types[0] if view.arg_types else None)
    axis = view.options.axis
    return bool(where) and (axis is None or axis in where)


def along_batch(view: CallView[AxisOptions]) -> bool:
    """An operation along one axis (`over=`), which is the batch axis."""
    return view.options.axis in view.split_axes(view.arg_types[0] if view.arg_types else None)
