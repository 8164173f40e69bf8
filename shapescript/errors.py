"""The exceptions and diagnostics every stage shares.

A compile-time problem is a `Diagnostic` (rustc style: a code, a message, a span, a label and help
lines); `CompileError` carries a list of them. Run-time problems are typed exceptions that name the
.ss location they come from. This module imports only the standard library, so a standalone build
can inline it.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace


class ShapeScriptError(Exception):
    """Base of every error ShapeScript raises for a user's mistake."""


class ShapeError(ShapeScriptError, ValueError):
    """A tensor's shape or dtype differs from the type the program declares."""


class DomainError(ShapeScriptError, ValueError):
    """A value lies outside its declared domain, as a label outside `Index[C]`."""


class WorkerError(ShapeScriptError, RuntimeError):
    """A device worker stopped or did not answer."""


class ClusterNeededError(WorkerError):
    """A devices line naming several hosts (`2 x cuda[0 1]`), run with no cluster to place its
    workers on. Raised where the workers would start; compiling and checking need no cluster."""

    @classmethod
    def of(cls, devices: str, hosts: int, workers: int) -> ClusterNeededError:
        return cls(
            f"`devices {devices}` names {hosts} hosts, so its {workers} workers need a cluster to run on, and "
            f"none is given. Connect one before the first call: `ss.cluster(\"ray://head:10001\")` (a Ray "
            f"cluster's address), `ss.cluster(\"auto\")` (RAY_ADDRESS, or a Ray cluster running on this "
            f"machine), or `%shapescript cluster ...` in a notebook; Ray comes with "
            f"`pip install 'shapescript[ray]'`. To run on this machine alone, name one host's devices, "
            f"as `devices {devices.partition(' x ')[2] or devices}`.")


class DeviceError(ShapeScriptError, RuntimeError):
    """The machine can't give what a program asks of its devices: a CUDA device that isn't visible,
    or more memory than there is."""


def terminal_text(text: str, keep: str = "\t") -> str:
    """`text` as a terminal may show it: every character a terminal (or an editor, or a notebook's
    text output) would act on or hide, instead of showing it, is written as its escape (`\\x1b`,
    `\\r`, `\\u202e`). That is every character Python calls unprintable: C0 and C1 controls, DEL,
    line and paragraph separators, the bidirectional controls and other format characters, spaces
    other than ' ' and unassigned code points, save those in `keep` (a tab; a line break where
    the text is several lines of our own). The one rule for user text (a source line, a name, a
    file name, a message quoting them) on its way to anyone's screen; escaping twice changes
    nothing."""
    if text.isprintable():
        return text  # the common case, at C speed
    return "".join(ch if ch.isprintable() or ch in keep else ch.encode("unicode_escape").decode("ascii")
                   for ch in text)


def terminal_lines(text: str) -> str:
    """`terminal_text` of text of several lines of our own (a report, a rendered diagnostic): its
    line breaks and tabs kept, every other control written as its escape."""
    return terminal_text(text, keep="\t\n")


def shown_columns(line: str) -> tuple[str, Callable[[int], int]]:
    """A source line as a snippet shows it (a tab as one space, each other character as
    `terminal_text` writes it), and the function from a 1-based column of the line to the column it
    is shown at (past the line's end, one column a column), so that a caret under an escaped
    character lines up with its escape."""
    pieces = [" " if ch == "\t" else terminal_text(ch) for ch in line]
    starts = list(itertools.accumulate(map(len, pieces), initial=1))

    def at(col: int) -> int:
        return starts[col - 1] if col <= len(starts) else starts[-1] + col - len(starts)
    return "".join(pieces), at


class Severity(enum.Enum):
    """How a diagnostic counts: an error stops the program; a warning is shown and it still runs."""

    ERROR = "error"
    WARNING = "warning"


class SourceWarning(UserWarning):
    """A compiler warning (a `Diagnostic` of severity WARNING), issued through Python's warnings by
    `ss.load` and `ss.build`; its message is the rendered diagnostic."""


@dataclass(frozen=True, slots=True)
class Span:
    """A region of a source file: 1-based line and column, end exclusive."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:  # in messages: a file's name is user text
        return f"{terminal_text(self.file)}:{self.line}:{self.col}"

    def to(self, other: Span) -> Span:
        """The span from the start of this one to the end of `other`."""
        return Span(self.file, self.line, self.col, other.end_line, other.end_col)


@dataclass(frozen=True)
class Diagnostic:
    """One error, or a warning (`severity`). `secondary` holds rustc's secondary labels: other places
    the error involves, such as where a dim was bound, each a span and its text, underlined with `-`
    under the primary's `^`."""

    code: str
    message: str
    span: Span
    label: str = ""
    help: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    secondary: tuple[tuple[Span, str], ...] = ()
    severity: Severity = Severity.ERROR

    @property
    def line(self) -> int:
        return self.span.line

    @property
    def column(self) -> int:
        return self.span.col

    def render(self, source: str | None) -> str:
        """The rustc-style text: header, location, each line an annotation is on (in line order) with
        its underlines and labels, then notes and help lines. A secondary label whose line can't be
        shown (another file, no source) becomes a note naming its place. User text in any of them
        (the source line, a file's name, a name quoted in the message) is `terminal_text`'s."""
        out = [f"{self.severity.value}[{self.code}]: {terminal_text(self.message)}", f"  --> {self.span}"]
        # Lines as the lexer counts them: only `\n` ends one (`splitlines` would end one at a form
        # feed or U+2028 in a comment too, and show the wrong line).
        lines = [line.removesuffix("\r") for line in source.removesuffix("\n").split("\n")] if source else []

        def shown(span: Span) -> bool:
            return span.file == self.span.file and 0 < span.line <= len(lines)

        marks = [_Mark(self.span, terminal_text(self.label), "^")] if shown(self.span) else []
        marks += [_Mark(span, terminal_text(text), "-") for span, text in self.secondary if shown(span) and marks]
        elsewhere = [f"{span}: {text}" for span, text in self.secondary if not (shown(span) and marks)]
        if marks:
            out += _snippet(marks, lines)
        for note in (*self.notes, *elsewhere):
            out.append(f"  = note: {terminal_text(note)}")
        for line in self.help:
            out.append(f"  = help: {terminal_text(line)}")
        return "\n".join(out)


@dataclass(frozen=True)
class _Mark:
    """One underline of a snippet: `^` for the primary span, `-` for a secondary one."""

    span: Span
    label: str
    char: str


def _snippet(marks: list[_Mark], lines: list[str]) -> list[str]:
    """The annotated lines, rustc's layout: a gutter as wide as the largest line number, `...` where
    lines are skipped; on each line, one row of underlines with the rightmost label after it, and
    the labels further left hung below their underlines on `|`."""
    by_line: dict[int, list[_Mark]] = {}
    for m in marks:
        by_line.setdefault(m.span.line, []).append(m)
    width = len(str(max(by_line)))
    pad = " " * width
    out = [f"{pad} |"]
    previous: int | None = None
    for number in sorted(by_line):
        if previous is not None and number > previous + 1:
            out.append("...")
        previous = number
        text, at = shown_columns(lines[number - 1])
        out.append(f"{str(number).ljust(width)} | {text}")
        marks_here = [_shown_at(m, at) for m in by_line[number]]
        out += [f"{pad} | {row}".rstrip() for row in _underlines(marks_here, len(text))]
    return out


def _shown_at(mark: _Mark, at: Callable[[int], int]) -> _Mark:
    """`mark` with its columns where the shown line has them (`at`, from `shown_columns`)."""
    span = mark.span
    end_col = at(span.end_col) if span.end_line == span.line else span.end_col
    return replace(mark, span=replace(span, col=at(span.col), end_col=end_col))


def _underlines(marks: list[_Mark], text_width: int) -> list[str]:
    """The rows under one source line: the underlines, then the hanging labels, right to left."""
    marks = sorted(marks, key=lambda m: (m.span.col, m.char == "^"))  # at one column, the primary last
    row: list[str] = []
    for m in marks:
        end = m.span.end_col if m.span.end_line == m.span.line else text_width + 1
        start, length = m.span.col - 1, max(1, end - m.span.col)
        row += [" "] * max(0, start + length - len(row))
        for k in range(start, start + length):
            if row[k] == " " or m.char == "^":  # the primary's underline wins where two overlap
                row[k] = m.char
    last = marks[-1]
    rows = ["".join(row) + (f" {last.label}" if last.label else "")]
    hanging = [m for m in marks[:-1] if m.label]
    if hanging:
        rows.append(_bars([m.span.col - 1 for m in hanging]))
    for i in range(len(hanging) - 1, -1, -1):
        m = hanging[i]
        rows.append(_bars([h.span.col - 1 for h in hanging[:i]], m.span.col - 1) + m.label)
    return rows


def _bars(columns: list[int], width: int | None = None) -> str:
    """A row with `|` at each column, as long as `width` (the start of a label) when given."""
    size = max([c + 1 for c in columns] + [width or 0])
    row = [" "] * size
    for c in columns:
        row[c] = "|"
    return "".join(row)


@dataclass
class CompileError(ShapeScriptError):
    """The program has errors; `str()` is the rendered diagnostics, after the warnings found before
    them (`warnings`, which `codes` doesn't list)."""

    diagnostics: list[Diagnostic]
    source: str | None = None
    warnings: tuple[Diagnostic, ...] = ()
    rendered: str = field(init=False, default="")

    def __post_init__(self) -> None:
        parts = [d.render(self.source) for d in (*self.warnings, *self.diagnostics)]
        n = sum(d.severity is Severity.ERROR for d in self.diagnostics)
        if n > 1:
            parts.append(f"error: {n} errors found")
        self.rendered = "\n\n".join(parts)
        super().__init__(self.rendered)

    def __str__(self) -> str:
        return self.rendered

    @property
    def codes(self) -> list[str]:
        return [d.code for d in self.diagnostics]


# The program's functions a worker's error came through there, outermost first, as (name, .ss line,
# column): put on the error the controller raises (parallel/failures.py), read by the notebook.
_WORKER_PLACES = "_shapescript_worker_places"


def note_worker_places(exc: BaseException, places: list[tuple[str, int, int]]) -> None:
    setattr(exc, _WORKER_PLACES, [tuple(p) for p in places])


def worker_places(exc: BaseException) -> list[tuple[str, int, int]]:
    return list(getattr(exc, _WORKER_PLACES, ()))
