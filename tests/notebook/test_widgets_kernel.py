"""The widgets in a real kernel (test_kernel.py's helpers): the placement and communication table
after a cell on several devices, a model's table, the progress bar and the live sink."""

from __future__ import annotations

import re

import pytest
from programs import LINEAR
from test_kernel import MLP, Kernel, Run, cell, fresh, kernel  # noqa: F401  (the fixtures)

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

FIT = LINEAR  # its `fit` loops over batches of 8 and writes the loss to a sink
TRAIN = ("m = Lin.init(seed=0)\nsink = ss.sinks.live()\n"
         "data = ss.TensorDataset(x=torch.randn(21, 4), y=torch.randint(0, 3, (21,)))\n"
         "fit(m, ss.adamw(m, lr=0.1), data, sink)\nprint(json.dumps(len(sink.records)))")


def widgets(run: Run) -> list[dict]:
    return [b for b in run.bundles if WIDGET_VIEW in b]


@pytest.mark.slow
def test_a_cell_on_two_devices_shows_the_placement_table(fresh: Kernel) -> None:
    one = fresh.ok(cell(MLP))
    assert widgets(one) == []  # one device: nothing to show
    moved = fresh.ok("%shapescript devices cpu[0 1]")
    # A closed <details> panel of HTML, not an ipywidget: it shows the same in a notebook opened again
    # without the widgets' state; the report's text for a terminal.
    assert widgets(moved) == []
    [shown] = [b for b in moved.bundles if "ss-device-table" in b.get("text/html", "")]
    assert "<details>" in shown["text/html"] and "Placement and communication on cpu[0 1]" in shown["text/html"]
    assert shown["text/plain"].startswith("notebook.ss on cpu[0 1]: no batches(n) gives a batch size")
    assert "813,072 bytes (794 KiB) between the 2 devices" in shown["text/plain"]
    assert '<table class="ss-device-table">' in shown["text/html"]
    assert re.search(r"cell \[\d+\], line 21", shown["text/html"])  # train_step's line, in its cell
    again = fresh.ok(cell("fn predict(m: Mlp, x: [b D]) -> [b C] = relu(x @ m.w1) @ m.w2\n"))
    assert [b for b in again.bundles if "ss-device-table" in b.get("text/html", "")] and widgets(again) == []
    result = fresh.ok("ss_program.device_table")
    assert result.plain[-1].startswith("notebook.ss on cpu[0 1]")
    assert '<details open>' in result.html[-1] and '<table class="ss-device-table">' in result.html[-1]
    fresh.ok("%shapescript reset")


def test_a_model_shows_its_table(fresh: Kernel) -> None:
    fresh.ok(cell(MLP))
    run = fresh.ok("Mlp.init(seed=0)")
    assert '<table class="ss-model-table">' in run.html[-1] and "[784, 256]" in run.html[-1]
    assert run.plain[-1] == "Mlp(w1: [784, 256] f32, w2: [256, 10] f32)"
    box = fresh.ok("from shapescript.notebook.widgets import model_widget\nmodel_widget(Mlp.init(seed=0))")
    assert len(widgets(box)) == 1
    # Beside the widget's view, the table's HTML and the model's text: what nbconvert and a viewer show
    # of a notebook saved without the widgets' state.
    assert '<table class="ss-model-table">' in box.html[-1] and box.plain[-1] == run.plain[-1]


def test_a_loop_shows_a_progress_bar_and_the_live_chart(fresh: Kernel) -> None:
    fresh.ok(cell(FIT))
    run = fresh.ok(TRAIN)
    assert run.value() == 3
    assert len(widgets(run)) == 2  # the call's bars (one loop: one bar), then the sink's charts
    assert "<polyline" in fresh.ok("print(sink.html())").stdout
    fresh.ok("%shapescript progress off")
    try:
        assert len(widgets(fresh.ok(TRAIN))) == 1  # the charts only
    finally:
        fresh.ok("%shapescript progress on")
