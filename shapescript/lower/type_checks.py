"""The lowering side of the debug type checks (`generate(..., check_types=True)`): each expression's
checked type as runtime/typecheck.py's spec, and the code that checks values against it.

Codegen calls this in three places only: every expression's text (`wrap`), a function's first
lines (`prologue`: a frame for its generic dims, and its parameters checked), and a loop over
batches (`loop`: each batch's own dims forgotten before the next).
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any

import sympy

from ..errors import Span
from ..shapes import dims as D
from ..shapes import value_types as T
from .guards import Formula, formula
from .text import literal

if TYPE_CHECKING:
    from ..ir.nodes import Module, Param

FRAME = "_types"  # the frame's local; user names starting with `_` are renamed, so none meets it
MODULE = "_tc"  # runtime/typecheck.py, as the module imports it
IMPORT = f"from shapescript.runtime import typecheck as {MODULE}"
# A value's type as runtime/typecheck.py reads it, printed as a literal: ("tensor", shown, axes,
# dtype, index), ("scalar", kind), ("tuple", items) or ("batch", fields)
TypeSpec = tuple[Any, ...]


class TypeChecks:
    def __init__(self, module: Module) -> None:
        self.c = module
        self.lines = module.source.split("\n")
        self.numbers: dict[sympy.Dummy, int] = {}  # each generic dim's number, in the order first met

    def dim_key(self, d: sympy.Dummy) -> str:
        """A generic dim's key in a frame: its name and which dim of that name (two loops' `b`s
        differ), numbered in the module's order so that a build prints the same text every time."""
        return f"{d.name}#{self.numbers.setdefault(d, len(self.numbers) + 1)}"

    # ---- what codegen calls ---------------------------------------------------------------------

    def wrap(self, ty: T.Ty, span: Span, text: str) -> str:
        """`text`, the code of an expression, checked against its type when that type is checkable."""
        spec = self.spec(ty)
        if spec is None:
            return text
        return f"{MODULE}.expect({text}, {literal(spec)}, {literal(self.where(span))}, {FRAME})"

    def prologue(self, params: tuple[Param, ...], names: list[str]) -> list[str]:
        """A function's first lines: its frame, then each parameter (`names`: as Python names them)
        checked, binding the generic dims it has."""
        lines = [f"{FRAME} = {MODULE}.Frame()"]
        for p, name in zip(params, names):
            spec = self.spec(p.ty)
            if spec is not None:
                where = (str(p.span), f"parameter {p.name}")
                lines.append(f"{MODULE}.expect({name}, {literal(spec)}, {literal(where)}, {FRAME})")
        return lines

    def loop(self, t: T.Ty, iterable: str) -> str:
        """A loop over batches (`t`: the loop variable's type): each batch's own dims (its `b`, the
        lengths it pads to) are new."""
        if not isinstance(t, T.BatchT):
            return iterable
        keys = tuple(self.dim_key(d) for a in t.axes for d in generics(a.size))
        keys += tuple(self.dim_key(d) for _, d in t.padded if isinstance(d, sympy.Dummy))
        return f"{MODULE}.each({iterable}, {literal(keys)}, {FRAME})"

    # ---- types as specs -------------------------------------------------------------------------

    def spec(self, t: T.Ty) -> TypeSpec | None:
        if isinstance(t, T.TensorT):
            index = None if t.index is None else (D.show(t.index), self.want(t.index))
            shown = T.show_axes(t.axes) + (f" Index[{D.show(t.index)}]" if t.index is not None else f" {t.dtype}")
            return ("tensor", shown, tuple((a.show(), self.want(a.size)) for a in t.axes), t.dtype, index)
        if isinstance(t, T.ScalarT):
            return ("scalar", t.kind)
        if isinstance(t, T.TupleT):
            items = tuple(self.spec(i) for i in t.items)
            return ("tuple", items) if any(i is not None for i in items) else None
        if isinstance(t, T.BatchT):
            return ("batch", tuple((name, self.spec(t.field(name))) for name in t.data.fields))
        return None

    def want(self, size: D.Dim) -> Formula | None:
        """An axis' size as the runtime checks it: fixed, a generic's key, or a formula of them."""
        fixed = D.value(size, self.c.dims)
        if fixed is not None:
            return fixed
        if isinstance(size, sympy.Dummy):
            return self.dim_key(size)
        known = {s: self.c.dims[s.name] for s in D.symbols(size)
                 if not D.is_generic(s) and self.c.dims.get(s.name) is not None}
        keys = {s: sympy.Symbol(self.dim_key(s)) for s in generics(size)}
        try:
            return formula(sympy.sympify(size.xreplace({**known, **keys})))
        except ValueError:
            return None  # not arithmetic the runtime evaluates: left unchecked

    def where(self, s: Span) -> tuple[str, str]:
        """An expression's .ss location and its text (the first line of it, for a long one)."""
        if not 0 < s.line <= len(self.lines):
            return str(s), "?"
        line = self.lines[s.line - 1]
        end = s.end_col if s.end_line == s.line else len(line) + 1
        return str(s), line[s.col - 1:end - 1]


def generics(size: D.Dim) -> list[sympy.Dummy]:
    """The generic dims in a size, in the order they were made (a set's order changes run to run)."""
    return sorted((s for s in size.free_symbols if isinstance(s, sympy.Dummy)), key=attrgetter("dummy_index"))
