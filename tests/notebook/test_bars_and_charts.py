"""One progress bar per loop (reused on each pass, within a call or a notebook cell), the bars' and
the live charts' final state as HTML and text, and the charts' axes and log scale, without a
kernel. test_saved_outputs.py runs them in a notebook through nbclient; test_widgets.py has the
first tests of the hook and the sink (and the fake bar used here)."""

from __future__ import annotations

import re
import textwrap
from typing import Any

import IPython.display
import pytest
from programs import epochs_of
from test_widgets import FIT, Bar, FakeHTML, bars, dataset, points  # noqa: F401  (bars: the fixture)

import shapescript as ss
from shapescript.notebook import live, progress
from shapescript.notebook.live import LiveSink, charts_html, svg_chart
from shapescript.runtime import loops
from shapescript.runtime.loops import batches, shuffle
from shapescript.runtime.sinks import Value

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PASSES, TRAIN_BATCH, EVAL_BATCH = 3, 8, 5  # FIT's `fit` loops over shuffled batches of 8
EPOCHS = FIT + epochs_of(PASSES, EVAL_BATCH) + textwrap.dedent(f"""
    fn nested(m: Lin, data: Dataset[Ex]) -> []:
        total = to(0.0, f32)
        for batch in data |> batches({TRAIN_BATCH}):
            for small in data |> batches({EVAL_BATCH}):
                total = total + loss(m, small)
        return total
    """)


@pytest.fixture(scope="module")
def prog() -> ss.Program:
    return ss.load(EPOCHS, devices="cpu", name="epochs.ss")


@pytest.fixture(autouse=True)
def call_scope(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a test sets of the hooks is undone after it (a live sink in a kernel sets one)."""
    monkeypatch.setattr(loops, "call_scope", loops.call_scope)
    monkeypatch.setattr(loops, "progress", loops.progress)


def counts(prog: ss.Program, ds: ss.TensorDataset) -> tuple[int, int]:
    """How many batches each loop makes of `ds`: the training loop's and the evaluation's."""
    return len(batches(shuffle(ds, 1), TRAIN_BATCH, prog.Ex)), len(batches(ds, EVAL_BATCH, prog.Ex))


class Watch(ss.sinks.Sink):
    """A sink that notes the bars' state at each record the program writes."""

    def __init__(self, made: list[Bar]) -> None:
        super().__init__()
        self.made, self.seen = made, []  # type: ignore[var-annotated]

    def _emit(self, step: int, values: dict[str, Any]) -> None:
        self.seen.append([(b.desc, b.n, b.closed) for b in self.made])


# -- one bar per loop -----------------------------------------------------------------------------

def test_a_loop_run_again_in_one_call_reuses_its_bar(prog: ss.Program, bars: list[Bar]) -> None:
    ds = dataset()
    train_count, eval_count = counts(prog, ds)
    m = prog.Lin.init(seed=0)
    watch = Watch(bars)
    prog.epochs(m, ss.adamw(m, lr=0.1), ds, watch)
    assert len(watch.seen) == PASSES * train_count  # a record a batch
    train, evaluation = bars  # two loops, two bars: not one a pass
    assert (train.total, train.n, train.resets, train.closed) == (train_count, train_count, PASSES - 1, True)
    assert train.desc == f"Ex batches, pass {PASSES}"
    assert (evaluation.total, evaluation.n, evaluation.resets, evaluation.closed) == (eval_count, eval_count, 0, True)
    assert evaluation.desc == "Ex batches"
    # During the call the bar stays open between passes; at the first record of pass k it counts none yet.
    for k in range(PASSES):
        desc = "Ex batches" if k == 0 else f"Ex batches, pass {k + 1}"
        assert watch.seen[k * train_count] == [(desc, 0, False)]
    prog.epochs(m, ss.adamw(m, lr=0.1), ds, ss.sinks.memory())  # a second call: fresh bars
    assert len(bars) == 4 and bars[2].desc == f"Ex batches, pass {PASSES}" and all(b.closed for b in bars)


def test_a_loop_inside_a_loop_has_a_bar_reused_on_each_outer_pass(prog: ss.Program, bars: list[Bar]) -> None:
    ds = dataset()
    outer_count = len(batches(ds, TRAIN_BATCH, prog.Ex))
    _, inner_count = counts(prog, ds)
    prog.nested(prog.Lin.init(seed=0), ds)
    outer, inner = bars
    assert (outer.n, outer.total, outer.desc) == (outer_count, outer_count, "Ex batches")
    assert (inner.n, inner.total, inner.resets) == (inner_count, inner_count, outer_count - 1)
    assert inner.desc == f"Ex batches, pass {outer_count}" and outer.closed and inner.closed


def test_in_a_notebook_cell_calls_from_a_python_loop_share_the_bar(
        prog: ss.Program, bars: list[Bar], monkeypatch: pytest.MonkeyPatch) -> None:
    """IPython's main thread keeps its bars until the cell ends (post_execute: _close_bars), so an
    epoch loop written in Python shows one bar; a later cell gets a fresh one."""
    monkeypatch.setattr(progress, "_cell_hooked", True)
    ds = dataset()
    train_count, _ = counts(prog, ds)
    m = prog.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.1)
    for _ in range(PASSES):
        prog.fit(m, opt, ds, ss.sinks.memory())
    [bar] = bars
    assert (bar.n, bar.resets, bar.desc, bar.closed) == (train_count, PASSES - 1, f"Ex batches, pass {PASSES}", False)
    progress._close_bars()  # the cell ends
    assert bar.closed
    prog.fit(m, opt, ds, ss.sinks.memory())  # the next cell
    progress._close_bars()
    assert len(bars) == 2 and bars[1].desc == "Ex batches" and bars[1].closed


def bar_counts(text: str) -> list[tuple[int, int, int]]:
    """(count, total, percent) of each bar in the bars' HTML."""
    return [tuple(map(int, m)) for m in re.findall(r"(\d+)/(\d+) (\d+)%", text)]  # type: ignore[misc]


def test_the_notebooks_bars_carry_their_final_state_as_html_and_text(
        prog: ss.Program, monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[tuple[str, str, Any]] = []  # (how, display id, what was shown)
    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id: shown.append(("display", display_id, obj)))
    monkeypatch.setattr(IPython.display, "update_display",
                        lambda obj, display_id: shown.append(("update", display_id, obj)))
    loops.call_scope, loops.progress = progress.SCOPE, progress._hook(progress.NotebookBars)
    ds = dataset(37)
    train_count, eval_count = counts(prog, ds)
    m = prog.Lin.init(seed=0)
    prog.epochs(m, ss.adamw(m, lr=0.1), ds, ss.sinks.memory())
    assert [how for how, _, _ in shown[:1]] == ["display"] and {how for how, _, _ in shown[1:]} == {"update"}
    assert len({display_id for _, display_id, _ in shown}) == 1  # one output for the call's bars
    final = shown[-1][2]._repr_mimebundle_()
    box = shown[0][2].widget
    # Until the bars close, the output holds their widget; then their HTML and text alone.
    assert all(obj._repr_mimebundle_()[WIDGET_VIEW]["model_id"] == box.model_id for _, _, obj in shown[:-1])
    assert WIDGET_VIEW not in final
    assert [(c.children[1].value, c.children[1].max) for c in box.children] == [(train_count, train_count),
                                                                                   (eval_count, eval_count)]
    assert bar_counts(final["text/html"]) == [(train_count, train_count, 100), (eval_count, eval_count, 100)]
    assert f"Ex batches, pass {PASSES}: <progress" in final["text/html"] and final["text/html"].count("<progress") == 2
    lines = final["text/plain"].splitlines()
    assert len(lines) == 2 and all("100%" in line for line in lines)
    assert f"{train_count}/{train_count}" in lines[0] and f"{eval_count}/{eval_count}" in lines[1]
    # The bars as they started were shown first: the final state is in the last update only.
    assert bar_counts(shown[0][2]._repr_mimebundle_()["text/html"]) == [(0, train_count, 0)]


# -- the live charts ------------------------------------------------------------------------------

def svgs(page: str) -> list[str]:
    return re.findall(r"<svg.*?</svg>", page)


def label(svg: str, cls: str) -> str:
    found = re.search(rf'<text class="{cls}"[^>]*>([^<]*)</text>', svg)
    assert found is not None, (cls, svg)
    return found.group(1)


def axes(svg: str) -> tuple[float, float, float, float]:
    """(left, top, bottom, right) of the axes: the left axis from top to bottom, then the bottom one."""
    found = re.search(r'<path class="ss-axes" d="M([\d.]+),([\d.]+) V([\d.]+) H([\d.]+)"', svg)
    assert found is not None, svg
    left, top, bottom, right = map(float, found.groups())
    return left, top, bottom, right


def test_a_chart_has_axes_with_its_steps_and_value_range() -> None:
    losses = [2.5 / k + 0.01 * k for k in range(1, 41)]
    svg = svg_chart("loss", list(enumerate(losses, 1)), losses[-1])
    left, top, bottom, right = axes(svg)
    xy = points(svg)
    assert all(left <= x <= right and top <= y <= bottom for x, y in xy)
    assert min(x for x, _ in xy) == left and max(x for x, _ in xy) == right  # first and last step at the ends
    assert min(y for _, y in xy) == top and max(y for _, y in xy) == bottom  # the range fills the height
    assert label(svg, "ss-x-first") == "step 1" and label(svg, "ss-x-last") == f"step {len(losses)}"
    assert float(label(svg, "ss-y-max")) == pytest.approx(max(losses), rel=5e-3)
    assert float(label(svg, "ss-y-min")) == pytest.approx(min(losses), rel=5e-3)
    assert "log scale" not in svg


def test_a_log_scale_spaces_powers_of_ten_evenly_and_leaves_out_what_isnt_positive() -> None:
    values = [1.0, 10.0, 0.0, 100.0, -3.0, 1000.0]
    steps = list(enumerate(values, 1))
    svg = svg_chart("loss", steps, log=True)
    kept = [(s, v) for s, v in steps if v > 0]
    ys = [y for _, y in points(svg)]
    assert len(ys) == len(kept)
    gaps = [a - b for a, b in zip(ys, ys[1:])]
    assert max(gaps) - min(gaps) < 0.2 and min(gaps) > 0  # each power of ten one step up
    assert "2 values ≤ 0 left out" in svg and "log scale" in svg
    assert float(label(svg, "ss-y-min")) == min(v for _, v in kept)
    assert float(label(svg, "ss-y-max")) == max(v for _, v in kept)
    linear = [y for _, y in points(svg_chart("loss", kept))]
    assert linear[1] - linear[0] < 0.05 * (linear[0] - linear[-1])  # 1 → 10 is barely a step in linear
    records: list[dict[str, Value]] = [{"loss": v, "acc": v / 1000} for v in values if v > 0]
    loss_svg, acc_svg = svgs(charts_html(records, log=("loss",)))
    assert "log scale" in loss_svg and "log scale" not in acc_svg
    assert all("log scale" in s for s in svgs(charts_html(records, log=True)))
    assert all("log scale" not in s for s in svgs(charts_html(records)))
    with pytest.raises(TypeError, match="log is True, False or the keys"):
        ss.sinks.live(log=3)  # type: ignore[arg-type]


class Widget(FakeHTML):
    """FakeHTML, shown as a widget view."""

    model_id = "fake-model"

    def _repr_mimebundle_(self) -> dict[str, Any]:
        return {"application/vnd.jupyter.widget-view+json": {"model_id": self.model_id}}


def test_the_live_charts_final_state_goes_into_their_output_when_the_call_ends(
        prog: ss.Program, monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[tuple[str, str, Any]] = []
    monkeypatch.setattr(live, "_widget_html", Widget)
    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id: shown.append(("display", display_id, obj)))
    monkeypatch.setattr(IPython.display, "update_display",
                        lambda obj, display_id: shown.append(("update", display_id, obj)))
    sink = ss.sinks.live(fps=0.5, log=("loss",))  # a redraw at most every 2 s: the timer can't draw the last ones
    assert isinstance(sink, LiveSink) and loops.call_scope is progress.SCOPE
    m = prog.Lin.init(seed=0)
    prog.epochs(m, ss.adamw(m, lr=0.1), dataset(), sink)
    [(first, display_id, _), (last, same_id, final)] = shown  # shown with the first record, saved at the end
    assert (first, last) == ("display", "update") and display_id == same_id == sink.display_id
    bundle = final._repr_mimebundle_()
    assert WIDGET_VIEW not in bundle  # the final drawing alone, which any viewer shows
    losses = [r["loss"] for r in sink.records]
    assert len(losses) == PASSES * counts(prog, dataset())[0]
    [svg] = svgs(bundle["text/html"])
    assert len(points(svg)) == len(losses) and "log scale" in svg
    assert label(svg, "ss-x-last") == f"step {len(losses)}"
    assert float(label(svg, "ss-y-max")) == pytest.approx(max(losses), rel=5e-3)
    assert points(sink.widget.value) == points(svg)  # the widget has the final drawing too
    text = bundle["text/plain"]
    assert f"{len(losses)} records" in text and f"{losses[-1]:.4f}" in text and f"{min(losses):.4f}" in text
    sink.write(ss.sinks.logs(loss=0.5))  # a record after the end: the widget is back, to draw it live
    assert shown[-1][0] == "update" and shown[-1][2]._repr_mimebundle_()[WIDGET_VIEW]["model_id"] == Widget.model_id
    sink.close()  # closing draws the last record and saves it, then it is done
    assert len(shown) == 4 and WIDGET_VIEW not in shown[-1][2]._repr_mimebundle_() and not sink._throttle.pending
    assert len(points(svgs(shown[-1][2]._repr_mimebundle_()["text/html"])[0])) == len(losses) + 1


def test_a_chart_follows_the_cells_width_labels_its_range_whole_and_smooths_if_asked() -> None:
    """A chart was a fixed 360×130 whose y-min label was cut off at the left: now it follows the
    cell's width, shows its range's labels whole, and smooths the values if asked."""
    values = [-0.000123456 * k for k in range(1, 30)] + [-1234.5]  # long labels at both ends of the range
    svg = svg_chart("loss", list(enumerate(values, 1)))
    assert 'width="100%"' in svg and f'viewBox="0 0 {live.WIDTH} {live.HEIGHT}"' in svg
    for cls in ("ss-y-min", "ss-y-max"):
        found = re.search(rf'<text class="{cls}" x="([\d.]+)"[^>]*>([^<]*)</text>', svg)
        assert found is not None
        assert float(found[1]) - 6 * len(found[2]) >= 0, found.groups()  # 10 px type: about 6 px a character
    left, _, _, _ = axes(svg)
    assert min(x for x, _ in points(svg)) == left  # the line starts at the axis, wherever that is now
    assert "ss-smooth" not in svg

    weight = 0.6
    noisy = [1.0 + (-1) ** k * 0.5 + 0.01 * k for k in range(40)]
    smooth_svg = svg_chart("loss", list(enumerate(noisy, 1)), smooth=weight)
    found = re.search(r'<polyline class="ss-smooth"[^>]* points="([^"]*)"', smooth_svg)
    assert found is not None and 'stroke-opacity="0.3"' in smooth_svg  # the values faint beneath
    drawn = [float(p.split(",")[1]) for p in found[1].split()]
    raw = [y for _, y in points(smooth_svg)]
    # The same y scale: a value's y is linear in it. The average, as a weighted sum of what came before.
    lo_y, hi_y = max(raw), min(raw)
    lo, hi = min(noisy), max(noisy)
    expected = [sum(weight ** (k - i) * (1 - weight) * noisy[i] for i in range(k + 1)) / (1 - weight ** (k + 1))
                for k in range(len(noisy))]
    assert [lo_y + (e - lo) / (hi - lo) * (hi_y - lo_y) for e in expected] == pytest.approx(drawn, abs=0.06)
    with pytest.raises(ValueError, match="smooth is a weight"):
        ss.sinks.live(smooth=1.0)


def test_a_background_run_stopped_at_a_step_shows_the_steps_its_handle_counts(prog: ss.Program, bars: list[Bar]) -> None:
    """The bar of a run stopped by `h.stop()` counts the last step too, as the handle does (a
    stopped run's bar once said 5474 while its handle said 5475). The sink holds the run at its
    third record until the stop has been asked for, so the run stops right after that step."""
    import threading
    third, go_on = threading.Event(), threading.Event()

    class Held(ss.sinks.Sink):
        def _emit(self, step: int, values: dict[str, Any]) -> None:
            if step == 3:
                third.set()
                assert go_on.wait(30)
    m = prog.Lin.init(seed=0)
    run = prog.fit(m, ss.adamw(m, lr=0.1), dataset(40), Held(), background=True)
    assert third.wait(30)
    run.stop(wait=False)
    go_on.set()
    run.wait(timeout=30)
    assert run.state == "stopped" and run.steps == 3
    [bar] = bars
    assert (bar.n, bar.closed) == (run.steps, True)


def test_every_text_of_the_charts_and_the_timeline_takes_the_themes_colour() -> None:
    """SVG text is black unless told, which JupyterLab's dark theme drew black on black: each
    <text> of a chart and of the timeline's bars is coloured by one of JupyterLab's font-colour
    variables, falling back where there is none. The browser test measures the contrast in both
    themes."""
    from shapescript.notebook.timeline import bars_svg
    from shapescript.parallel.timeline import Step, WorkerTiming
    step = Step(1, "`step` (x.ss:3:4)", wall=0.01, devices=("cpu:0", "cpu:1"),
                workers=(WorkerTiming(0.008, 0.001, (("x.ss:2:5", "all-reduce", 0.002),)),) * 2)
    drawings = [svg_chart("loss", [(1, 2.0), (2, 1.0)], 1.0, log=True, smooth=0.5), svg_chart("loss", []),
                bars_svg(step)]
    for svg in drawings:
        texts = re.findall(r"<text [^>]*>", svg)
        assert texts and all(re.search(r'style="fill:var\(--jp-ui-font-color[12], [a-zA-Z]+\)"', t) for t in texts), texts
