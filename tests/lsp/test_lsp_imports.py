"""The language server reads a program and never imports what its `python fn` and `extern fn` name:
opening, editing and hovering over such a program leaves the module unimported."""

from __future__ import annotations

from pathlib import Path

from test_lsp import expected_range, fn_name_position, server

MODULE = """\
import pathlib

pathlib.Path(__file__).with_name("imported.marker").write_text("imported")
raise SystemExit("imported")


def double(x):
    return x * 2
"""

PROGRAM = """\
devices cpu[0 1]

dim D = 3

python fn answer() -> [] = "marking_lsp.answer"

extern fn double(x: [n D]) -> [n D] = "marking_lsp.double"

fn twice(x: [b D]) -> [b D] = double(x)
"""


def test_the_language_server_never_imports_what_a_program_names(tmp_path: Path) -> None:
    # The server runs in tmp_path, so `marking_lsp` could be imported from there, leaving a marker.
    (tmp_path / "marking_lsp.py").write_text(MODULE)
    uri = (tmp_path / "prog.ss").as_uri()
    with server(tmp_path) as client:
        client.open(uri, PROGRAM)
        assert client.diagnostics(uri, 1) == []
        assert client.hover(uri, *fn_name_position(PROGRAM, "twice"))["contents"]["value"]
        at = expected_range(PROGRAM, 'double(x: [n D])')["start"]
        client.hover(uri, at["line"], at["character"])  # over the extern fn's declaration
        client.change(uri, 2, PROGRAM.replace("devices cpu[0 1]", "devices cpu[0 1 2]"))
        assert client.diagnostics(uri, 2) == []
        assert client.hover(uri, *fn_name_position(PROGRAM, "twice"))["contents"]["value"]
    assert not (tmp_path / "imported.marker").exists()
