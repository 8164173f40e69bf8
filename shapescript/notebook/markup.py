"""Small HTML pieces the notebook's displays share: a table with a class, escaped text, a title.

Plain strings, nothing imported from IPython or ipywidgets, so that `_repr_html_` works wherever
the object is shown (Jupyter, nbconvert's HTML, VS Code) and tests can read the markup directly.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from .. import cell_styles
from ..errors import terminal_lines

# JupyterLab right-aligns output tables with `:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td`
# (two classes and an element), the classic Notebook with `.rendered_html td`: under those containers
# each rule below is written again with their class in front, one class more, so that ours wins; the
# bare rule serves nbconvert's HTML, VS Code and the rest.
_SCOPES = ("", ".jp-RenderedHTMLCommon ", ".rendered_html ")

# Each cell's alignment, inline (why: shapescript/cell_styles.py).
TEXT_CELL, FIGURE_CELL, LOCATION_CELL = cell_styles.TEXT_CELL, cell_styles.FIGURE_CELL, cell_styles.LOCATION_CELL

# One look for every table of the extension: left-aligned, tight, readable in light and dark themes.
_TABLE_RULES = (
    ("table[class^=ss-]", "border-collapse:collapse;margin:0.3em 0;font-size:0.92em"),
    ("table[class^=ss-] th,table[class^=ss-] td", f"{TEXT_CELL};padding:0.15em 0.7em 0.15em 0;border:none"),
    ("table[class^=ss-] tr.ss-section th", "padding-top:0.6em;border-bottom:1px solid rgba(127,127,127,0.4)"),
    ("table[class^=ss-] td.ss-num", FIGURE_CELL),
    ("table[class^=ss-] td.ss-nowrap", LOCATION_CELL),
    ("table[class^=ss-] ul", "margin:0;padding-left:1.2em"),
)


def _scoped(selectors: str) -> str:
    """`selectors` (comma-separated) under each of _SCOPES."""
    return ",".join(scope + one for scope in _SCOPES for one in selectors.split(","))


STYLE = ("<style>" + "".join(f"{_scoped(selectors)}{{{body}}}" for selectors, body in _TABLE_RULES)
         + ".ss-note{color:rgba(127,127,127,0.95);font-size:0.9em}</style>")


# SVG text in JupyterLab's colours, so that it reads in its dark theme too (an SVG's text is black
# unless told): the theme's variables, and where they aren't defined (nbconvert, a viewer) the colour
# of the text around it.
TEXT_FILL = 'style="fill:var(--jp-ui-font-color1, currentColor)"'
FAINT_FILL = 'style="fill:var(--jp-ui-font-color2, gray)"'


def esc(text: object) -> str:
    """`text` for HTML, its control characters written as escapes as a terminal shows them."""
    return html.escape(terminal_lines(str(text)))


def code(text: str) -> str:
    return f"<code>{esc(text)}</code>"


def row(cells: Sequence[str], cls: str = "", numeric: Sequence[int] = (), title: str = "",
        nowrap: Sequence[int] = ()) -> str:
    """One `<tr>` of cells that are already HTML; the columns in `numeric` align right, those in
    `nowrap` stay on one line, and `title` is the row's tooltip (plain text)."""
    def td(k: int, content: str) -> str:
        if k in numeric:
            return f'<td class="ss-num" style="{FIGURE_CELL}">{content}</td>'
        if k in nowrap:
            return f'<td class="ss-nowrap" style="{LOCATION_CELL}">{content}</td>'
        return f'<td style="{TEXT_CELL}">{content}</td>'

    attrs = (f' class="{cls}"' if cls else "") + (f' title="{esc(title)}"' if title else "")
    return f"<tr{attrs}>" + "".join(td(k, c) for k, c in enumerate(cells)) + "</tr>"


def header(cells: Sequence[str]) -> str:
    return "<tr>" + "".join(f'<th style="{TEXT_CELL}">{esc(c)}</th>' for c in cells) + "</tr>"


def section(title: str, width: int) -> str:
    """A heading row across the table, between groups of rows."""
    return f'<tr class="ss-section"><th colspan="{width}" style="{TEXT_CELL}">{esc(title)}</th></tr>'


def table(cls: str, rows: Sequence[str]) -> str:
    """`<table class="CLS">` (an `ss-` class, which STYLE styles) around rows made by `row`,
    `header` and `section`."""
    return f'<table class="{cls}">' + "".join(rows) + "</table>"


def note(text: str) -> str:
    return f'<div class="ss-note">{esc(text)}</div>'
