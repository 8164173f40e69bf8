"""How the DeviceTable writes a count or a size, in `shapescript comms`, the notebook's table and
the records' `bytes_text` alike: `3,072·b·n`, `813,056 bytes (794 KiB)`."""

from __future__ import annotations

import sympy

from ..shapes import dims as D

UNITS = ("KiB", "MiB", "GiB", "TiB")


def number_text(expr: sympy.Expr) -> str:
    """`813,056`; `3,072·b·n`; `2·C + 1` where a dim has no value."""
    expr = sympy.expand(expr)
    if expr.is_Integer:
        return f"{int(expr):,}"
    parts = []
    for term in expr.as_ordered_terms():
        coeff, factors = term.as_coeff_mul()
        symbols = "·".join(D.show(f) for f in factors)
        if not factors:
            parts.append(f"{int(coeff):,}" if coeff.is_Integer else str(coeff))
        elif coeff == 1:
            parts.append(symbols)
        else:
            parts.append(f"{int(coeff):,}·{symbols}" if coeff.is_Integer else f"{coeff}·{symbols}")
    return " + ".join(parts)


def bytes_text(expr: sympy.Expr) -> str:
    """`16 bytes`; `813,056 bytes (794 KiB)`; `3,072·b·n bytes`: how the table's text, from
    `shapescript comms` to the records' `bytes_text`, writes a size."""
    expr = sympy.expand(expr)
    text = f"{number_text(expr)} byte{'' if expr == 1 else 's'}"
    if not expr.is_Integer or int(expr) < 1024:
        return text
    value = float(expr)
    for unit in UNITS:
        value /= 1024
        if value < 1024 or unit == UNITS[-1]:
            shown = f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
            return f"{text} ({shown} {unit})"
    return text


def short_bytes(n: int) -> str:
    """A size in a word, for lists of them: `512 bytes`, `794 KiB`, `1.25 GiB`."""
    text = bytes_text(sympy.Integer(n))
    return text[text.index("(") + 1:-1] if "(" in text else text
