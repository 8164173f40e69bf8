"""The exceptions and diagnostics every stage shares.

A compile-time problem is a `Diagnostic` (rustc style: a code, a message, a span, a label and help
lines); `CompileError` carries a list of them. Run-time problems are typed exceptions that name the
.ss location they come from. This module imports only the standard library, so a standalone build
can inline it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    def of(cls, devices: str, hosts: int, workers: int) -> "ClusterNeededError":
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


@dataclass(frozen=True, slots=True)
class Span:
    """A region of a source file: 1-based line and column, end exclusive."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def to(self, other: "Span") -> "Span":
        """The span from the start of this one to the end of `other`."""
        return Span(self.file, self.line, self.col, other.end_line, other.end_col)


@dataclass(frozen=True)
class Diagnostic:
    """One error. `secondary` holds rustc's secondary labels: other places the error involves, such
    as where a dim was bound, each a span and its text, underlined with `-` under the primary's `^`."""

    code: str
    message: str
    span: Span
    label: str = ""
    help: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    secondary: tuple[tuple[Span, str], ...] = ()

    @property
    def line(self) -> int:
        return self.span.line

    @property
    def column(self) -> int:
        return self.span.col

    def render(self, source: str | None) -> str:
        """The rustc-style text: header, location, each line an annotation is on (in line order) with
        its underlines and labels, then notes and help lines. A secondary label whose line can't be
        shown (another file, no source) becomes a note naming its place."""
        out = [f"error[{self.code}]: {self.message}", f"  --> {self.span}"]
        lines = source.splitlines() if source is not None else []

        def shown(span: Span) -> bool:
            return span.file == self.span.file and 0 < span.line <= len(lines)

        marks = [_Mark(self.span, self.label, "^")] if shown(self.span) else []
        marks += [_Mark(span, text, "-") for span, text in self.secondary if shown(span) and marks]
        elsewhere = [f"{span}: {text}" for span, text in self.secondary if not (shown(span) and marks)]
        if marks:
            out += _snippet(marks, lines)
        for note in (*self.notes, *elsewhere):
            out.append(f"  = note: {note}")
        for line in self.help:
            out.append(f"  = help: {line}")
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
        text = lines[number - 1].expandtabs(1)
        out.append(f"{str(number).ljust(width)} | {text}")
        out += [f"{pad} | {row}".rstrip() for row in _underlines(by_line[number], len(text))]
    return out


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
    """The program has errors; `str()` is the rendered diagnostics."""

    diagnostics: list[Diagnostic]
    source: str | None = None
    rendered: str = field(init=False, default="")

    def __post_init__(self) -> None:
        parts = [d.render(self.source) for d in self.diagnostics]
        n = len(self.diagnostics)
        if n > 1:
            parts.append(f"error: {n} errors found")
        self.rendered = "\n\n".join(parts)
        super().__init__(self.rendered)

    def __str__(self) -> str:
        return self.rendered

    @property
    def codes(self) -> list[str]:
        return [d.code for d in self.diagnostics]
