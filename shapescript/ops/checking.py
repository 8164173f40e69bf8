"""What a typing rule of the op table may read of the checker and report to it: `RuleChecker`.

The body checker (check/bodies.py) is one; a rule sees nothing else of it. A rule types its
arguments (`expr`), reports errors (`error`, with labels at the places that gave a type), records
how its call resolved (`record_call`, `set_recipe`) and what the function does (`use`), and reads
the sizes it may need (`dims`, `dim_values`, the function's `params`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Protocol

from ..errors import Span
from ..shapes import dims as D
from ..shapes import value_types as T
from ..shapes.kinds import CallKind
from ..shapes.options import CallOptions, Recipe
from ..syntax import tree as A

Label = tuple[Span, str]  # a secondary label of a diagnostic: a place, and what it says there


class Use(enum.Enum):
    """What a function's body does that decides where it runs (plan/placement.py reads it)."""

    LOOP = "loop"  # a loop over a dataset's batches
    PRINT = "print"
    SAVE = "save"  # a checkpoint
    LOAD = "load"
    WRITE = "write"  # to a sink
    PYTHON = "python"  # a call of a `python fn`
    DATASET = "dataset"  # a dataset among its parameters
    SINK = "sink"
    TENSORS = "tensors"  # tensors: device work


class ParamView(Protocol):
    """A parameter of a function of the program."""

    @property
    def name(self) -> str: ...

    @property
    def ty(self) -> T.Ty: ...


class FnView(Protocol):
    """A function of the program, as a rule names it (`value_and_grad(loss, ...)`)."""

    @property
    def name(self) -> str: ...

    @property
    def params(self) -> Sequence[ParamView]: ...


class RuleChecker(Protocol):
    @property
    def dims(self) -> Mapping[str, D.Dim]:
        """The checked function's generic dims, by name."""

    @property
    def dim_values(self) -> Mapping[str, int | None]:
        """Each declared dim's size (None: given when the program is loaded)."""

    @property
    def precision(self) -> str:
        """The dtype of a float made where the program writes none (`precision f64`; f32 by default)."""

    @property
    def grown(self) -> Mapping[D.Dim, D.Dim]:
        """Sizes of their own that came from another (a loop's growing value, `n+i`; `last`'s
        `min(n,k)`), each with the size it came from: `over=n` names them."""

    def came_from(self, fresh: D.Dim, origin: D.Dim) -> None:
        """Note that size `fresh` came from `origin` (see `grown`)."""

    @property
    def params(self) -> Sequence[ParamView]:
        """The checked function's parameters."""

    # -- typing and reporting ---------------------------------------------------------------------

    def expr(self, node: A.Expr) -> T.Ty:
        """The type of an argument's expression (checked once; errors in it reported)."""

    def operand(self, node: A.Expr) -> T.Ty:
        """An operand's type: a tensor or a plain number, anything else an error."""

    def type_of(self, node: A.Node) -> T.Ty | None:
        """The type already found for `node`, if it was checked."""

    def error(self, code: str, message: str, span: Span, label: str = "", *help: str,
              secondary: tuple[Label, ...] = ()) -> T.UnknownT:
        """Report a diagnostic; the unknown type, which a rule returns after an error."""

    def dim_note(self, t: T.Ty) -> str:
        """What the derived dims in `t` stand for, for a message (empty if none)."""

    def cast_help(self, at: A.Node | Span, dtype: str) -> str:
        """The help line of a dtype error: how to write the cast to `dtype` at `at`."""

    def type_label(self, node: A.Node, t: T.Ty) -> Label | None:
        """A secondary label at the declaration or assignment that gave `node` its type `t`."""

    def axis_label(self, node: A.Node, t: T.TensorT, k: int, which: str) -> Label | None:
        """A secondary label at the place that gave axis `k` of `node`."""

    # -- what a call resolved to, and what the function does ----------------------------------------

    def arrange(self, node: A.Call, names: list[str], what: str, required: int | None = None,
                ) -> list[A.Arg | None] | None:
        """The call's arguments in parameter order (keywords placed), or None after an error."""

    def check_mut(self, arg: A.Arg, param_mut: bool, param: str, what: str) -> None:
        """`mut` on an argument where, and only where, the parameter changes it."""

    def record_call(self, node: A.Call, kind: CallKind, name: str, args: list[A.Expr | A.Pattern],
                    options: CallOptions = ...) -> None:
        """How the call resolved, for the stages after the checker."""

    def set_recipe(self, node: A.Node, recipe: Recipe) -> None:
        """How to lower `node` (a broadcast operand's placing, `@` as a tensordot)."""

    def use(self, what: Use, span: Span) -> None:
        """The function does `what` (tensors, printing...), first at `span`: placement reads it."""

    def device_work(self, what: str, span: Span) -> None:
        """The function does training work on the devices (value_and_grad, update) at `span`."""

    def function_named(self, node: A.Name, call: A.Call) -> FnView | None:
        """The program's function `node` names (`loss` in `value_and_grad(loss, ...)`), noted as
        called by the checked function at `call`; None if no function has that name."""

    def call_as_grad(self, node: A.Call, fn: str) -> T.Ty:
        """`node` (`value_and_grad(fn, args...)`) checked and recorded as a call of `fn` with the
        arguments after the first: its result's type."""
