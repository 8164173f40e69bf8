"""Small HTML pieces the notebook's displays share: a table with a class, escaped text, a title.

Plain strings, nothing imported from IPython or ipywidgets, so that `_repr_html_` works wherever
the object is shown (Jupyter, nbconvert's HTML, VS Code) and tests can read the markup directly.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

# One look for every table of the extension: left-aligned, tight, readable in light and dark themes.
STYLE = ("<style>"
         "table[class^=ss-]{border-collapse:collapse;margin:0.3em 0;font-size:0.92em}"
         "table[class^=ss-] th,table[class^=ss-] td{text-align:left;vertical-align:top;"
         "padding:0.15em 0.7em 0.15em 0;border:none}"
         "table[class^=ss-] tr.ss-section th{padding-top:0.6em;border-bottom:1px solid rgba(127,127,127,0.4)}"
         "table[class^=ss-] td.ss-num{text-align:right;white-space:nowrap}"
         "table[class^=ss-] ul{margin:0;padding-left:1.2em}"
         ".ss-note{color:rgba(127,127,127,0.95);font-size:0.9em}"
         "</style>")


def esc(text: object) -> str:
    return html.escape(str(text))


def code(text: str) -> str:
    return f"<code>{esc(text)}</code>"


def row(cells: Sequence[str], cls: str = "", numeric: Sequence[int] = (), title: str = "") -> str:
    """One `<tr>` of cells that are already HTML; the columns in `numeric` align right, and `title`
    is the row's tooltip (plain text)."""
    tds = "".join(f'<td class="ss-num">{c}</td>' if k in numeric else f"<td>{c}</td>" for k, c in enumerate(cells))
    attrs = (f' class="{cls}"' if cls else "") + (f' title="{esc(title)}"' if title else "")
    return f"<tr{attrs}>{tds}</tr>"


def header(cells: Sequence[str]) -> str:
    return "<tr>" + "".join(f"<th>{esc(c)}</th>" for c in cells) + "</tr>"


def section(title: str, width: int) -> str:
    """A heading row across the table, between groups of rows."""
    return f'<tr class="ss-section"><th colspan="{width}">{esc(title)}</th></tr>'


def table(cls: str, rows: Sequence[str]) -> str:
    """`<table class="CLS">` (an `ss-` class, which STYLE styles) around rows made by `row`,
    `header` and `section`."""
    return f'<table class="{cls}">' + "".join(rows) + "</table>"


def note(text: str) -> str:
    return f'<div class="ss-note">{esc(text)}</div>'
