"""What the per-pass tests read of a compiled program, in one place: the passes keep their results
on the typed IR (`Checked.module`), and if that changes only these helpers do."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from shapescript.api import compile_program
from shapescript.check.program import Checked
from shapescript.errors import CompileError, Diagnostic
from shapescript.ir import nodes as N
from shapescript.ir.walk import walk
from shapescript.shapes import dims as D

FILE = "p.ss"  # the file name every program is compiled as (diagnostics name it)


def build(source: str, devices: str) -> Checked:
    return compile_program(source, FILE, devices)


def diagnostics(source: str, devices: str) -> list[Diagnostic]:
    """The diagnostics compiling `source` for `devices` reports (it must fail)."""
    with pytest.raises(CompileError) as info:
        build(source, devices)
    return info.value.diagnostics


def line_of(source: str, text: str, nth: int = 0) -> int:
    """The 1-based line of `source` that holds `text` (the `nth` such line), so tests name lines by
    what they say rather than by number."""
    found = [k for k, line in enumerate(source.splitlines(), 1) if text in line]
    assert len(found) > nth, f"no line {nth} with {text!r}"
    return found[nth]


@dataclass(frozen=True)
class Split:
    """How a function takes the batch on several devices: its split generic dims by their written
    names, and the split axis of each parameter and of the result (None: whole)."""
    dims: frozenset[str]
    params: tuple[int | None, ...]
    result: int | None


def split_of(checked: Checked, fn: str) -> Split | None:
    """The batch split pass's finding for `fn` (None: no split recorded, as on one device)."""
    found = checked.split_of(fn)
    if found is None:
        return None
    return Split(frozenset(D.show(d) for d in found.dims), tuple(found.params), found.result)


def combined_ops(checked: Checked) -> list[tuple[str, int]]:
    """The operations the batch split combines across the devices (an all-reduce each), as (the op's
    name, or the operator for `@` written as one, and its .ss line), in source order.

    THE ONE PLACE that reads how the split pass records it: the `across` of the IR's operations."""
    found = [(e.span.line, e.span.col, e.op) for f in checked.module.functions for e in walk(f.body)
             if isinstance(e, N.OpCall | N.BinOp) and e.across]
    return [(name, line) for line, _, name in sorted(found)]
