"""The notebook's widgets without a kernel: the placement and communication table (against the
DeviceTable's own numbers), a model's table and values on demand, the progress hook on loops over
batches, and the live sink. test_widgets_kernel.py shows them in a real kernel."""

from __future__ import annotations

import html
import re
import textwrap
import time
import types
from html.parser import HTMLParser
from typing import Any

import pytest
import sympy
import torch
from IPython.core.formatters import DisplayFormatter
from support import ROOT

import shapescript as ss
from shapescript.devices import DeviceSet
from shapescript.notebook import markup as M
from shapescript.notebook import progress
from shapescript.notebook.cells import Cell
from shapescript.notebook.device_table import DeviceTableView, compact_place
from shapescript.notebook.live import LiveSink, charts_html, svg_chart
from shapescript.notebook.magic import _show_models
from shapescript.notebook.models import model_html, summary
from shapescript.notebook.session import Session
from shapescript.notebook.widgets import Shown, device_table_widget, model_widget, show_device_table
from shapescript.parallel.loading import RemoteBatch, RemoteBatches
from shapescript.parallel.remote import RemoteModel
from shapescript.plan.comms import device_table
from shapescript.plan.comms_text import report
from shapescript.plan.sizes_text import bytes_text, number_text
from shapescript.runtime import loops
from shapescript.runtime.loops import batches, shuffle

README = ROOT / "examples" / "readme" / "mlp.ss"

FIT = textwrap.dedent("""\
    dim D = 4
    dim C = 3

    data Ex:
        x: [D]
        y: [] Index[C]

    model Layer:
        param w: [D C] = normal(std=0.1)
        param b: [C] = zeros()

    model Lin:
        layers: [2] Layer
        param w: [D C] = normal(std=0.1)
        buffer steps: [] i64 = zeros()

    fn loss(m: Lin, batch: [b] Ex) -> [] = cross_entropy(batch.x @ m.w, batch.y, over=C)

    fn step(mut m: Lin, mut opt: AdamW[Lin], batch: [b] Ex) -> []:
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, g)
        return l

    fn fit(mut m: Lin, mut opt: AdamW[Lin], data: Dataset[Ex], log: Sink):
        for batch in data |> shuffle(seed=1) |> batches(8):
            write(log, logs(loss=step(mut m, mut opt, batch), seen=batch.x))
    """)
LEAVES = {"layers.0.w": [4, 3], "layers.0.b": [3], "layers.1.w": [4, 3], "layers.1.b": [3], "w": [4, 3],
          "steps": []}


def dataset(n: int = 21) -> ss.TensorDataset:
    g = torch.Generator().manual_seed(0)
    return ss.TensorDataset(x=torch.randn(n, 4, generator=g), y=torch.randint(0, 3, (n,), generator=g))


class Rows(HTMLParser):
    """The text of each cell of each `<tr>` of a given class."""

    def __init__(self, page: str, cls: str) -> None:
        super().__init__()
        self.cls, self.rows, self.cell = cls, [], None  # type: ignore[var-annotated]
        self.inside = False
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.inside = dict(attrs).get("class") == self.cls
            if self.inside:
                self.rows.append([])
        elif tag == "td" and self.inside:
            self.cell = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self.inside and self.cell is not None:
            self.rows[-1].append(self.cell.strip())
            self.cell = None

    def handle_data(self, text: str) -> None:
        if self.cell is not None:
            self.cell += text


def rows(page: str, cls: str) -> list[list[str]]:
    return Rows(page, cls).rows


# -- the placement and communication table --------------------------------------------------------

@pytest.fixture(scope="module")
def readme() -> ss.Program:
    return ss.load(README, devices="cpu[0 1]")  # the workers start only when something runs


def test_the_table_widget_holds_the_device_tables_rows(readme: ss.Program) -> None:
    table = readme.device_table
    widget = device_table_widget(table)
    assert widget.titles == ("Placement and communication on cpu[0 1] — a batch of 64 splits 32/32",)
    assert widget.selected_index is None  # closed until opened
    page = widget.children[0].value
    assert '<table class="ss-device-table">' in page
    # Its display carries the table's HTML and text beside the view, for nbconvert and viewers.
    bundle = widget._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == DeviceTableView.of(table).text() and "train_step" in bundle["text/plain"]
    assert '<table class="ss-device-table">' in bundle["text/html"]
    fns, models, lines = rows(page, "ss-fn"), rows(page, "ss-model"), rows(page, "ss-line")
    assert [r[1] for r in fns] == list(table.fns) == ["forward", "loss", "train_step", "run"]
    assert [r[1] for r in models] == ["Mlp"] and len(lines) == len(table.lines) == 3
    # Each figure is the table's own, worded as comms_text words it.
    step = dict((r[1], r) for r in fns)["train_step"]
    assert int(table.fns["train_step"].bytes) == 813_072
    assert step[2] == "on the workers: it uses tensors" and step[3] == bytes_text(table.fns["train_step"].bytes)
    assert step[3] == "813,072 bytes (794 KiB)"
    assert models[0][2:] == ["a copy on every device", "813,056 bytes (794 KiB)"]
    by_line = {int(r[0]): r for r in lines}
    assert sorted(by_line) == sorted(table.lines)
    grads = next(s.collective for s in table.lines[23][0].sent if not s.via)
    assert (int(grads.count), grads.dtype) == (203_264, "f32")
    assert by_line[23][1] == "l, g = value_and_grad(loss, m, batch)"
    assert f"{number_text(grads.count)} × f32 = 813,056 bytes (794 KiB)" in by_line[23][2]
    assert "203,264 × f32" in by_line[23][2] and by_line[23][3] == "813,072 bytes (794 KiB)"
    assert "2 × f32 = 8 bytes" in by_line[20][2]


def test_the_table_shows_itself_as_html_and_as_the_comms_report(readme: ss.Program) -> None:
    view = DeviceTableView.of(readme)
    assert repr(view) == view.text() == report(readme.checked)  # `shapescript comms`'s text
    page = view._repr_html_()
    assert page.count('<table class="ss-device-table">') == 1 and "<details open>" in page
    assert DeviceTableView.of(readme.device_table).table_html().count("<tr") == view.table_html().count("<tr")
    shown = show_device_table(view)  # outside a kernel: no widget, the text and the HTML
    assert isinstance(shown, Shown) and shown.widget is None
    assert shown._repr_mimebundle_() == {"text/plain": view.text(), "text/html": view.html()}
    with pytest.raises(TypeError, match="expected a DeviceTable"):
        DeviceTableView.of(42)  # type: ignore[arg-type]


def test_one_device_has_no_lines_that_send() -> None:
    view = DeviceTableView.of(ss.load(README, devices="cpu"))
    assert view.title() == "Placement on cpu: one device, nothing is sent between devices" and not view.several
    page = view.table_html()
    assert rows(page, "ss-line") == [] and len(rows(page, "ss-fn")) == 4
    assert rows(page, "ss-model")[0][2:] == ["on cpu", "813,056 bytes (794 KiB)"]


def test_a_place_is_shortened_only_when_it_is_a_cells_line() -> None:
    assert compact_place("cell [12], line 7") == "cell 12:7"
    assert compact_place("%shapescript devices, line 1") == "%shapescript devices, line 1"


def test_the_tables_rules_outrank_jupyters_right_alignment() -> None:
    """JupyterLab's `:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td` has two classes and an
    element; ours under its container has two classes (the attribute counts as one) and two elements.
    The browser test reads the computed style; this says which rules the style must hold."""
    rules = dict(re.findall(r"([^{}]+)\{([^{}]*)\}", M.STYLE.removeprefix("<style>").removesuffix("</style>")))
    left = next(body for selectors, body in rules.items() if ".jp-RenderedHTMLCommon table[class^=ss-] td" in
                selectors.split(","))
    right = next(body for selectors, body in rules.items() if ".rendered_html table[class^=ss-] td.ss-num" in
                 selectors.split(","))
    assert "text-align:left" in left and "text-align:right" in right
    assert any("td.ss-nowrap" in selectors and "white-space:nowrap" in body for selectors, body in rules.items())


def test_the_notebooks_table_names_each_lines_cell() -> None:
    session = Session({})
    assert session.device_table_view() is None
    session.run_cell(Cell("cell [1]", "%%shapescript\ndim D = 4\nmodel M:\n    param w: [D] = zeros()\n", 2))
    session.run_cell(Cell("cell [2]", "%%shapescript\n\nfn f(m: M, x: [D]) -> [D] = x * m.w\n", 2))
    view = session.device_table_view()
    assert view is not None and view.table is device_table(session.program.checked)
    page = view.table_html()
    # The location column is short and on one line; the tooltip says it in full.
    assert rows(page, "ss-fn") == [["6 cell 2:3", "f", "on the workers: it uses tensors", "—"]]
    assert rows(page, "ss-model")[0][0] == "3 cell 1:3"
    nowrap = f'<td class="ss-nowrap" style="{M.LOCATION_CELL}">'
    assert nowrap + '6 <span class="ss-note" title="cell [2], line 3">' in page
    assert nowrap + '3 <span class="ss-note" title="cell [1], line 3">' in page
    assert session.view_of(view.table).table_html() == page  # the program's table: with its cells
    other = ss.load(README, devices="cpu").device_table
    assert session.view_of(other).place is None


# -- a model --------------------------------------------------------------------------------------

def shown_html(m: Any) -> str:
    """What a notebook shows for a model as a cell's result: the HTML of the formatter the
    extension registers (runtime/ and parallel/ know nothing of notebooks)."""
    shell = types.SimpleNamespace(display_formatter=DisplayFormatter())
    _show_models(shell)  # type: ignore[arg-type]
    return shell.display_formatter.format(m)[0]["text/html"]


@pytest.fixture(scope="module")
def fit_cpu() -> ss.Program:
    return ss.load(FIT, devices="cpu", name="fit.ss")


def test_a_models_html_lists_every_param_and_buffer(fit_cpu: ss.Program) -> None:
    m = fit_cpu.Lin.init(seed=0)
    page = shown_html(m)
    assert '<table class="ss-model-table">' in page
    listed = rows(page, "ss-member")
    assert [r[0] for r in listed] == list(LEAVES)
    for (name, kind, shape, dtype, layout, size), (want, dims) in zip(listed, LEAVES.items()):
        t = m._leaf(want)
        assert shape == "[" + ", ".join(map(str, dims)) + "]" and list(t.shape) == dims
        assert kind == ("buffer" if name == "steps" else "param") and dtype == ("i64" if name == "steps" else "f32")
        assert layout == "on cpu" and size == bytes_text(t.numel() * t.element_size())
    assert "<b>Lin on cpu: 5 params and 1 buffer, 176 bytes</b>" in page  # (2·(12 + 3) + 12)·4 + 8
    assert repr(m).startswith("Lin(layers: [2] Layer, w: [4, 3] f32")  # the text repr is as it was


class FakePool:
    """A running pool that answers reads as worker 0 would, from a local model."""

    alive, world = True, 2

    def __init__(self, model: ss.Model) -> None:
        self.model, self.calls = model, []  # type: ignore[var-annotated]

    def release(self, handle: int) -> None:
        """What a handle's finalizer tells the pool (nothing to free here)."""

    def call(self, name: str, args: tuple, where: str = "") -> list[Any]:
        self.calls.append(name)
        if name == "read":
            return [self.model._leaf(args[1]).detach().clone()] * self.world
        assert name == "state_dict"
        return [self.model.state_dict()] * self.world


TWO_CPUS = DeviceSet("cpu", (0, 1))


def remote(program: ss.Program, seed: int = 0, devices: DeviceSet = TWO_CPUS
           ) -> tuple[RemoteModel, FakePool]:
    pool = FakePool(program.Lin.init(seed=seed))
    stub = types.SimpleNamespace(_pool=pool, devices=devices)
    return RemoteModel(stub, program.Lin.spec, handle=1), pool


def test_a_sharded_models_display_says_each_device_holds_pieces(fit_cpu: ss.Program) -> None:
    m, pool = remote(fit_cpu, devices=DeviceSet("cpu", (0, 1, 2), shard_params=True))
    listed = rows(shown_html(m), "ss-member")
    for name, _, shape, _, where, size in listed:
        values = 1
        for n in shape.strip("[]").split(", "):
            values *= int(n) if n else 1
        param = name != "steps"  # the buffer stays whole
        assert where == ("a piece on each device" if param else "a copy on every device")
        assert size == bytes_text(sympy.Integer((-(-values // 3) if param else values) * (4 if param else 8)))
    assert "a piece of every param on each device" in repr(m) and pool.calls == []


def test_a_remote_models_display_asks_the_workers_nothing(fit_cpu: ss.Program) -> None:
    m, pool = remote(fit_cpu)
    page = shown_html(m)
    listed = rows(page, "ss-member")
    assert [(r[0], r[2], r[4]) for r in listed] == [
        (name, "[" + ", ".join(map(str, dims)) + "]", "a copy on every device") for name, dims in LEAVES.items()]
    assert "bytes per device" in page and "Lin on cpu[0 1], a copy on every device" in html.unescape(page)
    assert repr(m) == ("RemoteModel[Lin] on cpu[0 1], a copy on every device: layers.0.w: [4, 3] f32, "
                       "layers.0.b: [3] f32, layers.1.w: [4, 3] f32, layers.1.b: [3] f32, w: [4, 3] f32, "
                       "steps: [] i64 buffer")
    assert pool.calls == []
    m._program._pool = None  # its workers stopped: the display says so, still without asking
    assert "its workers have stopped" in model_html(m)


def test_show_values_fetches_the_chosen_param(fit_cpu: ss.Program) -> None:
    m, pool = remote(fit_cpu)
    local = pool.model
    box = model_widget(m)
    table, (choice, button), out = box.children[0], box.children[1].children, box.children[2]
    assert table.value == model_html(m) and list(choice.options) == list(LEAVES) and out.value == ""
    choice.value = "w"
    button.click()
    assert pool.calls == ["read"]  # getattr(m, "w"): worker 0's copy
    shown = html.unescape(out.value)
    w = local.w.detach().double()
    assert "w: [4, 3] f32 (worker 0's copy)" in shown
    assert f"mean {w.mean().item():.4g}  std {w.std().item():.4g}" in shown
    assert f"min {w.min().item():.4g}  max {w.max().item():.4g}" in shown
    assert f"first 8 of 12: [{', '.join(f'{v:.4g}' for v in w.flatten()[:8].tolist())}]" in shown
    choice.value = "layers.1.b"  # a sub-model's: the workers send the state dict
    button.click()
    assert pool.calls == ["read", "state_dict"] and "layers.1.b: [3] f32" in out.value
    pool.alive = False  # an error shows in the widget, not as a traceback nobody sees
    button.click()
    assert "WorkerError" in out.value and "stopped" in out.value


def test_a_summary_of_a_local_param_and_of_a_missing_one(fit_cpu: ss.Program) -> None:
    m = fit_cpu.Lin.init(seed=0)
    assert summary(m, "steps").splitlines() == ["steps: [] i64", "mean 0  std -  min 0  max 0", "values: [0]"]
    with pytest.raises(KeyError, match="model Lin has no param or buffer `nope`; it has layers.0.w"):
        summary(m, "nope")


# -- the progress hook ----------------------------------------------------------------------------

class Bar:
    """A bar as tqdm's, recording what it is told."""

    made: list[Bar] = []

    def __init__(self, total: int, desc: str, unit: str) -> None:
        self.total, self.desc, self.unit, self.n, self.closed = total, desc, unit, 0, False
        self.resets = 0
        Bar.made.append(self)

    def update(self, n: int = 1) -> None:
        assert not self.closed
        self.n += n

    def reset(self, total: int | None = None) -> None:
        self.n, self.resets = 0, self.resets + 1
        self.total = total if total is not None else self.total

    def set_description_str(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc

    def refresh(self) -> None:
        """tqdm redraws here; nothing to draw."""

    def close(self) -> None:
        self.closed = True

    def __str__(self) -> str:
        return f"{self.desc}: {self.n}/{self.total}"


@pytest.fixture
def bars() -> Any:
    Bar.made = []
    with progress.bars(Bar):
        yield Bar.made
    assert not progress.enabled()


def test_the_hook_is_off_by_default() -> None:
    assert loops.progress is None and not progress.enabled()


def test_a_bar_counts_the_same_batches(fit_cpu: ss.Program, bars: list[Bar]) -> None:
    loop = batches(shuffle(dataset(), 1), 8, fit_cpu.Ex)
    with_bar = [b.x for b in loop]
    assert [(b.total, b.desc, b.unit, b.n, b.closed) for b in bars] == [(3, "Ex batches", "batch", 3, True)]
    progress.disable()
    assert all(torch.equal(a, b.x) for a, b in zip(with_bar, loop, strict=True))
    assert len(bars) == 1  # none without the hook


def test_a_bar_closes_on_break_and_on_error(fit_cpu: ss.Program, bars: list[Bar]) -> None:
    loop = batches(dataset(), 8, fit_cpu.Ex)
    for _ in loop:
        break
    assert (bars[0].n, bars[0].closed) == (0, True)
    with pytest.raises(RuntimeError, match="in the loop"):
        for k, _ in enumerate(loop):
            if k == 1:
                raise RuntimeError("in the loop")
    assert (bars[1].n, bars[1].closed) == (1, True)
    bad = ss.TensorDataset(x=torch.randn(21, 4), y=torch.tensor([0] * 12 + [7] + [0] * 8))  # 7 is no Index[3]
    with pytest.raises(ss.DomainError, match="item 12 of the dataset"):
        list(batches(bad, 8, fit_cpu.Ex))
    assert (bars[2].n, bars[2].closed) == (1, True)


def test_a_programs_loop_shows_a_bar(fit_cpu: ss.Program, bars: list[Bar]) -> None:
    m = fit_cpu.Lin.init(seed=0)
    sink = ss.sinks.memory()
    fit_cpu.fit(m, ss.adamw(m, lr=0.1), dataset(), sink)
    assert len(sink.records) == 3 and [(b.total, b.n, b.closed) for b in bars] == [(3, 3, True)]


def test_a_loop_on_several_devices_shows_one_bar(fit_cpu: ss.Program, bars: list[Bar]) -> None:
    loop = batches(dataset(), 8, fit_cpu.Ex)
    handles: list[int | None] = [7, None]  # sent to the workers; one they can't take, loaded here
    program = types.SimpleNamespace(workers=lambda: "pool",
                                    datasets=types.SimpleNamespace(handle=lambda pool, base, spec: handles[0]))
    remote_loop = RemoteBatches(program, loop)
    got = list(remote_loop)
    assert [type(b) for b in got] == [RemoteBatch] * 3 and [b.size for b in got] == [8, 8, 5]
    handles[0] = None
    assert [b.size for b in remote_loop] == [8, 8, 5]
    assert [(b.total, b.n, b.closed) for b in bars] == [(3, 3, True), (3, 3, True)]  # one bar each, not two


# -- the live sink --------------------------------------------------------------------------------

def points(svg: str) -> list[tuple[float, float]]:
    line = re.search(r'<polyline[^>]* points="([^"]*)"', svg)
    assert line is not None, svg
    return [tuple(map(float, p.split(","))) for p in line.group(1).split()]  # type: ignore[misc]


def test_the_live_sink_keeps_records_and_prints_every_nth_outside_a_notebook(
        fit_cpu: ss.Program, capsys: pytest.CaptureFixture[str]) -> None:
    sink = ss.sinks.live(every=2)
    assert isinstance(sink, LiveSink) and sink.widget is None
    m = fit_cpu.Lin.init(seed=0)
    fit_cpu.fit(m, ss.adamw(m, lr=0.1), dataset(37), sink)  # 5 batches
    assert len(sink.records) == 5 and set(sink.records[0]) == {"loss", "seen"}
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in printed] == ["1", "2", "4"]
    assert printed[0].startswith(f"step 1  loss={sink.records[0]['loss']:.4f}")
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="every must be a positive int"):
            ss.sinks.live(every=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fps must be a positive number"):
        ss.sinks.live(fps=0)


def test_outside_a_notebook_the_live_sink_prints_the_first_record_and_every_nth(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Steps 1, 10, 20 of 25 with the default `every`: what the docs say, not "every 10th" alone."""
    for every, expected in ((10, ["1", "10", "20"]), (1, [str(k) for k in range(1, 26)]), (7, ["1", "7", "14", "21"])):
        sink = ss.sinks.live(every=every) if every != 10 else ss.sinks.live()
        for k in range(25):
            sink.write(ss.sinks.logs(loss=float(k)))
        assert [line.split()[1] for line in capsys.readouterr().out.splitlines()] == expected
    api = (ROOT / "docs" / "api.md").read_text()
    assert "elsewhere it prints the first record and every `every`-th after it (steps 1, 10, 20, ..." in api
    notebook = " ".join((ROOT / "docs" / "notebook.md").read_text().split())
    assert "Outside Jupyter it prints the first record and then every 10th (steps 1, 10, 20, ...;" in notebook


def test_the_chart_has_a_point_per_record() -> None:
    records = [{"loss": 2.0 / k, "acc": k / 10, "note": "x", "flag": True, "grid": [1, 2]} for k in range(1, 8)]
    page = charts_html(records)
    assert page.count("<svg") == 2 and page.count("<polyline") == 2  # numbers only: loss and acc
    loss = points(svg_chart("loss", [(k, r["loss"]) for k, r in enumerate(records, 1)]))
    assert len(loss) == 7
    xs, ys = zip(*loss)
    assert list(xs) == sorted(xs) and list(ys) == sorted(ys)  # later steps right; a falling loss goes down
    assert "loss: 0.2857" in page
    assert len(points(svg_chart("x", [(1, 1.0), (2, float("nan")), (3, 2.0)][::2]))) == 2
    assert len(points(svg_chart("x", [(k, float(k)) for k in range(1, 5001)], most=1000))) <= 1001
    assert "No records yet" in charts_html([]) and "none with a number" in charts_html([{"s": "a"}])


class FakeHTML:
    """ipywidgets.HTML as the sink uses it, counting redraws."""

    def __init__(self) -> None:
        self.values: list[str] = []

    @property
    def value(self) -> str:
        return self.values[-1] if self.values else ""

    @value.setter
    def value(self, text: str) -> None:
        self.values.append(text)


def test_the_live_sink_redraws_at_most_fps_times_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    from shapescript.notebook import live
    monkeypatch.setattr(live, "_widget_html", FakeHTML)
    monkeypatch.setattr(loops, "call_scope", loops.call_scope)  # a sink with a widget sets it: undone after
    shown: list[Any] = []
    monkeypatch.setattr(LiveSink, "show", lambda self: (shown.append(self.widget), setattr(self, "shown", True)))
    sink = ss.sinks.live(fps=10)
    for k in range(50):
        sink.write(ss.sinks.logs(loss=1.0 / (k + 1)))
    assert shown == [sink.widget] and len(sink.records) == 50
    assert len(sink.widget.values) <= 2  # the first record drawn at once; the rest wait for the timer
    deadline = time.monotonic() + 5
    while len(points(sink.widget.value)) < 50 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(points(sink.widget.value)) == 50  # the timer drew the last records
    sink.close()
    assert len(points(sink.widget.value)) == 50 and not sink._throttle.pending


# -- all of it on two devices ---------------------------------------------------------------------

@pytest.mark.slow
def test_on_two_devices(bars: list[Bar], capsys: pytest.CaptureFixture[str]) -> None:
    prog = ss.load(FIT, devices="cpu[0 1]", name="fit.ss")
    try:
        m = prog.Lin.init(seed=0)
        sink = ss.sinks.live(every=1)
        prog.fit(m, ss.adamw(m, lr=0.1), dataset(), sink)  # the workers load the batches: RemoteBatches
        assert [(b.total, b.n, b.closed) for b in bars] == [(3, 3, True)]
        assert len(sink.records) == 3 and len(capsys.readouterr().out.splitlines()) == 3
        assert [r[0] for r in rows(shown_html(m), "ss-member")] == list(LEAVES)
        box = model_widget(m)
        box.children[1].children[0].value = "w"
        box.children[1].children[1].click()
        w = m.w.double()  # worker 0's copy, fetched again
        assert f"min {w.min().item():.4g}  max {w.max().item():.4g}" in box.children[2].value
        table = device_table_widget(prog).children[0].value
        assert len(rows(table, "ss-line")) == len(prog.device_table.lines) > 0
    finally:
        prog.stop()
