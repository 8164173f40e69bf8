"""Help lines the checker's errors give, written on the user's own text where they can be."""

from __future__ import annotations

from ..dtypes import ELEMENTS
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


def keeps_values(have: str, want: str) -> bool:
    """Whether converting `have` to `want` is a conversion a help may suggest: one within a kind
    (a float to another float, as `to(y, f32)`), or to a kind that holds it (a bool or an int to a
    float); never a float to an int or a bool, nor an int to a bool, which can't be right."""
    a, b = ELEMENTS[have], ELEMENTS[want]
    if a.kind == b.kind or a.kind == "bool":
        return True
    return a.kind == "int" and b.kind == "float"


def common_dtype(left: str, right: str) -> str:
    """The dtype an operator's two sides both take: the left's, unless only the right's holds both
    (an int and a float: the float)."""
    return left if keeps_values(right, left) else right


def a_dtype(dtype: str) -> str:
    """`an f32`, `a bf16`: the dtype with its article, as it is read aloud."""
    return f"{'an' if dtype[0] in 'fi' else 'a'} {dtype}"


def tensor_help(t: T.Ty, text: str) -> str:
    """Where an operator met a model: name one of its tensors, as `m.w`."""
    if isinstance(t, T.ModelT):
        tensors = [m.name for m in t.members.values() if m.tensor is not None]
        if tensors:
            return f"use one of its tensors, as `{text}.{tensors[0]}`"
    return "pass a tensor or a number here"
