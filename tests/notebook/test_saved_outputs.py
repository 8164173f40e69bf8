"""What a saved notebook keeps of the progress bars and the live charts: a notebook run by nbclient
(as `jupyter nbconvert --execute` runs one) holds, beside each widget's view, the bars at 100% and
the charts as SVG, in text/html and text/plain, so a viewer without the widgets' state shows the
end of the run, not its start. The counts are checked against the batches the dataset makes and
the records the sink received."""

from __future__ import annotations

import json
import math
import re

import nbformat
import pytest
from nbformat import NotebookNode
from programs import LINEAR, epochs_of
from test_notebooks import WIDGET_VIEW, execute, python3_kernel

ITEMS, TRAIN_BATCH, EVAL_BATCH, PASSES = 21, 8, 5, 3  # LINEAR's `fit` loops over shuffled batches of 8
PROGRAM = LINEAR + epochs_of(PASSES, EVAL_BATCH)

CELLS = [
    "%load_ext shapescript\nimport json, torch\nimport shapescript as ss",
    "%%shapescript\n" + PROGRAM,
    # One call: a training loop run PASSES times and an evaluation loop, with a live chart.
    f"m = Lin.init(seed=0)\nopt = ss.adamw(m, lr=0.1)\n"
    f"data = ss.TensorDataset(x=torch.randn({ITEMS}, 4), y=torch.randint(0, 3, ({ITEMS},)))\n"
    f"sink = ss.sinks.live(log=('loss',))\ntotal = epochs(m, opt, data, sink)\n"
    f"print(json.dumps(len(sink.records)))",
    # An epoch loop written in Python: PASSES calls in one cell.
    f"for n in range({PASSES}):\n    fit(m, opt, data, ss.sinks.memory())",
]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> NotebookNode:
    folder = tmp_path_factory.mktemp("saved")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    path = folder / "bars.ipynb"
    nbformat.write(nb, path)
    ran = execute(path, python3_kernel(folder / "kernelspec"))
    saved = folder / "saved.ipynb"  # as it is written to disk and read back
    nbformat.write(ran, saved)
    return nbformat.read(saved, as_version=4)


def displays(cell: NotebookNode, cls: str) -> list[int]:
    """The indices of the cell's displays whose HTML has an element of class `cls`."""
    return [k for k, out in enumerate(cell.outputs)
            if out.output_type == "display_data" and f'class="{cls}"' in out.data.get("text/html", "")]


def bar_counts(text: str) -> list[tuple[int, int, int]]:
    return [tuple(map(int, m)) for m in re.findall(r"(\d+)/(\d+) (\d+)%", text)]  # type: ignore[misc]


@pytest.mark.slow
def test_a_saved_notebook_shows_the_bars_at_the_end_of_the_call(ran: NotebookNode) -> None:
    train, evaluation = math.ceil(ITEMS / TRAIN_BATCH), math.ceil(ITEMS / EVAL_BATCH)
    cell = ran.cells[2]
    [bars] = displays(cell, "ss-bars")  # one output for the call's bars, not one a pass
    out = cell.outputs[bars]
    # Closed, the bars leave their widget out: JupyterLab would draw it rather than the HTML.
    assert WIDGET_VIEW not in out.data
    assert bar_counts(out.data["text/html"]) == [(train, train, 100), (evaluation, evaluation, 100)]
    assert f"Ex batches, pass {PASSES}: <progress" in out.data["text/html"]
    lines = out.data["text/plain"].splitlines()
    assert [re.findall(r"(\d+)/(\d+)", line) for line in lines] == [[(str(train), str(train))],
                                                                   [(str(evaluation), str(evaluation))]]
    assert all("100%" in line for line in lines)
    # The chart came after the bars, and no bar after it: it sits below them, not between them.
    [chart] = displays(cell, "ss-live")
    assert chart > bars


@pytest.mark.slow
def test_a_saved_notebook_has_the_live_chart_as_svg_and_text(ran: NotebookNode) -> None:
    cell = ran.cells[2]
    records = json.loads(next(o.text for o in cell.outputs if o.output_type == "stream"))
    assert records == PASSES * math.ceil(ITEMS / TRAIN_BATCH)  # a record a training batch
    [chart] = displays(cell, "ss-live")
    out = cell.outputs[chart]
    assert WIDGET_VIEW not in out.data
    [svg] = re.findall(r"<svg.*?</svg>", out.data["text/html"])  # one logged number: loss
    line = re.search(r'<polyline[^>]* points="([^"]*)"', svg)
    assert line is not None and len(line.group(1).split()) == records  # every record, not the first
    assert "log scale" in svg and f"step {records}</text>" in svg
    assert out.data["text/plain"].startswith(f"live charts of the logged numbers, {records} records")


@pytest.mark.slow
def test_a_python_epoch_loop_in_one_cell_shows_one_bar(ran: NotebookNode) -> None:
    train = math.ceil(ITEMS / TRAIN_BATCH)
    cell = ran.cells[3]
    [bars] = displays(cell, "ss-bars")
    out = cell.outputs[bars]
    assert bar_counts(out.data["text/html"]) == [(train, train, 100)]
    assert f"Ex batches, pass {PASSES}: <progress" in out.data["text/html"]
    assert out.data["text/plain"].count("100%") == 1 and f"{train}/{train}" in out.data["text/plain"]
