"""Help lines the checker's errors give, written on the user's own text where they can be."""

from __future__ import annotations

from ..errors import Span
from ..shapes import value_types as T
from ..syntax import tree as A


def source_text(source: str, node: A.Node | Span) -> str:
    """The program's text of `node` (one line of it), or "..." for one of several lines."""
    s = node if isinstance(node, Span) else node.span
    lines = source.splitlines()
    if s.line == s.end_line and 0 < s.line <= len(lines):
        return lines[s.line - 1][s.col - 1:s.end_col - 1]
    return "..."


def cast_help(source: str, node: A.Node | Span, dtype: str) -> str:
    """The way out of a dtype mismatch: the conversion, written on the user's own expression."""
    return f"convert it, as `to({source_text(source, node)}, {dtype})`"


def tensor_help(t: T.Ty, text: str) -> str:
    """Where an operator met a model: name one of its tensors, as `m.w`."""
    if isinstance(t, T.ModelT):
        tensors = [m.name for m in t.members.values() if m.tensor is not None]
        if tensors:
            return f"use one of its tensors, as `{text}.{tensors[0]}`"
    return "pass a tensor or a number here"
