"""The notebook's program without a kernel: cells adding up, diagnostics in cell terms, the names
bound in the notebook, all on one device (the workers are test_kernel.py's)."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from support import ROOT

from shapescript.notebook.cells import DEVICES, Cell, merge, split_cell
from shapescript.notebook.report import CellCompileError
from shapescript.notebook.session import PROGRAM_VARIABLE, Session


class Notebook:
    """A Session and its namespace, with cells numbered as Jupyter numbers them."""

    def __init__(self) -> None:
        self.ns: dict[str, Any] = {}
        self.session = Session(self.ns)
        self.count = 0

    def cell(self, source: str) -> list[str]:
        self.count += 1
        return self.session.run_cell(Cell(f"cell [{self.count}]", "%%shapescript\n" + source, first_line=2))

    def failing(self, source: str) -> CellCompileError:
        with pytest.raises(CellCompileError) as info:
            self.cell(source)
        return info.value


@contextmanager
def opened(source: str) -> Iterator[Notebook]:
    """A Notebook with `source` as its first cell, whose workers (if any) stop when the block ends."""
    notebook = Notebook()
    try:
        notebook.cell(source)
        yield notebook
    finally:
        notebook.session.shutdown()


@pytest.fixture
def nb() -> Notebook:
    return Notebook()


def test_a_cell_splits_into_items_with_their_comments_and_lines() -> None:
    source = ("%%shapescript\ndevices cpu[0 1]:\n    shard params\n\n# the width\ndim D = 4\n\n"
              "fn f(x: [D]) -> [D]:\n    # twice\n    return x * 2.0\n# a comment at the end\n")
    chunks = split_cell(Cell("cell [1]", source, first_line=2))
    assert [(c.key, c.kind, c.first) for c in chunks] == [(DEVICES, "devices", 2), ("D", "dim", 5), ("f", "fn", 8)]
    assert chunks[0].text == "devices cpu[0 1]:\n    shard params"  # the options are the devices line's
    assert chunks[1].text == "# the width\ndim D = 4"
    assert chunks[2].text.endswith("return x * 2.0")


def test_a_later_definition_replaces_in_place_and_lines_map_back() -> None:
    one = split_cell(Cell("cell [1]", "%%shapescript\ndim D = 4\nfn f(x: [D]) -> [D] = x\n", 2))
    items, _ = merge({}, one)
    two = split_cell(Cell("cell [2]", "%%shapescript\n\nfn f(x: [D]) -> [D]:\n    return x * 2.0\n", 2))
    items, draft = merge(items, two)
    assert list(items) == ["D", "f"] and items["f"].cell.label == "cell [2]"
    assert draft.source == "dim D = 4\n\nfn f(x: [D]) -> [D]:\n    return x * 2.0\n"
    chunk, line = draft.locate(4)  # type: ignore[misc]
    assert (chunk.cell.label, line) == ("cell [2]", 4)
    assert draft.locate(2) is None  # the blank line between items


def test_rerunning_a_cell_replaces_its_function(nb: Notebook) -> None:
    nb.cell("fn f(x: [3]) -> [3] = x * 2.0\n")
    first = nb.ns["f"]
    assert nb.ns["f"](torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
    nb.cell("fn f(x: [3]) -> [3] = x * 3.0\n")
    assert nb.ns["f"] is not first and nb.ns["f"](torch.ones(3)).tolist() == [3.0, 3.0, 3.0]
    assert nb.ns[PROGRAM_VARIABLE].f is nb.ns["f"]


def test_a_failing_cell_changes_nothing(nb: Notebook) -> None:
    nb.cell("dim D = 4\nmodel M:\n    param w: [D D] = zeros()\nfn f(m: M, x: [D]) -> [D] = x @ m.w\n")
    before = dict(nb.ns)
    items, program = dict(nb.session.items), nb.session.program
    error = nb.failing("fn f(m: M, x: [D]) -> [D] = x @ m.nope\nfn g(x: [D]) -> [D] = x\n")
    assert error.codes and nb.ns == before and nb.session.items == items and nb.session.program is program
    assert "g" not in nb.ns
    syntax = nb.failing("fn g(x: [D]) -> [D]\n    return x\n")
    assert syntax.codes == ["E0105"] and "--> cell [3]:2:" in str(syntax)
    assert nb.ns == before


def test_a_diagnostic_in_an_earlier_cell_names_that_cell(nb: Notebook) -> None:
    nb.cell("fn k(x: [3]) -> [3] = x\n")
    nb.cell("fn h(x: [3]) -> [3]:\n    return k(x)\n")
    error = nb.failing("fn k(x: [4]) -> [4] = x\n")
    text = str(error)
    assert "--> cell [2]:3:" in text and "3 |     return k(x)" in text, text
    assert "cell [3]" in error.summary()
    assert all(d.span.file == "cell [2]" for d in error.diagnostics)


def test_locations_in_messages_point_at_cells(nb: Notebook) -> None:
    nb.cell("dim D = 4\n")
    error = nb.failing("fn f(x: [D]) -> [D] = x\nfn f(x: [D]) -> [D] = x * 2.0\n")
    assert error.codes == ["E0202"]
    assert "the first is at cell [2]:2:4" in str(error)  # not the notebook program's line
    assert "notebook.ss" not in str(error)


def test_the_html_shows_the_snippet_and_the_explanation(nb: Notebook) -> None:
    error = nb.failing("fn f(x: [3]) -> [4] = x\n")
    page = error.display_object()._repr_html_()
    assert "<details>" in page and f"docs/errors.md#{error.codes[0].lower()}" in page
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    assert "2 | fn f(x: [3]) -> [4] = x" in text
    assert repr(error.display_object()) == str(error)
    assert error._render_traceback_() == [error.summary()]


def test_names_the_user_reassigned_are_kept_unless_redefined(nb: Notebook) -> None:
    nb.cell("fn loss(x: [3]) -> [3] = x\nfn g(x: [3]) -> [3] = x\n")
    nb.ns["loss"] = 0.25  # a Python variable that happens to share the name
    nb.cell("fn h(x: [3]) -> [3] = g(x)\n")
    assert nb.ns["loss"] == 0.25 and nb.ns["g"] is nb.ns[PROGRAM_VARIABLE].g
    nb.cell("fn loss(x: [3]) -> [3] = x * 2.0\n")  # defined again: bound again
    assert nb.ns["loss"] is nb.ns[PROGRAM_VARIABLE].loss
    nb.session.reset()
    assert not {"loss", "g", "h", PROGRAM_VARIABLE} & nb.ns.keys()
    assert nb.session.source() == "The notebook's ShapeScript program is empty."


def test_devices_magic_sets_the_devices_line_and_a_cell_can_replace_it(nb: Notebook) -> None:
    with pytest.raises(ValueError, match="devices must be written as in a program"):
        nb.session.set_devices("gpu[0]")
    nb.cell("devices cpu\nfn f(x: [3]) -> [3] = x\n")
    assert nb.session.set_devices("cpu") == []
    assert nb.session.items[DEVICES].cell.label == "%shapescript devices"
    assert "# from %shapescript devices" in nb.session.source()
    nb.cell("devices cpu\n")
    assert nb.session.items[DEVICES].cell.label == "cell [2]"
    assert "no workers" in nb.session.status().text
    assert nb.session.stop() == ["No workers are running."]


def test_changing_a_model_says_which_models_are_old(nb: Notebook) -> None:
    nb.cell("model M:\n    param w: [3] = zeros()\n")
    nb.ns["m"] = nb.ns["M"].init(seed=0)
    notes = nb.cell("model M:\n    param w: [3] = zeros()\n    param v: [3] = ones()\n")
    assert notes == ["model M changed: m was made from its old definition; make new models with M.init(seed=...)."]


def test_the_source_shows_each_item_with_its_cell(nb: Notebook) -> None:
    nb.cell("dim D = 4\n")
    nb.cell("\nfn f(x: [D]) -> [D] = x\n")
    assert nb.session.source().splitlines()[1:] == [
        "  | # from cell [1], line 2", "1 | dim D = 4", "2 |",
        "  | # from cell [2], line 3", "3 | fn f(x: [D]) -> [D] = x"]


def test_a_function_python_cannot_call_compiles_and_says_so_when_called(nb: Notebook) -> None:
    nb.cell("model M:\n    param w: [3] = zeros()\n")
    nb.cell("fn f(g: Grad[M]) -> int = 1\n")  # ShapeScript functions may call it
    with pytest.raises(ValueError, match="`f`'s parameter `g` of type Grad\\[M\\] can't be passed from Python"):
        nb.ns["f"](None)


def test_importing_shapescript_leaves_ipython_alone() -> None:
    code = "import sys, shapescript; assert 'IPython' not in sys.modules, 'IPython was imported'"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


def test_generic_models_and_a_precision_line_in_cells(nb: Notebook) -> None:
    nb.cell("precision f64\ndim D = 3\ndim C = 2\n")
    nb.cell("model Linear[I O]:\n    param w: [I O] = normal(std=0.5)\n\nmodel Net:\n    a: Linear[D C]\n\n"
            "fn linear(m: Linear[i o], x: [b i]) -> [b o] = x @ m.w\n")
    assert "Linear" in nb.ns and "Linear[D C]" not in nb.ns  # the generic model, its uses by its dims
    m = nb.ns["Net"].init(seed=0)
    assert m.a.w.dtype == torch.float64 and nb.ns["Linear"]["D", "C"].init(seed=0).w.shape == (3, 2)
    x = torch.ones(4, 3, dtype=torch.float64)
    torch.testing.assert_close(nb.ns["linear"](m.a, x), x @ m.a.w)
    nb.cell("precision f64\n")  # the line again, in a later cell: it replaces the first
    assert nb.ns["Net"].init(seed=0).a.w.dtype == torch.float64
