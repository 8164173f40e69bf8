"""Run-time errors of the notebook's program, called from Python cells: shown in the cells' terms
(the `%%shapescript` cell, its line and that line's text) without the package's frames, with the
whole traceback a `%tb` away. In-process through a Session, then in a real kernel on `cpu` and
on `cpu[0 1]`, where the error is raised on the workers."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from test_kernel import ANSI, TIMEOUT, Kernel, kernel  # noqa: F401  (kernel: the module's own kernel fixture)

from shapescript.errors import ShapeError
from shapescript.notebook.cells import Cell
from shapescript.notebook.report import FULL_TRACEBACK
from shapescript.notebook.session import Session

DIMS = "dim D = 4\n"
# A function whose `x` doesn't take a [b 5] tensor, and one whose extern fn (torch.ravel, which
# flattens) returns a result of the wrong shape: a ShapeError raised inside the generated code.
FNS = ("\n"
       "fn double(x: [b D]) -> [b D]:\n"
       "    return x * 2.0\n"
       "\n"
       "extern fn flat(x: [b D]) -> [b D] = \"torch.ravel\"\n"
       "\n"
       "fn flattened(x: [b D]) -> [b D]:\n"
       "    y = flat(x)\n"
       "    return y * 2.0\n")
CELL = "%%shapescript\n" + FNS


def cell_line(needle: str) -> tuple[int, str]:
    """The line of CELL (counting its `%%shapescript` line as 1) that holds `needle`, and its text."""
    for number, text in enumerate(CELL.split("\n"), 1):
        if needle in text:
            return number, text
    raise AssertionError(needle)


def loaded() -> tuple[Session, dict[str, Any]]:
    """A session that has run the dims' cell, then CELL as cell [2]; and its namespace."""
    ns: dict[str, Any] = {}
    session = Session(ns)
    session.run_cell(Cell("cell [1]", "%%shapescript\n" + DIMS, first_line=2))
    session.run_cell(Cell("cell [2]", CELL, first_line=2))
    return session, ns


def test_a_wrong_argument_names_its_cell_and_line() -> None:
    session, ns = loaded()
    with pytest.raises(ShapeError) as info:
        ns["double"](torch.ones(3, 5))
    assert "notebook.ss:" in str(info.value)  # the program's own terms, which the notebook translates
    lines = session.error_lines(info.value)
    number, text = cell_line("fn double(")
    column = text.index("x: [b D]") + 1
    assert lines[0].startswith(f"ShapeError: `x` of `double` (cell [2], line {number}): expected [b D]")
    assert f"{number} | {text}" in lines
    assert lines[lines.index(f"{number} | {text}") + 1].endswith(" " * (column - 1) + "^")  # under `x`
    assert not any("notebook.ss" in line for line in lines) and lines[-1] == FULL_TRACEBACK


def test_a_check_inside_the_generated_code_names_the_calls_it_passed() -> None:
    session, ns = loaded()
    with pytest.raises(ShapeError) as info:
        ns["flattened"](torch.ones(3, 4))
    lines = session.error_lines(info.value)
    extern, extern_text = cell_line("extern fn flat(")
    call, call_text = cell_line("y = flat(x)")
    assert lines[0] == f"ShapeError: `result` of `flat` (cell [2], line {extern}): expected [b D] with D = 4, got shape [12]"
    assert f"{call} | {call_text}" in lines  # the caret at the line that failed
    assert f"  in `flat` at cell [2], line {extern}: {extern_text.strip()}" in lines


def shapescript_cell(kernel: Kernel, source: str) -> int:
    """Run a `%%shapescript` cell; its execution count, as the notebook labels it."""
    reply = kernel.client.execute_interactive("%%shapescript\n" + source, timeout=TIMEOUT, output_hook=lambda m: None)
    assert reply["content"]["status"] == "ok", reply["content"]
    return int(reply["content"]["execution_count"])


def shown_error(kernel: Kernel, code: str) -> str:
    run = kernel.run(code)
    assert run.status == "error" and run.error is not None
    return run.traceback


@pytest.mark.parametrize("devices", ["cpu", "cpu[0 1]"])
def test_a_kernel_shows_the_cell_not_the_packages_frames(kernel: Kernel, devices: str) -> None:
    kernel.ok("%shapescript reset")
    shapescript_cell(kernel, f"devices {devices}\n" + DIMS)
    count = shapescript_cell(kernel, FNS)

    shown = shown_error(kernel, "double(torch.ones(3, 5))")  # checked by the controller
    number, text = cell_line("fn double(")
    assert f"ShapeError: `x` of `double` (cell [{count}], line {number})" in shown
    assert f"{number} | {text}" in shown and "%tb" in shown
    assert "shapescript/" not in shown and "Traceback" not in shown
    whole = kernel.run("%tb")  # the same error, whole
    whole_text = whole.traceback + ANSI.sub("", whole.stdout)
    assert "guards.py" in whole_text and f"`x` of `double` (cell [{count}], line {number})" in whole_text
    assert "notebook.ss:" not in whole_text  # the cells' lines there too

    shown = shown_error(kernel, "flattened(torch.ones(4, 4))")  # on cpu[0 1], raised on each worker
    extern, extern_text = cell_line("extern fn flat(")
    assert f"ShapeError: `result` of `flat` (cell [{count}], line {extern})" in shown
    failed, failed_text = cell_line("y = flat(x)")  # the caret: the line that failed
    assert f"--> cell [{count}], line {failed}\n" in shown and f"{failed} | {failed_text}" in shown, shown
    assert f"in `flat` at cell [{count}], line {extern}: {extern_text.strip()}" in shown
    assert "shapescript/" not in shown and not re.search(r"worker \d+'s traceback", shown)
    kernel.ok("%shapescript reset")
