"""`Checked`: what the checker knows about a program, the one truth later stages read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..devices import DeviceSet
from ..errors import Span
from ..syntax import ast as A
from . import dims as D
from .types import DataT, ModelT, Ty

if TYPE_CHECKING:
    from .comms import DeviceTable


@dataclass
class ParamInfo:
    name: str
    ty: Ty
    mut: bool
    node: A.Param


@dataclass
class FnInfo:
    name: str
    kind: str  # fn | extern | python
    node: A.Fn | A.Extern
    params: list[ParamInfo]
    ret: Ty
    generics: dict[str, D.Dim]
    placement: str = "anywhere"  # controller | workers | anywhere
    placement_reason: str = ""
    # What the body does, found by the body checker, read by placement: "loop", "print", "save",
    # "load", "write", "python", "tensors"; with the span of the first use of each.
    uses: dict[str, Span] = field(default_factory=dict)
    device_work: list[tuple[str, Span]] = field(default_factory=list)  # value_and_grad, update
    calls: dict[str, Span] = field(default_factory=dict)  # user functions it calls
    # On several devices (check/split.py): the generic dims that are the batch axis here, and where
    # each parameter and the result have it (None: whole on every device).
    split: set = field(default_factory=set)
    split_params: list[int | None] = field(default_factory=list)
    split_result: int | None = None

    @property
    def span(self) -> Span:
        return self.node.name_span


@dataclass
class CallInfo:
    """How a call resolved: which function, its arguments in parameter order, and options."""
    kind: str  # fn | builtin | extern | python
    name: str
    args: list[A.Expr | A.Pattern]
    options: dict[str, object] = field(default_factory=dict)


@dataclass
class Checked:
    program: A.Program
    file: str
    source: str
    device_set: DeviceSet
    dim_values: dict[str, int | None]
    data: dict[str, DataT]
    models: dict[str, ModelT]
    fns: dict[str, FnInfo]
    types: dict[int, Ty] = field(default_factory=dict)  # id(expr) -> type
    calls: dict[int, CallInfo] = field(default_factory=dict)  # id(call) -> resolution
    recipes: dict[int, dict] = field(default_factory=dict)  # id(expr) -> how to lower it
    _table: object = field(default=None, repr=False)

    @property
    def devices(self) -> "DeviceTable":
        """How values are laid out over the devices and what every line sends between them (worked
        out when first asked for: a one-device build never needs it)."""
        if self._table is None:
            from .comms import DeviceTable
            self._table = DeviceTable.of(self)
        return self._table  # type: ignore[return-value]

    def type_of(self, node: A.Node) -> Ty:
        return self.types[id(node)]
