"""User text in the generated module: the one way any of it gets there.

File and program names, string literals, extern targets, dim and field names and .ss locations
all reach the module we build and `exec`. A name holding a newline, quotes or a backslash must
never end a comment or a string and start code of its own, so every piece of it goes through
`literal` (a value in code) or `comment_text` (a comment, or the text of a docstring).
"""

from __future__ import annotations

import math
from typing import Any


def literal(value: Any) -> str:
    """A Python expression for `value`, built of str, int, float, bool, None and tuples, lists and
    dicts of them. It evaluates to `value` and to nothing else, whatever the strings hold: the
    built-in types' own reprs are used, so a subclass can't print code of its own."""
    if value is None or isinstance(value, bool):
        return "None" if value is None else ("True" if value else "False")
    if isinstance(value, str):
        return str.__repr__(value)  # escapes quotes, backslashes, line breaks, every unprintable char
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):  # their reprs, `inf` and `nan`, aren't Python
            return f'float("{"nan" if math.isnan(value) else "inf" if value > 0 else "-inf"}")'
        return float.__repr__(value)
    if isinstance(value, tuple):
        items = [literal(v) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no Python literal for a {type(value).__name__} in generated code")


def comment_text(text: str) -> str:
    """`text` on one line, for a comment or a docstring's words: backslashes and every character that
    isn't printable (line breaks of any kind, NUL, form feed, U+2028...) written as escapes."""
    return "".join(ch if ch.isprintable() and ch != "\\" else ch.encode("unicode_escape").decode("ascii")
                   for ch in str.__str__(text))
