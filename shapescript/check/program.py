"""`Checked`: what the checker knows about a program, the one truth later stages read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..devices import DeviceSet
from ..errors import Diagnostic, Span
from ..ir import nodes as N
from ..ops.checking import Use
from ..shapes import dims as D
from ..shapes.kinds import CallKind, FnKind
from ..shapes.options import CallOptions, Recipe
from ..shapes.plans import ANYWHERE, BatchSplit, LayoutChoice, Placement
from ..shapes.value_types import DataT, ModelT, Ty
from ..syntax import tree as A


@dataclass
class ParamInfo:
    name: str
    ty: Ty
    mut: bool
    node: A.Param


@dataclass
class FnInfo:
    name: str
    kind: FnKind
    node: A.Fn | A.Extern
    params: list[ParamInfo]
    ret: Ty
    generics: dict[str, D.Dim]
    # What the body does, found by the body checker, read by placement; with the span of the first
    # use of each.
    uses: dict[Use, Span] = field(default_factory=dict)
    device_work: list[tuple[str, Span]] = field(default_factory=list)  # value_and_grad, update
    calls: dict[str, Span] = field(default_factory=dict)  # user functions it calls

    @property
    def span(self) -> Span:
        return self.node.name_span

    def passes_mut(self, param: str) -> bool:
        """Whether the body passes its parameter `param` as `mut` to a call, i.e. means to change it."""
        return isinstance(self.node, A.Fn) and any(
            isinstance(n, A.Arg) and n.mut and isinstance(n.value, A.Name) and n.value.id == param
            for stmt in self.node.body for n in A.iter_nodes(stmt))


@dataclass(frozen=True)
class CallInfo:
    """How a call resolved: which function, its arguments in parameter order, an op's options; and
    for a call of a function of the program, what binds its generics and its `Axis[...]` arguments."""
    kind: CallKind
    name: str
    args: list[A.Expr | A.Pattern]
    options: CallOptions = field(default_factory=CallOptions)
    mapping: Mapping[D.Dim, D.Dim] = field(default_factory=dict)  # the callee's generic dims -> the caller's
    axis_args: Mapping[int, int] = field(default_factory=dict)  # an Axis argument's place -> its axis's index


@dataclass(frozen=True)
class Checked:
    program: A.Program
    file: str
    source: str
    device_set: DeviceSet
    dim_values: dict[str, int | None]
    data: dict[str, DataT]
    models: dict[str, ModelT]
    fns: dict[str, FnInfo]
    # The checker's tables (check/tables.py), keyed by the syntax node: each expression's type,
    # each call's resolution, how to lower an expression.
    types: Mapping[A.Node, Ty] = field(default_factory=dict)
    calls: Mapping[A.Node, CallInfo] = field(default_factory=dict)
    recipes: Mapping[A.Node, Recipe] = field(default_factory=dict)
    derived: Mapping[str, D.Dim] = field(default_factory=dict)  # each derived dim's definition (`dim D = H * Dh`)
    mixed: str | None = None  # `precision mixed bf16`: the dtype the devices compute in where torch.autocast does
    tf32: bool = False  # `precision tf32`: f32 values, products in TF32 on a GPU that has it
    # The program as typed IR (check/elaborate.py), once its bodies are checked; the plans (plan/)
    # give it back with their findings: each function's placement and split, the values `split H`
    # gathers, cuts or sums, the params `shard params` gathers, what combines across the devices.
    ir: N.Module | None = None
    # the DeviceTable, once plan/comms.py's device_table has worked it out (a one-device build never
    # needs it); typed there, since the plans come after checking
    table: object = field(default=None, init=False, compare=False, repr=False)
    # `layout auto`'s choice (plan/choose.py), on the program checked with the layout it chose
    layout_choice: LayoutChoice | None = field(default=None, compare=False, repr=False)


    @property
    def warnings(self) -> tuple[Diagnostic, ...]:
        """What the compiler warns of in a program it accepts (W0106), in source order."""
        return self.program.warnings

    @property
    def module(self) -> N.Module:
        """The typed IR of a program whose checking is done."""
        assert self.ir is not None, "the program's IR is built once its bodies are checked"
        return self.ir

    def placement(self, fn: str) -> Placement:
        """Where function `fn` runs (anywhere, until placement has run)."""
        return self.module.function(fn).placement if self.ir is not None else ANYWHERE

    def reaches_extern(self, fn: str) -> bool:
        """Whether `fn`, or a function it calls however deeply, calls an extern fn: Python code that
        may keep the tensors it is given past the call. Nothing else on a worker can: the language has
        no assignment into a model or a tensor, and a worker's result is pickled before it answers."""
        seen, todo = set(), [fn]
        while todo:
            name = todo.pop()
            info = self.fns.get(name)
            if info is None or name in seen:
                continue
            if info.kind != FnKind.FN:
                return True
            seen.add(name)
            todo.extend(info.calls)
        return False

    def split_of(self, fn: str) -> BatchSplit | None:
        """How function `fn` takes the batch on several devices (None: it isn't split)."""
        return self.module.function(fn).split

    def type_of(self, node: A.Node) -> Ty:
        return self.types[node]
