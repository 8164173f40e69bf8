"""The state of one program's check: the tables the checker builds, and the diagnostics it finds.
Every stage of checking (the items, the bodies) reports through it; the plans (shapescript/plan/)
report through a Reporter of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..devices import DeviceSet
from ..errors import CompileError, Diagnostic, Span
from ..shapes import dims as D
from ..shapes import value_types as T
from ..syntax import tree as A
from .program import FnInfo
from .tables import Tables


class Reporter:
    """The diagnostics one stage finds in a program."""

    def __init__(self) -> None:
        self.diagnostics: list[Diagnostic] = []

    def error(self, code: str, message: str, span: Span, label: str = "", *help: str,
              secondary: tuple[tuple[Span, str], ...] = ()) -> T.UnknownT:
        """Record an error; `secondary` labels other places it involves (where a dim was bound)."""
        self.diagnostics.append(Diagnostic(code, message, span, label, tuple(h for h in help if h),
                                           secondary=secondary))
        return T.UNKNOWN

    def raise_found(self, program: A.Program) -> None:
        """The CompileError of every diagnostic found, in source order, if there is one."""
        if self.diagnostics:
            self.diagnostics.sort(key=lambda d: (d.span.line, d.span.col))
            raise CompileError(self.diagnostics, program.source, program.warnings)


class Context(Reporter):
    """Shared state of one check: the tables being built and the diagnostics found."""

    def __init__(self, program: A.Program, file: str, devices: DeviceSet | None,
                 dims: dict[str, int] | None, python: bool = True) -> None:
        super().__init__()
        self.program = program
        self.file = file
        self.python = python  # False: a `python fn` or `extern fn` naming Python code is E0701
        self.dim_values: dict[str, int | None] = {}
        self.derived: dict[str, D.Dim] = {}  # `dim D = H * Dh`: D's definition in dims that aren't derived
        self.dim_override = dict(dims or {})
        self.device_override = devices
        self.data: dict[str, T.DataT] = {}
        self.precision = "f32"  # `precision f64`: the dtype of a tensor type written without one
        self.mixed: str | None = None  # `precision mixed bf16`: the dtype the devices compute in
        self.tf32 = False  # `precision tf32`: f32 values, products in TF32 on a GPU that has it
        self.models: dict[str, T.ModelT] = {}  # as declared: generic ones with their dims generic
        self.instances: dict[tuple[str, tuple[D.Dim, ...], tuple[str, ...]], T.ModelT] = {}  # each use of a generic model, by its dims and dtypes
        self.models_done: set[str] = set()  # declared models whose members are resolved
        self.broken_models: set[str] = set()  # generic models with a mistake in their declaration
        self.models_within: list[str] = []  # the generic models being resolved, outermost first
        self.model_dtypes: dict[str, str] = {}  # while a generic model's members are resolved: its dtype params'
        self.fns: dict[str, FnInfo] = {}
        self.tables = Tables()  # what the bodies find about each node, frozen into Checked at the end
        self.defined: dict[str, Span] = {}

    @contextmanager
    def within_model(self, name: str) -> Iterator[None]:
        """While generic model `name`'s members are resolved: a use of it inside is a cycle."""
        self.models_within.append(name)
        try:
            yield
        finally:
            self.models_within.pop()

    def generic_count(self, size: D.Dim) -> bool:
        """A stack's count that is a generic model's own dim, while its declaration is checked."""
        return bool(self.models_within) and any(D.is_generic(s) for s in D.symbols(size))

    def dim_note(self, t: T.Ty) -> str:
        """`with D = 784, C = 10` for the declared dims in a type, to say what sizes it means."""
        return T.dims_note(t, self.dim_values)
