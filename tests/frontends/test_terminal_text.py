"""User text reaches a screen as text: a control character in a source line, a
name, a string or a file's name is shown as its escape by the command line, the diagnostics, the
language server and the notebook, with the caret still under what it points at; and W0106 warns of
a text-direction character (U+202E...) in a comment or a string, as rustc's text_direction lints do.

What counts as a control here is said by Unicode's categories (Cc, Cf, Zl, Zp), not by the
escaping code's own rule."""

from __future__ import annotations

import json
import unicodedata
import warnings
from pathlib import Path

import pytest

import shapescript as ss
from shapescript.cli import main
from shapescript.errors import CompileError
from shapescript.pipeline import check_source

ESC_SEQUENCES = "\x1b[2J\x1b]0;pwned\x07\x9b31m\x7f\x08\x00"  # clear, retitle + BEL, C1 CSI, DEL, BS, NUL
GOOD = "dim D = 4\n\nfn f(x: [b D]) -> [b D]:\n    return x * 2.0\n"
WARNED = GOOD.replace("x * 2.0", "x * 2.0  # \u202e")  # a right-to-left override in line 4's comment
RLO_COLUMN = WARNED.split("\n")[3].index("\u202e") + 1


def controls(text: str) -> list[str]:
    """The characters of `text` a terminal would act on or hide: Unicode's controls, format
    characters and line or paragraph separators, but a line break and a tab."""
    return [ch for ch in text if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") and ch not in "\n\t"]


def shown(text: str) -> str:
    """`text` as the tests expect it shown: each control as Python writes it in a str literal."""
    return "".join(repr(ch)[1:-1] if controls(ch) else ch for ch in text)


def diagnostics(source: str) -> CompileError:
    with pytest.raises(CompileError) as info:
        check_source(source, "t.ss")
    return info.value


def caret_under(rendered: str, line: str) -> int:
    """The column (0-based, in the shown line) of the first `^` under the snippet line `line`."""
    lines = rendered.split("\n")
    at = lines.index(line)
    gutter = line.index("| ") + 2
    return lines[at + 1].index("^") - gutter


# ---- diagnostics ------------------------------------------------------------------------------

def test_a_comment_with_escape_sequences_is_shown_escaped() -> None:
    source = f"fn f(x: [n]) -> [n] = y  # {ESC_SEQUENCES}\n"
    text = str(diagnostics(source))
    assert controls(text) == [], repr(text)
    assert f"1 | fn f(x: [n]) -> [n] = y  # {shown(ESC_SEQUENCES)}" in text.split("\n")
    assert "\\x1b[2J\\x1b]0;pwned\\x07\\x9b31m\\x7f\\x08\\x00" in text  # each one visible, none dropped


def test_the_caret_stays_under_its_character_after_escaped_ones() -> None:
    # A carriage return is blank to the lexer; shown as `\r`, it widens the line before `y`.
    raw = "fn f(x: [n]) -> [n] = x +\r\r y"
    text = str(diagnostics(raw + "\n"))
    line = f"1 | {shown(raw)}"
    assert controls(text) == [] and line in text.split("\n")
    assert caret_under(text, line) == shown(raw).index(" y") + 1
    assert "unknown name `y`" in text


def test_a_control_character_in_code_is_an_error_that_quotes_it_escaped() -> None:
    # Names are ASCII, so an ESC in one is E0101, whose message quotes the character.
    for ch, shown_as in [("\x1b", "\\x1b"), ("\x07", "\\x07"), ("\x9b", "\\x9b"), ("\u202e", "\\u202e"),
                         ("\x0c", "\\x0c")]:
        raw = f"fn f{ch}g(x: [n]) -> [n] = x"
        error = diagnostics(raw + "\n")
        text = str(error)
        assert error.codes == ["E0101"] and controls(text) == [], repr(text)
        assert f"unexpected character `{shown_as}`" in text
        line = f"1 | {shown(raw)}"
        assert caret_under(text, line) == raw.index(ch)
        assert text.split("\n")[text.split("\n").index(line) + 1].count("^") == len(shown_as)


def test_a_string_with_controls_is_quoted_escaped() -> None:
    raw = 'extern fn g(x: [n]) -> [n] = "\x1b]0;x\x07"'
    text = str(diagnostics(f"{raw}\nfn f(x: [n]) -> [n] = g(x, x)\n"))
    assert controls(text) == [], repr(text)


def test_the_snippet_shows_the_line_the_lexer_counts() -> None:
    # Only `\n` ends a line: a form feed or U+2028 in a comment doesn't make the error's line another.
    source = "# one\x0ctwo\u2028three\nfn f(x: [n]) -> [n] = y\n"
    text = str(diagnostics(source))
    assert "2 | fn f(x: [n]) -> [n] = y" in text.split("\n")
    assert controls(text) == []


# ---- the command line ------------------------------------------------------------------------

def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_file_name_with_controls_is_shown_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = "a\x1b]0;pwned\x07b\x9b2J.ss"
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir(), bad.mkdir()
    (good / name).write_text(GOOD)
    (bad / name).write_text("fn f(x: [n]) -> [n] = y\n")
    for argv, expected_code in [(("check", str(good / name)), 0), (("check", str(bad / name)), 1),
                                (("comms", str(good / name)), 0), (("build", str(bad / name)), 1),
                                (("check", str(tmp_path / name)), 2),  # no such file
                                (("build", str(good / name), "-o", str(tmp_path / f"{name}.py")), 0)]:
        code, out, err = run_cli(capsys, *argv)
        assert code == expected_code, (argv, err)
        assert controls(out + err) == [], (argv, out + err)
        assert shown(name) in out + err, (argv, out + err)


def test_run_and_explain_quote_their_arguments_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.ss").write_text(GOOD)
    code, out, err = run_cli(capsys, "run", str(tmp_path / "p.ss"), "f\x1b[2J")
    assert code == 1 and controls(out + err) == [] and "`f\\x1b[2J`" in err
    code, out, err = run_cli(capsys, "explain", "E\x1b]0;x\x07")
    assert code == 1 and controls(out + err) == [] and "E\\x1b]0;x\\x07" in err


def test_comms_json_stays_json_without_raw_controls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = "devices cpu[0 1]\n\n" + GOOD.replace("x * 2.0", "x * 2.0  # \x9b2J \u202e")
    name = tmp_path / "c\x9b.ss"
    name.write_text(source)
    code, out, err = run_cli(capsys, "comms", str(name), "--json")
    assert code == 0 and controls(out) == [], out
    assert json.loads(out)["file"] == str(name)  # JSON's own escapes: the same text, read back


# ---- W0106: text direction -------------------------------------------------------------------

def test_a_text_direction_character_in_a_comment_or_a_string_is_a_warning() -> None:
    source = ('fn s(x: [n]) -> str = "a\u2066b"\n'
              "# \u202eerongi\u202c\n"
              "fn f(x: [n]) -> [n] = x  # ok \u2067\n")
    checked = check_source(source, "t.ss")  # it compiles
    where = [(number, col) for number, line in enumerate(source.split("\n"), 1)
             for col, ch in enumerate(line, 1) if unicodedata.bidirectional(ch) in ("LRI", "RLI", "RLO", "PDF")]
    assert [(w.code, w.span.line, w.span.col, w.span.end_col) for w in checked.warnings] == \
        [("W0106", line, col, col + 1) for line, col in where]
    assert len(where) == 4
    first = checked.warnings[0]
    assert "U+2066" in first.message and "a string" in first.message and first.help
    assert "U+202E" in checked.warnings[1].message and "a comment" in checked.warnings[1].message
    text = first.render(source)
    assert text.startswith("warning[W0106]: ") and f"  --> t.ss:1:{where[0][1]}" in text and controls(text) == []
    assert diagnostics("fn f(x: [n]) -> [n] = x \u202e\n").codes == ["E0101"]  # outside comments and strings


def test_the_command_line_and_load_show_the_warning_and_run(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.ss"
    path.write_text(WARNED)
    code, out, err = run_cli(capsys, "check", str(path))
    assert code == 0 and f"{path}: ok" in out
    assert err.startswith("warning[W0106]: U+202E") and f"  --> {path}:4:{RLO_COLUMN}" in err and controls(err) == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prog = ss.load(path)
    assert [str(w.message).split(":")[0] for w in caught] == ["warning[W0106]"]
    assert issubclass(caught[0].category, UserWarning)
    assert prog.f is not None  # it loaded


# ---- the language server, in process -----------------------------------------------------------

def lsp_diagnostics(source: str) -> list:
    pytest.importorskip("pygls")
    from pygls.workspace import TextDocument

    from shapescript.lsp import ShapeScriptServer
    return ShapeScriptServer().diagnose(TextDocument("file:///tmp/t.ss", source))


def test_the_language_server_sends_text_and_warns_of_text_direction() -> None:
    for source in [f"fn f(x: [n]) -> [n] = y  # {ESC_SEQUENCES}\n", "fn f\x1b]0;t\x07(x: [n]) -> [n] = x\n",
                   'extern fn g(x: [n]) -> [n] = "\x1b]0;x\x07"\nfn f(x: [n]) -> [n] = g(x, x)\n']:
        found = lsp_diagnostics(source)
        assert found and all(controls(d.message) == [] for d in found), [d.message for d in found]
    from lsprotocol import types as T
    [warning] = lsp_diagnostics(WARNED)
    assert warning.code == "W0106" and warning.severity == T.DiagnosticSeverity.Warning
    assert (warning.range.start.line, warning.range.start.character) == (3, RLO_COLUMN - 1)
    assert controls(warning.message) == [] and "U+202E" in warning.message


# ---- the notebook, without a kernel ------------------------------------------------------------

def test_the_notebook_shows_diagnostics_and_run_time_errors_as_text() -> None:
    import torch

    from shapescript.errors import ShapeError
    from shapescript.notebook.cells import Cell
    from shapescript.notebook.report import CellCompileError
    from shapescript.notebook.session import Session

    ns: dict = {}
    session = Session(ns)
    with pytest.raises(CellCompileError) as info:
        session.run_cell(Cell("cell [1]", f"%%shapescript\nfn f(x: [n]) -> [n] = y  # {ESC_SEQUENCES}\n", 2))
    html_text = info.value.display_object()._repr_html_()
    assert controls(str(info.value)) == [] and controls(html_text) == []
    # A bidi character in a comment: the cell runs, and says W0106 at its own line.
    notes = session.run_cell(Cell("cell [2]", "%%shapescript\n" + WARNED.replace("fn f(x:", "fn f(\r\rx:"), 2))
    assert [n.split(":")[0] for n in notes if "W0106" in n] == ["warning[W0106]"]
    assert f"  --> cell [2]:5:{RLO_COLUMN}" in notes[0] and controls(notes[0]) == []
    with pytest.raises(ShapeError) as error:
        ns["f"](torch.ones(3, 5))
    lines = session.error_lines(error.value)
    assert controls("\n".join(lines)) == [], lines
    raw = "fn f(\r\rx: [b D]) -> [b D]:"
    [line] = [k for k, text in enumerate(lines) if text.endswith(shown(raw))]
    assert lines[line + 1].index("^") - lines[line].index("fn f") == shown(raw).index("x:")
