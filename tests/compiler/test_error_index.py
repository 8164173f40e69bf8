"""Every error code: documented, explained, raised by its own example, with a golden message."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import ROOT, assert_golden

from shapescript.codes import BUILD_ONLY, CODES, NO_PYTHON_ONLY, explain, markdown
from shapescript.errors import CompileError, Severity
from shapescript.pipeline import check_source, python_module

GOLDEN = ROOT / "tests" / "golden"


def compile_example(code: str) -> CompileError:
    """The example's diagnostics: an error's CompileError; for a warning, one holding the warnings
    of the program, which must compile (and build)."""
    example = CODES[code].example
    if CODES[code].severity is Severity.WARNING:
        checked = check_source(example, f"{code}.ss")
        python_module(checked)
        return CompileError(list(checked.warnings), example)
    with pytest.raises(CompileError) as info:
        checked = check_source(example, f"{code}.ss", python=code not in NO_PYTHON_ONLY)
        if code in BUILD_ONLY:
            python_module(checked, standalone=True)
    return info.value


@pytest.mark.parametrize("code", sorted(CODES))
def test_example_raises_exactly_its_code(code: str) -> None:
    err = compile_example(code)
    assert set(err.codes) == {code}, str(err)
    d = err.diagnostics[0]
    assert d.line >= 1 and d.column >= 1 and d.message
    assert all(x.severity is CODES[code].severity for x in err.diagnostics)
    assert code[0] == ("W" if CODES[code].severity is Severity.WARNING else "E")


@pytest.mark.parametrize("code", sorted(CODES))
def test_example_says_what_to_do(code: str) -> None:
    """rustc/Elm style: every error ends with a `= help:` line that is a way out, not the error again."""
    err = compile_example(code)
    d = err.diagnostics[0]
    helps = [line.split("= help:", 1)[1].strip() for line in str(err).splitlines() if "= help:" in line]
    assert helps, f"{code}'s example prints no help line:\n{err}"
    restated = {d.message.casefold(), d.label.casefold()}
    assert any(len(h.split()) >= 2 and h.casefold() not in restated and h.casefold() not in d.message.casefold()
               for h in helps), f"{code}'s help only restates the error: {helps}"


@pytest.mark.parametrize("code", sorted(CODES))
def test_golden_message(code: str) -> None:
    assert_golden(str(compile_example(code)) + "\n", GOLDEN / f"{code}.txt")


def test_a_missing_golden_file_fails_and_is_written_only_when_asked(tmp_path) -> None:
    missing = tmp_path / "E9999.txt"
    with pytest.raises(AssertionError, match="no golden file .*SHAPESCRIPT_UPDATE_GOLDEN=1"):
        assert_golden("error[E9999]: new\n", missing, update=False)
    assert not missing.exists()
    assert_golden("error[E9999]: new\n", missing, update=True)
    assert missing.read_text() == "error[E9999]: new\n"
    with pytest.raises(AssertionError, match="differs"):
        assert_golden("error[E9999]: changed\n", missing, update=False)


def test_every_code_has_a_golden_file_and_no_stale_ones() -> None:
    files = {p.stem for p in GOLDEN.glob("[EW]*.txt")}
    assert files == set(CODES)


def test_docs_error_index_is_generated_from_the_registry() -> None:
    assert (ROOT / "docs" / "errors.md").read_text() == markdown()


def test_every_code_raised_in_the_sources_is_registered() -> None:
    import re
    raised = set()
    for path in (ROOT / "shapescript").rglob("*.py"):
        raised |= set(re.findall(r'"([EW]\d{4})"', path.read_text()))
    assert raised - set(CODES) == set(), "codes raised but not documented"


def test_explain_on_the_command_line() -> None:
    out = subprocess.run([sys.executable, "-m", "shapescript.cli", "explain", "E0304"], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 0
    assert out.stdout == explain("E0304")
    assert "Matrix product" in out.stdout and "x @ w" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "shapescript.cli", "explain", "E9999"], capture_output=True,
                         text=True, cwd=ROOT)
    assert bad.returncode == 1 and "no error code E9999" in bad.stderr


# What the manual's error index (its chapter 18) lists for each code, case by case: `explain` says each.
INDEX_CASES = {
    "E1801": ["Sums, means, cross_entropy", "`@`, matmul, einsum and reduce with sum", "any other reduction over",
              "an operation along it", "softmax", "sort", "indexing or slicing it", "causal with it"],
    "E1802": ["grouping it with another axis", "`(b d)`", "the batch axis twice", "a batch of a fixed size",
              "the batch's size used as a number", "that device's part's size",
              "a value with the batch axis passed to a parameter without a shape", "can't arise in ShapeScript",
              "Five cases"],
    "E1803": ["loops over a dataset", "prints", "saves", "loads", "writes to a sink", "calls Python",
              "any function that calls one", "`value_and_grad`", "`update`", "changing a model's field",
              "run on the workers"],
    "E1804": ["compiled once", "every call must give it one", "without the batch axis is whole on every device"],
    "E1805": ["controller that starts a worker per device", "shapescript package's runtime", "`--standalone`",
              "doesn't use the package"],
}


@pytest.mark.parametrize("code", sorted(INDEX_CASES))
def test_explain_says_each_case_the_manuals_index_lists(code: str) -> None:
    text = explain(code)
    missing = [case for case in INDEX_CASES[code] if case not in text]
    assert not missing, f"`shapescript explain {code}` leaves out {missing}"
    assert CODES[code].example.startswith("devices cuda["), "the index's examples run on cuda devices"
    assert f"```ss-{'build-' if code in BUILD_ONLY else ''}error {code}\n{CODES[code].example}" in markdown()
