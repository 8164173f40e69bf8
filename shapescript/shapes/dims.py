"""Dim expressions as sympy expressions.

A declared dim (`dim D = 784`) is a positive integer Symbol named D; its value lives in the
program's dim table, not in the expression, so dims match by name, never by an accident of size.
A generic dim (`b` in `x: [b D]`) is a Dummy: two functions' `b`s are different dims, and a call
binds the callee's to the caller's expressions with `xreplace` (simultaneous, so swaps are safe).

A derived dim (`dim D = H * Dh`) is a Symbol too, so types and messages keep its name, but `equal`
reads it as its definition: `[D]` and `[(H Dh)]` are one type. The checker sets the definitions in
a context variable for the length of one check, since every place in it that compares dims (an
axis's `same`, the rules, the patterns) would otherwise need the program passed to it; they are
also on the checked program and its IR (`Module.derived`), and the stages after the checker pass
them to `equal` themselves.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import TypeAlias

import sympy
from sympy.printing.str import StrPrinter

Dim: TypeAlias = sympy.Expr


def declared(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, positive=True)


def generic(name: str) -> sympy.Dummy:
    return sympy.Dummy(name, integer=True, positive=True)


def literal(value: int) -> sympy.Integer:
    number: sympy.Integer = sympy.Integer(value)  # sympy's constructors are unannotated
    return number


def is_generic(d: sympy.Basic) -> bool:
    return isinstance(d, sympy.Dummy)


def symbols(d: Dim) -> list[sympy.Symbol]:
    """The dims `d` is made of, in sympy's order of its free symbols (each one a Symbol: declared,
    or a generic Dummy)."""
    return [s for s in d.free_symbols if isinstance(s, sympy.Symbol)]


_DERIVED: ContextVar[Definitions] = ContextVar("derived_dims", default=MappingProxyType({}))


@contextmanager
def derived(definitions: Definitions) -> Iterator[None]:
    """Within the block, each derived dim named in `definitions` equals its definition there (an
    expression of dims that aren't derived). The dict may be filled after the block starts."""
    token = _DERIVED.set(definitions)
    try:
        yield
    finally:
        _DERIVED.reset(token)


Definitions: TypeAlias = Mapping[str, Dim]  # each derived dim's definition, by its name


def expand_derived(d: Dim, definitions: Definitions | None = None) -> Dim:
    """`d` with each derived dim replaced by its definition: `definitions`, the program's (a stage
    after the checker passes its module's), or by default those of the check running now."""
    if definitions is None:
        definitions = _DERIVED.get()
    if not definitions:
        return d
    mapping = {s: definitions[s.name] for s in symbols(d)
               if s.name in definitions and not isinstance(s, sympy.Dummy)}
    return d.xreplace(mapping) if mapping else d


def equal(a: Dim, b: Dim, definitions: Definitions | None = None) -> bool:
    """Whether `a` and `b` are one size, each derived dim read as its definition (`definitions`:
    see expand_derived)."""
    if a == b:
        return True
    a, b = expand_derived(a, definitions), expand_derived(b, definitions)
    if a == b:
        return True
    if a.is_Atom and b.is_Atom:  # two different symbols or numbers
        return False
    # Expanded forms are canonical for the polynomial and rational dims we build. (Subtracting
    # instead would make sympy import its tensor module on first use: ~25 ms.)
    return bool(sympy.expand(a) == sympy.expand(b))


def substitute(d: Dim, mapping: Mapping[Dim, Dim]) -> Dim:
    return d.xreplace(mapping) if mapping else d


def value(d: Dim, values: Mapping[str, int | None]) -> int | None:
    """The size when every symbol in `d` has a value, else None."""
    if isinstance(d, sympy.Integer):
        return int(d)
    subs = {}
    for s in symbols(d):
        size = values.get(s.name)
        if size is None or isinstance(s, sympy.Dummy):
            return None
        subs[s] = size
    v = sympy.sympify(d.xreplace(subs))
    return int(v) if v.is_Integer else None


def digit_count(value: int) -> int:
    """How many digits a size has, without writing it out (Python refuses to write a long one)."""
    digits = max(1, int(value.bit_length() * 0.30103))  # log10(2) rounded down: exact or one short
    smallest_longer: int = 10 ** digits  # int ** int may be a float to mypy (a negative power)
    return digits + (value >= smallest_longer)


class _Printer(StrPrinter):
    """Prints generic dims by their written name (sympy shows a Dummy as `_b`). StrPrinter is
    unannotated: its methods are called through the class, where mypy knows them for sympy's."""

    def __init__(self) -> None:
        StrPrinter.__init__(self)

    def _print_Dummy(self, expr: sympy.Dummy) -> str:
        return expr.name

    def _print_Mul(self, expr: sympy.Mul) -> str:
        text: str = StrPrinter._print_Mul(self, expr)
        return text.replace(" ", "")

    def _print_Add(self, expr: sympy.Add, order: str | None = None) -> str:
        text: str = StrPrinter._print_Add(self, expr, order)
        return text.replace(" ", "")


_PRINTER = _Printer()


def show(d: Dim) -> str:
    text: str = StrPrinter.doprint(_PRINTER, d)
    return text


def names(d: Dim) -> set[str]:
    return {s.name for s in symbols(d)}
