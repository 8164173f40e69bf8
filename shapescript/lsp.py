"""The language server, `shapescript lsp`: diagnostics and hovers for .ss files in an editor.

It speaks the Language Server Protocol on stdin/stdout through pygls 2. Each time a document is
opened, changed (full sync) or saved, its text is checked as `shapescript check` would check it,
and every diagnostic is published with its code, its span and its label and help lines. The last
program that checked cleanly is kept per document, so hovers keep working while the text has an
error in some other line. docs/editor.md shows how to hook it into an editor.
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from lsprotocol import types as T
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument

from .check.program import Checked
from .codes import CODES
from .errors import CompileError, Diagnostic, Severity, Span, terminal_lines, terminal_text
from .pipeline import check_source

NAME = "shapescript"
# The error index, linked from each diagnostic's code where this is a source checkout (an
# installed package carries no docs, and the project has no web address to point at instead).
ERRORS_MD = Path(__file__).resolve().parent.parent / "docs" / "errors.md"


def _version() -> str:
    try:
        return metadata.version(NAME)
    except metadata.PackageNotFoundError:  # run from a checkout on PYTHONPATH, not installed
        return "dev"


@dataclass(frozen=True)
class Good:
    """The last clean check of a document, and the lines it was checked from."""

    checked: Checked
    lines: tuple[str, ...]


class ShapeScriptServer(LanguageServer):
    def __init__(self) -> None:
        # Full sync: programs are small and checking one takes milliseconds, so the whole text on
        # each change costs nothing and leaves no incremental edits to get wrong.
        super().__init__(NAME, _version(), text_document_sync_kind=T.TextDocumentSyncKind.Full)
        self.good: dict[str, Good] = {}

    # ---- notifications ------------------------------------------------------------------------

    def did_open(self, params: T.DidOpenTextDocumentParams) -> None:
        self.check(params.text_document.uri)

    def did_change(self, params: T.DidChangeTextDocumentParams) -> None:
        self.check(params.text_document.uri)

    def did_save(self, params: T.DidSaveTextDocumentParams) -> None:
        self.check(params.text_document.uri)

    def did_close(self, params: T.DidCloseTextDocumentParams) -> None:
        # A closed file's errors leave the problems list, as in other language servers.
        uri = params.text_document.uri
        self.good.pop(uri, None)
        self.text_document_publish_diagnostics(T.PublishDiagnosticsParams(uri=uri, diagnostics=[]))

    def check(self, uri: str) -> None:
        """Check the document's current text and publish its diagnostics (none when it is clean)."""
        doc = self.workspace.get_text_document(uri)
        try:
            diagnostics = self.diagnose(doc)
        except Exception:  # a bug in the compiler must not take the editor's server down with it
            self.log_failure(f"checking {uri}")
            return  # the diagnostics already shown stay; they are the best we know
        self.text_document_publish_diagnostics(
            T.PublishDiagnosticsParams(uri=uri, diagnostics=diagnostics, version=doc.version))

    def diagnose(self, doc: TextDocument) -> list[T.Diagnostic]:
        source = doc.source
        try:
            checked = check_source(source, file_of(doc.uri), None, None)
        except CompileError as e:
            return [to_lsp(d, doc) for d in (*e.warnings, *e.diagnostics)]
        self.good[doc.uri] = Good(checked, tuple(source.splitlines()))
        return [to_lsp(d, doc) for d in checked.warnings]

    # ---- requests -----------------------------------------------------------------------------

    def hover(self, params: T.HoverParams) -> T.Hover | None:
        try:
            return self.hover_at(params.text_document.uri, params.position)
        except Exception:  # as for checks: log it, answer "nothing here", keep serving
            self.log_failure(f"a hover in {params.text_document.uri}")
            return None

    def hover_at(self, uri: str, position: T.Position) -> T.Hover | None:
        good = self.good.get(uri)
        if good is None:
            return None
        doc = self.workspace.get_text_document(uri)
        at = doc.position_codec.position_from_client_units(doc.lines, position)
        if not still_matches(good.lines, tuple(doc.source.splitlines()), at.line):
            return None
        # Imported here, not at the top: the hover texts are their own module, and a problem in it
        # then costs hovers only, never the diagnostics.
        from .plan.comms_text import hover_text

        text = hover_text(good.checked, at.line + 1, at.character + 1)
        if text is None:
            return None
        return T.Hover(contents=T.MarkupContent(kind=T.MarkupKind.Markdown, value=terminal_lines(text)))

    def log_failure(self, what: str) -> None:
        self.window_log_message(T.LogMessageParams(
            type=T.MessageType.Error,
            message=f"shapescript: internal error in {what}:\n{traceback.format_exc()}"))


def still_matches(good: tuple[str, ...], now: tuple[str, ...], line: int) -> bool:
    """Whether the last clean check still describes `line` (0-based) of the current text: the text
    is the same, or it has as many lines as before and this one is unchanged. An edit that adds or
    removes lines moves everything below it, so then no hover is better than a wrong one."""
    if good == now:
        return True
    return len(good) == len(now) and 0 <= line < len(now) and good[line] == now[line]


def file_of(uri: str) -> str:
    """The path diagnostics name, or the URI itself for an unsaved buffer (`untitled:...`)."""
    return to_fs_path(uri) or uri


def to_lsp(d: Diagnostic, doc: TextDocument) -> T.Diagnostic:
    """A compiler diagnostic as LSP's: 0-based positions, in the client's code units. Its secondary
    labels (where a dim was bound, a declaration) are its related information, in the same document."""
    related = [T.DiagnosticRelatedInformation(location=T.Location(uri=doc.uri, range=lsp_range(span, doc)),
                                              message=terminal_text(text))
               for span, text in d.secondary if span.file == d.span.file]
    return T.Diagnostic(range=lsp_range(d.span, doc), message=message_of(d), severity=SEVERITY[d.severity],
                        code=d.code, code_description=code_link(d.code), source=NAME,
                        related_information=related or None)


def lsp_range(s: Span, doc: TextDocument) -> T.Range:
    """A span as an LSP range: 0-based, in the client's code units."""
    start = T.Position(line=max(s.line - 1, 0), character=max(s.col - 1, 0))
    end = T.Position(line=max(s.end_line - 1, 0), character=max(s.end_col - 1, 0))
    if (end.line, end.character) < (start.line, start.character):
        end = start
    # The checker counts columns in characters; a client may count UTF-16 units (the default).
    return doc.position_codec.range_to_client_units(doc.lines, T.Range(start=start, end=end))


def message_of(d: Diagnostic) -> str:
    """The message, then the label the terminal shows under the caret, then notes and help; user text
    in them as a terminal shows it (an editor may show the message in one)."""
    lines = [d.message]
    if d.label:
        lines.append(d.label)
    lines += [f"note: {n}" for n in d.notes]
    lines += [f"help: {h}" for h in d.help]
    return "\n".join(map(terminal_text, lines))


SEVERITY = {Severity.ERROR: T.DiagnosticSeverity.Error, Severity.WARNING: T.DiagnosticSeverity.Warning}


def code_link(code: str) -> T.CodeDescription | None:
    """A link to the code's entry in docs/errors.md, with the anchor a Markdown viewer gives the
    heading `### E0304: Matrix product of mismatched axes`."""
    entry = CODES.get(code)
    if entry is None or not ERRORS_MD.is_file():
        return None
    slug = re.sub(r"[^\w\- ]", "", f"{entry.code}: {entry.title}".lower()).replace(" ", "-")
    return T.CodeDescription(href=f"{ERRORS_MD.as_uri()}#{slug}")


def create_server() -> ShapeScriptServer:
    server = ShapeScriptServer()
    handlers: dict[str, Callable[[Any], Any]] = {
        T.TEXT_DOCUMENT_DID_OPEN: server.did_open,
        T.TEXT_DOCUMENT_DID_CHANGE: server.did_change,
        T.TEXT_DOCUMENT_DID_SAVE: server.did_save,
        T.TEXT_DOCUMENT_DID_CLOSE: server.did_close,
        T.TEXT_DOCUMENT_HOVER: server.hover,
    }
    for method, handler in handlers.items():
        server.feature(method)(_plain(handler))
    return server


def _plain(handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A function calling a bound method: pygls marks its handlers with attributes, which a bound
    method can't take."""
    def call(params: Any) -> Any:
        return handler(params)
    return call


def serve() -> int:
    """Speak LSP on stdin/stdout until the client sends `exit` or its input ends (stdin closed, or
    never open: then at once). The exit status: 0, or 2 when there is no stdout to answer on
    (pygls's start_io returns at the end of input, and takes the SystemExit its `exit` raises)."""
    if sys.stdin is None:  # started with its stdin closed: no client, and nothing will ever come
        return 0
    if sys.stdout is None:
        if sys.stderr is not None:
            print("error: shapescript lsp answers on stdout, which is closed", file=sys.stderr)
        return 2
    out = sys.stdout.buffer
    # stdout carries the protocol; a stray print anywhere in the compiler would corrupt it, so
    # everything else written to stdout goes to stderr, which editors show as the server's log.
    sys.stdout = sys.stderr
    create_server().start_io(sys.stdin.buffer, out)  # returns at the end of input too
    return 0
