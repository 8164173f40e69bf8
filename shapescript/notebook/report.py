"""What a failed `%%shapescript` cell shows: the diagnostics, each in its own cell's terms; and what
a run-time error of the notebook's program shows, in the same terms.

The checker sees the notebook's whole program, so its spans are lines of that program. Each one
maps back to the cell the line came from and the line's number in that cell ("cell [3]:4:12"); a
diagnostic about an earlier cell's item names that cell. The result renders as rustc-style text
(terminal IPython, the error's traceback) and as HTML (Jupyter), with the error index's entry for
each code.
A run-time error (a ShapeError from a Python cell's call) names its place in the program's message
("notebook.ss:12:5"); `runtime_error_lines` says it as the cell and its line.
"""

from __future__ import annotations

import dataclasses
import html
import re
from collections.abc import Sequence

from ..codes import CODES
from ..errors import CompileError, Diagnostic, ShapeScriptError, Span, shown_columns, terminal_lines, terminal_text
from .cells import Cell, Draft


@dataclasses.dataclass(frozen=True)
class Located:
    """A diagnostic with its span in a cell's lines, and that cell (None: the program's own text)."""

    diagnostic: Diagnostic
    cell: Cell | None

    def text(self, fallback_source: str) -> str:
        rendered = self.diagnostic.render(self.cell.source if self.cell is not None else fallback_source)
        if self.diagnostic.code in CODES:
            rendered += f"\n  = more: %shapescript explain {self.diagnostic.code}"
        return rendered


def locate_all(error: CompileError, draft: Draft, program_name: str) -> list[Located]:
    """Every diagnostic of `error` (raised on `draft`'s text) in its own cell's terms."""
    return [locate(d, draft, program_name) for d in error.diagnostics]


def locate(d: Diagnostic, draft: Draft, program_name: str) -> Located:
    """`d` (a diagnostic of `draft`'s text) in its own cell's terms."""
    found = draft.locate(d.span.line)
    if found is None:  # not inside any item (the whole program, its end): say it as is
        return Located(d, None)
    chunk, line = found
    end = draft.locate(d.span.end_line)
    if end is not None and end[0] is chunk:
        end_line, end_col = end[1], d.span.end_col
    else:  # a span across items: the first line only
        end_line, end_col = line, d.span.col + 1
    where = Span(chunk.cell.label, line, d.span.col, end_line, end_col)

    def mention(m: re.Match[str]) -> str:  # "the first is at notebook.ss:12:5" -> "... at cell [2]:3:5"
        hit = draft.locate(int(m.group(1)))
        return f"{hit[0].cell.label}:{hit[1]}:{m.group(2)}" if hit else m.group(0)

    pattern = re.compile(re.escape(program_name) + r":(\d+):(\d+)")

    def fix(text: str) -> str:
        return pattern.sub(mention, text)

    moved = dataclasses.replace(d, span=where, message=fix(d.message), label=fix(d.label),
                                help=tuple(map(fix, d.help)), notes=tuple(map(fix, d.notes)),
                                secondary=tuple((_in_cell(s, draft), fix(t)) for s, t in d.secondary))
    return Located(moved, chunk.cell)


def _in_cell(span: Span, draft: Draft) -> Span:
    """A secondary label's span in its own cell's terms (its first line), as the primary's."""
    found = draft.locate(span.line)
    if found is None:
        return span
    end_col = span.end_col if span.end_line == span.line else span.col + 1
    return Span(found[0].cell.label, found[1], span.col, found[1], end_col)


class CellCompileError(CompileError):
    """A `%%shapescript` cell (or `%shapescript devices`) that doesn't compile. Nothing changed: the
    notebook's program and names are as before. `diagnostics` are in the cells' own lines; IPython
    shows the short `_render_traceback_` after the diagnostics displayed above it."""

    def __init__(self, located: list[Located], program_source: str, where: str) -> None:
        super().__init__([x.diagnostic for x in located], None)
        self.located = located
        self.program_source = program_source
        self.where = where
        parts = [x.text(program_source) for x in located]
        if len(located) > 1:
            parts.append(f"error: {len(located)} errors found")
        self.rendered = "\n\n".join(parts)
        self.args = (self.rendered,)

    def summary(self) -> str:
        n = len(self.located)
        errors = "1 error" if n == 1 else f"{n} errors"
        return f"CompileError: {errors} in {self.where}; the program and its names are as they were before"

    def _render_traceback_(self) -> list[str]:
        # IPython prints these lines instead of a traceback of our own frames (the cell still fails).
        return [self.summary()]

    def display_object(self) -> Rich:
        blocks = "".join(_diagnostic_html(x, self.program_source) for x in self.located)
        return Rich(self.rendered, f'<div class="shapescript-diagnostics">{blocks}</div>')


class NotebookError(ShapeScriptError):
    """A %shapescript command that failed, said in its message's lines rather than a traceback of the
    extension's frames (with the notes of the error it stands for, such as a worker's traceback)."""

    def _render_traceback_(self) -> list[str]:
        lines = [*str(self).split("\n"), *getattr(self.__cause__, "__notes__", ())]
        return [terminal_text(line) for line in lines]


_WORKER_TRACEBACK = re.compile(r"worker \d+'s traceback")  # a note of pool.py's: internal frames, for %tb
FULL_TRACEBACK = "The whole traceback, with ShapeScript's own frames: %tb"


class CellPlaces:
    """Says each of a program's places in a text ("notebook.ss:12:5") as the cell and its line
    ("cell [3], line 2"), as the cells showed them; `said` collects each place said (cell, line,
    column), in order."""

    def __init__(self, draft: Draft, program_name: str) -> None:
        self.draft = draft
        self.pattern = re.compile(re.escape(program_name) + r":(\d+):(\d+)")
        self.said: list[tuple[Cell, int, int]] = []

    def __call__(self, text: str) -> str:
        return self.pattern.sub(self._mention, text)

    def _mention(self, m: re.Match[str]) -> str:
        hit = self.draft.locate(int(m.group(1)))
        if hit is None:
            return m.group(0)
        self.said.append((hit[0].cell, hit[1], int(m.group(2))))
        return f"{hit[0].cell.label}, line {hit[1]}"


def runtime_error_lines(error: BaseException, draft: Draft, program_name: str,
                        calls: Sequence[tuple[str, Span]] = (), failed_at: Span | None = None) -> list[str]:
    """What a run-time error of the notebook's program shows instead of its traceback: `Type: message`
    with each `notebook.ss:12:5` said as "cell [3], line 2", the text of the line that failed with a
    caret at its column (`failed_at` where known, as a worker's innermost call; else the message's
    first place), the program's functions it passed through (`calls`, innermost first), the notes
    that aren't a worker's traceback, and how to see the whole traceback."""
    in_cells = CellPlaces(draft, program_name)
    notes = [n for n in getattr(error, "__notes__", ()) if not _WORKER_TRACEBACK.match(n)]
    said = str(error)
    if not said and notes:  # an interrupt's message is its note: what became of the step and the models
        said = notes.pop(0)
    message = in_cells(f"{type(error).__name__}: {said}")
    places = in_cells.said[:1]
    notes = [in_cells(n) for n in notes]
    hit = draft.locate(failed_at.line) if failed_at is not None else None
    if hit is not None and failed_at is not None:
        places = [(hit[0].cell, hit[1], failed_at.col)]
    lines = message.split("\n")
    shown: set[tuple[Cell, int]] = set()
    if places:
        cell, line, col = places[0]
        width = len(str(line))
        text, at = shown_columns(_cell_line(cell, line).rstrip())
        lines += [f"{'':>{width}}--> {cell.label}, line {line}", f"{'':>{width}} |",
                  f"{line} | {text}", f"{'':>{width}} | {' ' * (at(col) - 1)}^"]
        shown.add((cell, line))
    for fn_name, span in reversed(calls):
        hit = draft.locate(span.line)
        if hit is not None and (hit[0].cell, hit[1]) not in shown:  # the line above says it already
            lines.append(f"  in `{fn_name}` at {hit[0].cell.label}, line {hit[1]}: {_cell_line(hit[0].cell, hit[1]).strip()}")
    for note in notes:
        lines += note.split("\n")
    return [terminal_text(line) for line in [*lines, FULL_TRACEBACK]]


def _cell_line(cell: Cell, line: int) -> str:
    return cell.source.split("\n")[line - 1]


class Rich:
    """Text and HTML of one thing: Jupyter shows `_repr_html_`, a terminal `__repr__`."""

    def __init__(self, text: str, html_text: str) -> None:
        self.text, self.html = text, html_text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return self.html


_RED = "color:#c4161c"
_PRE = "margin:0.2em 0 0.3em 0;padding:0.3em 0.6em;background:rgba(127,127,127,0.08);line-height:1.3"


def _diagnostic_html(x: Located, program_source: str) -> str:
    # The snippet is the plain-text rendering itself, so the caret lines up exactly as in a terminal.
    rest = x.text(program_source).partition("\n")[2]
    d = x.diagnostic
    out = [f'<div style="margin-bottom:0.8em"><div><b style="{_RED}">{d.severity.value}[{html.escape(d.code)}]</b>'
           f"<b>: {html.escape(terminal_text(d.message))}</b></div>",
           f'<pre style="{_PRE}">{html.escape(rest)}</pre>']
    entry = CODES.get(d.code)
    if entry is not None:
        example = html.escape(terminal_lines(entry.example.rstrip()))  # W0106's is bidi text
        out.append(f"<details><summary>{html.escape(entry.code)}: {html.escape(entry.title)} "
                   f"(<code>%shapescript explain {html.escape(entry.code)}</code>, "
                   f"docs/errors.md#{entry.code.lower()})</summary>"
                   f"<p>{_inline_code(entry.explanation)}</p><p>For example:</p>"
                   f'<pre style="{_PRE}">{example}</pre>'
                   f"<p>{_inline_code(entry.fix)}</p></details>")
    out.append("</div>")
    return "".join(out)


_CODE_SPAN = re.compile(r"`([^`]+)`")


def _inline_code(text: str) -> str:
    return _CODE_SPAN.sub(lambda m: f"<code>{m.group(1)}</code>", html.escape(text))


def render_rows(title: str, header: list[str], rows: list[list[str]], notes: list[str]) -> Rich:
    """A small table with a title and notes below, for `%shapescript status`."""
    widths = [max(len(h), *(len(r[k]) for r in rows)) if rows else len(h) for k, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    text = "\n".join([title, *([line(header), *map(line, rows)] if rows else []), *notes])

    def cell(tag: str, s: str) -> str:
        return f'<{tag} style="text-align:left">{html.escape(s)}</{tag}>'

    table = ("<table><tr>" + "".join(cell("th", h) for h in header) + "</tr>"
             + "".join("<tr>" + "".join(cell("td", c) for c in r) + "</tr>" for r in rows) + "</table>")
    body = "".join(f"<div>{html.escape(n)}</div>" for n in notes)
    return Rich(text, f"<div><b>{html.escape(title)}</b>{table if rows else ''}{body}</div>")
