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
    code: str
    message: str
    span: Span
    label: str = ""
    help: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def line(self) -> int:
        return self.span.line

    @property
    def column(self) -> int:
        return self.span.col

    def render(self, source: str | None) -> str:
        """The rustc-style text: header, location, the line with a caret, help lines."""
        out = [f"error[{self.code}]: {self.message}", f"  --> {self.span}"]
        lines = source.splitlines() if source is not None else []
        if 0 < self.span.line <= len(lines):
            text = lines[self.span.line - 1].expandtabs(1)
            gutter = str(self.span.line)
            pad = " " * len(gutter)
            end = self.span.end_col if self.span.end_line == self.span.line else len(text) + 1
            width = max(1, end - self.span.col)
            out.append(f"{pad} |")
            out.append(f"{gutter} | {text}")
            caret = " " * (self.span.col - 1) + "^" * width
            out.append(f"{pad} | {caret}{(' ' + self.label) if self.label else ''}")
        for note in self.notes:
            out.append(f"  = note: {note}")
        for line in self.help:
            out.append(f"  = help: {line}")
        return "\n".join(out)


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
