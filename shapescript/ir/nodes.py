"""The typed IR: each checked function as frozen nodes that carry everything lowering needs.

The checker works on the syntax tree and keeps what it finds in tables beside it (a type per
expression, how each call resolved, how to place broadcast axes). Elaboration (check/elaborate.py)
reads those tables once and builds these nodes; the stages after it read only the nodes. Every
expression has its checked type and its .ss span; a call names its op-table entry and carries its
options; an operation that works across the batch axis on several devices says how it combines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..devices import DeviceSet
from ..errors import Span
from ..ops.checking import Use
from ..shapes.dims import Dim
from ..shapes.kinds import CallKind, FnKind
from ..shapes.options import NO_RECIPE, CallOptions, Recipe

# A dim's size as a function reads it (ParamSize: off a parameter's shape), and where a broadcast
# operand's axes go (Placing), as the checker records them; the stages after it name them here.
from ..shapes.options import ParamSize as ParamSize
from ..shapes.options import Placing as Placing
from ..shapes.options import SizeSource as SizeSource
from ..shapes.plans import ANYWHERE, BatchSplit, Combine, HeadsKind, Placement
from ..shapes.value_types import DataT, ModelT, Ty


@dataclass(frozen=True)
class Expr:
    ty: Ty
    span: Span


@dataclass(frozen=True)
class Name(Expr):
    id: str


@dataclass(frozen=True)
class Size(Expr):
    """A dim used as a number (`n`, `D`): its size, fixed or read off a parameter (None: a declared
    dim still without its value, which the build refuses); `name`: the dim as written."""
    source: SizeSource | None
    name: str


@dataclass(frozen=True)
class Const(Expr):
    value: int | float | str | bool


@dataclass(frozen=True)
class Member(Expr):
    """`obj.name`: a model's member (`live`: the tensor itself, which training updates) or a field.
    `gathered`: a param each device holds a piece of (`shard params`), gathered where it's read."""
    obj: Expr
    name: str
    live: bool
    gathered: bool = False


@dataclass(frozen=True)
class Heads(Expr):
    """What `split H` does at a value (plan/layout.py): `gather` it whole from every device's part
    along axes[0], `cut` it to this device's part along each axis (a tuple's elements'), `sum` every
    device's partial result."""
    kind: HeadsKind  # GATHER, CUT or SUM
    axes: tuple[int | None, ...]
    value: Expr


@dataclass(frozen=True)
class TupleOf(Expr):
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class BinOp(Expr):
    op: str
    left: Expr
    right: Expr
    recipe: Recipe = NO_RECIPE  # where broadcast operands' axes go; `@` as a tensordot
    across: Combine | None = None  # on several devices: how the devices' results combine


@dataclass(frozen=True)
class UnOp(Expr):
    op: str
    operand: Expr


@dataclass(frozen=True)
class OpCall(Expr):
    """A call of an op of the op table (ops): its arguments in the order its lowering prints
    them (None: an argument that names an axis, which the options carry), and its options."""
    op: str
    args: tuple[Expr | None, ...]
    options: CallOptions
    recipe: Recipe = NO_RECIPE
    across: Combine | None = None


@dataclass(frozen=True)
class AxisArg(Expr):
    """An `Axis[...]` argument of a call of a function of the program (`ty`: the AxisArgT of the dim
    it names), passed as the index of that axis in the call's tensors."""
    index: int


Binding = tuple[tuple[Dim, Dim], ...]  # a call's binding of the callee's generic dims to the caller's


@dataclass(frozen=True)
class FnCall(Expr):
    """A call of a function of the program (`kind`: fn, python or extern)."""
    kind: CallKind
    name: str
    args: tuple[Expr, ...]
    # Set by ir/defer.py: a controller's call of a fn on the workers whose result the loop only
    # writes to a sink, so the controller needn't wait for it before sending the next step.
    later: bool = False
    binds: Binding = ()


@dataclass(frozen=True)
class GradCall(Expr):
    """value_and_grad(fn, args...): a call of the program's `fn` (the batch split and the DeviceTable
    follow it there), printed with the entry `op` of the op table (the op the call was written with)."""
    fn: str
    args: tuple[Expr, ...]  # as FnCall's
    op: str
    binds: Binding = ()
    deferred: bool = False  # its gradients stay each device's own until read (plan/accumulate.py)


# Found by ir/fuse.py: spans of the program that torch has one kernel for.

@dataclass(frozen=True)
class Attention(Expr):
    """Causal attention: softmax(q·kᵀ·scale with the future masked out, over the keys)·v."""
    q: Expr
    k: Expr
    v: Expr
    scale: Expr | None


@dataclass(frozen=True)
class LayerNorm(Expr):
    """The std library's layer_norm over the last axis, times a gain, plus a bias."""
    x: Expr
    gain: Expr
    bias: Expr


@dataclass(frozen=True)
class CausalMask(Expr):
    """A causal mask read only as a mask: one tensor per size and device, shared by every call."""
    sizes: tuple[SizeSource | None, ...]


# ---- statements ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Stmt:
    span: Span


@dataclass(frozen=True)
class Target:
    """A name a statement binds, with the type it gets there and its span."""
    name: str
    ty: Ty
    span: Span


@dataclass(frozen=True)
class Assign(Stmt):
    targets: tuple[Target, ...]
    value: Expr


@dataclass(frozen=True)
class Return(Stmt):
    value: Expr | None


@dataclass(frozen=True)
class For(Stmt):
    var: Target
    iter: Expr
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class If(Stmt):
    """`if cond:` with its two branches (an `elif` is an If alone in `orelse`)."""
    cond: Expr
    then: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...]


@dataclass(frozen=True)
class Do(Stmt):
    """An expression evaluated for what it does."""
    expr: Expr


# ---- functions ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    name: str
    ty: Ty
    mut: bool
    span: Span


@dataclass(frozen=True)
class Function:
    name: str
    kind: FnKind
    params: tuple[Param, ...]
    ret: Ty
    body: tuple[Stmt, ...]
    span: Span  # the whole declaration's
    name_span: Span  # its name's, where messages point at the function
    reaches_extern: bool  # whether it calls an extern fn, however deeply: Python that may keep its tensors
    sizes: tuple[ParamSize, ...] = ()  # the generic dims' sizes it reads off its parameters
    target: str = ""  # extern and python fns: the Python function they call ("module.attr")
    generics: Mapping[str, Dim] = field(default_factory=dict)  # its generic dims, by name
    # What its body does that decides where it runs, each with the span of its first use, and
    # the functions of the program it calls, each with its first call's: placement reads them.
    uses: Mapping[Use, Span] = field(default_factory=dict)
    calls: Mapping[str, Span] = field(default_factory=dict)
    device_work: tuple[tuple[str, Span], ...] = ()  # value_and_grad, update
    # The plans' (plan/): where it runs, and on several devices how it takes the batch (None: one
    # device, or a function that doesn't run on the workers).
    placement: Placement = ANYWHERE
    split: BatchSplit | None = None


@dataclass(frozen=True)
class Module:
    """A checked program as lowering reads it: its functions, and the facts about the whole program
    that each target's module prints (dims, devices, the data and model types, the layout's plan)."""
    file: str
    source: str  # the program's text: the debug build quotes it
    span: Span  # its first item's (or the empty program's): where a whole-program diagnostic points
    devices: DeviceSet
    dims: Mapping[str, int | None]  # each declared dim's size (None: not given)
    derived: Mapping[str, Dim]  # each derived dim's definition (`dim D = H * Dh`), for comparing sizes
    data: tuple[DataT, ...]
    models: tuple[ModelT, ...]
    functions: tuple[Function, ...]
    # Set by plan/layout.py: `split H`'s dim, if the program splits one, and the params each
    # device holds a part of, (model, param) -> the axis.
    heads: str | None = None
    head_params: Mapping[tuple[str, str], int] = field(default_factory=dict)
    mixed: str | None = None  # `precision mixed bf16`: each fn on the devices runs under torch.autocast
    tf32: bool = False  # `precision tf32`: each fn on the devices runs with TF32 products allowed

    def function(self, name: str) -> Function:
        return next(f for f in self.functions if f.name == name)
