"""`ss.sinks.live()`: a sink that draws what a program logs, live, in a notebook.

`write(log, logs(loss=l))` in a program sends records to it; it keeps every record (`.records`,
as the memory sink does) and, in a Jupyter kernel with ipywidgets, shows one small line chart per
logged number in an `ipywidgets.HTML`, redrawn at most `fps` times a second (the last redraw comes
a moment after the last record, from a timer). The charts are inline SVG drawn here, so nothing
else is needed: a left and a bottom axis, labelled with the values' range and the first and last
steps, and a logarithmic y axis for the keys `log` names (or all, with `log=True`). When the cell
(or, in a background run, the call) that writes the records ends, the charts are drawn a last time
into their output as SVG and text, which is what a saved notebook keeps. Anywhere else (a
terminal, a script) it prints the first record and every `every`-th (steps 1, every, 2·every, ...)
as the stdout sink would. The sink receives
records in the controller, so it works the same on one device and on several.
"""

from __future__ import annotations

import math
import sys
import threading
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, TypeAlias

from ..runtime import sigint
from ..runtime.sinks import Sink, Value, _text
from . import markup as M
from . import progress
from .throttle import Throttle

WIDTH, HEIGHT, PAD = 360, 130, 4  # each chart's size in pixels, and the room left at its edges
LEFT, TOP, BOTTOM = 46, 22, HEIGHT - 18  # the plot's edges: room for the value range, the title, the steps
MAX_POINTS = 2000  # a longer run's line keeps every k-th record so that a redraw stays cheap
SMALL = f'font-size="10" {M.FAINT_FILL}'
_SIZE = f'width="100%" viewBox="0 0 {WIDTH} {HEIGHT}" style="min-width:{WIDTH}px;display:block"'

# `log=`: which keys' charts have a logarithmic y axis: none, all (True), or those named.
LogScale: TypeAlias = bool | str | Sequence[str]


def numbers(records: list[dict[str, Value]]) -> dict[str, list[tuple[int, float]]]:
    """Each logged key with a number, as (step, value) pairs: the series the charts draw. Bools,
    strings and lists are not drawn; NaN and infinities are left out of the line."""
    series: dict[str, list[tuple[int, float]]] = {}
    for step, record in enumerate(records, 1):
        for key, value in record.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                points = series.setdefault(key, [])
                if math.isfinite(value):
                    points.append((step, float(value)))
    return series


def _thin(points: list[tuple[int, float]], most: int) -> list[tuple[int, float]]:
    if len(points) <= most:
        return points
    stride = math.ceil(len(points) / most)
    return points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])


def _axis_number(value: float) -> str:
    return f"{value:.3g}"


def smoothed(values: list[float], weight: float) -> list[float]:
    """The exponential moving average TensorBoard draws for its smoothing `weight` (0: none), with
    the start's bias taken out, so that the first points aren't pulled towards 0."""
    out, average = [], 0.0
    for k, value in enumerate(values, 1):
        average = average * weight + (1 - weight) * value
        out.append(average / (1 - weight ** k) if weight else value)
    return out


def _room_for(labels: list[str]) -> int:
    """The left margin that fits the y axis's labels (10 px type is about 6 px a character)."""
    return max(LEFT, 6 * max(map(len, labels)) + 8)


def svg_chart(key: str, points: list[tuple[int, float]], last: Value | None = None,
              most: int = MAX_POINTS, log: bool = False, smooth: float = 0.0) -> str:
    """One `<svg>` with a `<polyline>` of (step, value) points, one per record (up to `most`),
    scaled to fit between a left axis labelled with the values' range and a bottom axis labelled
    with the first and last steps; the key and its last value above. With `log`, the y axis is
    logarithmic, and values that aren't positive are left out of the line (a note says how many).
    With `smooth` (0 to 1, as TensorBoard's), a second line, `ss-smooth`, draws their moving average
    over the points, which are then faint. Its width is the cell's, up to twice WIDTH: the drawing
    scales with it."""
    dropped = 0
    if log:
        kept = [(s, v) for s, v in points if v > 0]
        dropped, points = len(points) - len(kept), kept
    shown = _thin(points, most)
    head = f"{key}: {_text(last)}" if last is not None else key
    scale = "log scale" + (f", {dropped} value{'s' if dropped != 1 else ''} ≤ 0 left out" if dropped else "")
    title = (f'<text x="{PAD}" y="14" font-size="12" {M.TEXT_FILL}>{M.esc(head)}</text>'
             + (f'<text class="ss-scale" x="{WIDTH - PAD}" y="14" text-anchor="end" {SMALL}>{M.esc(scale)}</text>'
                if log else ""))
    if not shown:
        return (f'<svg class="ss-chart" {_SIZE}>{title}<text x="{PAD}" y="{TOP + 16}" '
                f'{SMALL}>(nothing to draw yet)</text></svg>')
    steps = [s for s, _ in shown]
    values = [v for _, v in shown]
    low, high = _axis_number(min(values)), _axis_number(max(values))
    left = _room_for([low, high])
    height = (lambda v: math.log10(v)) if log else (lambda v: v)
    lo, hi = height(min(values)), height(max(values))
    if hi == lo:  # a flat line sits in the middle
        lo, hi = lo - 0.5, hi + 0.5
    x0, x1 = steps[0], max(steps[-1], steps[0] + 1)

    def xy(step: int, value: float) -> str:
        x = left + (step - x0) / (x1 - x0) * (WIDTH - PAD - left)
        y = BOTTOM - (height(value) - lo) / (hi - lo) * (BOTTOM - TOP)
        return f"{x:.1f},{y:.1f}"

    line = " ".join(xy(s, v) for s, v in shown)
    axes = (f'<path class="ss-axes" d="M{left},{TOP} V{BOTTOM} H{WIDTH - PAD}" fill="none" '
            f'stroke="rgba(127,127,127,0.8)"/>')
    y_range = (f'<text class="ss-y-max" x="{left - 3}" y="{TOP + 8}" text-anchor="end" {SMALL}>{high}</text>'
               f'<text class="ss-y-min" x="{left - 3}" y="{BOTTOM}" text-anchor="end" {SMALL}>{low}</text>')
    x_range = (f'<text class="ss-x-first" x="{left}" y="{HEIGHT - 4}" {SMALL}>step {steps[0]}</text>'
               f'<text class="ss-x-last" x="{WIDTH - PAD}" y="{HEIGHT - 4}" text-anchor="end" {SMALL}>'
               f'step {steps[-1]}</text>')
    faint = ' stroke-opacity="0.3"' if smooth else ""
    lines = f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5"{faint} points="{line}"/>'
    if smooth:  # the average of the values drawn (on a log scale, of their logarithms: TensorBoard's too)
        averaged = smoothed([height(v) for v in values], smooth)
        unlog = (lambda h: 10 ** h) if log else (lambda h: h)
        lines += ('<polyline class="ss-smooth" fill="none" stroke="#1f77b4" stroke-width="2" points="'
                  + " ".join(xy(s, unlog(h)) for s, h in zip(steps, averaged)) + '"/>')
    return f'<svg class="ss-chart" {_SIZE}>{title}{axes}{y_range}{x_range}{lines}</svg>'


def _latest(records: list[dict[str, Value]], keys: Iterable[str]) -> dict[str, Value]:
    return {k: next(r[k] for r in reversed(records) if k in r) for k in keys}


def _logged(log: LogScale, key: str) -> bool:
    return log if isinstance(log, bool) else key == log if isinstance(log, str) else key in log


def charts_html(records: list[dict[str, Value]], log: LogScale = False, smooth: float = 0.0) -> str:
    """Every key's chart, side by side, wrapping, each at least WIDTH wide and sharing the cell's
    width; `log` says which have a logarithmic y axis, `smooth` how much their lines are smoothed."""
    if not records:
        return M.note("No records yet: the charts start with the first write(log, logs(...)).")
    series = numbers(records)
    if not series:
        return M.note(f"{len(records)} records, none with a number to draw.")
    latest = _latest(records, series)
    charts = "".join(f'<div style="flex:1 1 {WIDTH}px;max-width:{2 * WIDTH}px">'
                     f'{svg_chart(k, pts, latest[k], log=_logged(log, k), smooth=smooth)}</div>'
                     for k, pts in series.items())
    return f'<div class="ss-live" style="display:flex;flex-wrap:wrap;gap:8px">{charts}</div>'


def charts_text(records: list[dict[str, Value]]) -> str:
    """The charts in words, for a terminal or a saved notebook's text: each number's last value and range."""
    series = numbers(records)
    head = f"live charts of the logged numbers, {len(records)} record{'s' if len(records) != 1 else ''}"
    latest = _latest(records, series)
    lines = [f"  {k}: {_text(latest[k])}" + (f" (min {_text(min(v for _, v in pts))}, max "
                                            f"{_text(max(v for _, v in pts))})" if pts else "")
             for k, pts in series.items()]
    return "\n".join([head + (":" if lines else ""), *lines])


def _widget_html() -> Any:
    """An empty ipywidgets.HTML when a live frontend can show it (a Jupyter kernel), else None."""
    from .widgets import in_kernel, ipywidgets
    widgets = ipywidgets()
    return widgets.HTML() if widgets is not None and in_kernel() else None


class LiveSink(Sink):
    """The live sink: `records` holds every record, without step numbers, as memory()'s does.
    `log` makes the y axis logarithmic: True for every chart, or the keys whose charts have one."""

    passive = True  # it draws what it is given, and reads nothing of the program

    def __init__(self, every: int = 10, fps: float = 10.0, log: LogScale = False, smooth: float = 0.0) -> None:
        super().__init__()
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"live: every must be a positive int (print the first and every N-th record), "
                             f"got {every!r}")
        if not isinstance(fps, (int, float)) or not fps > 0:
            raise ValueError(f"live: fps must be a positive number of redraws a second, got {fps!r}")
        if not isinstance(log, (bool, str)) and not (
                isinstance(log, (list, tuple, set, frozenset)) and all(isinstance(k, str) for k in log)):
            raise TypeError(f"live: log is True, False or the keys to draw on a log scale (as log=('loss',)), "
                            f"got {log!r}")
        self.records: list[dict[str, Value]] = []
        if isinstance(smooth, bool) or not isinstance(smooth, (int, float)) or not 0 <= smooth < 1:
            raise ValueError(f"live: smooth is a weight from 0 (none) up to, not including, 1, as TensorBoard's "
                             f"smoothing, got {smooth!r}")
        self.every, self.interval, self.log, self.smooth = every, 1.0 / fps, log, float(smooth)
        self.widget = _widget_html()  # None: no notebook, print instead
        self.shown = False
        self.display_id = f"ss-live-{uuid.uuid4().hex}"  # every output showing the charts, updated together
        self._throttle = Throttle(self._draw, self.interval, inline=True)
        self._at_cell_end = False  # whether the cell's end will save the charts
        self._final = False  # whether the outputs hold the final drawing without the widget
        if self.widget is not None:
            progress.track_calls()

    def emit(self, step: int, values: dict[str, Value]) -> None:
        self.records.append(values)
        if self.widget is None:
            if step == 1 or step % self.every == 0:
                fields = "  ".join(f"{k}={_text(v)}" for k, v in values.items())
                print(f"step {step}  {fields}".rstrip(), file=sys.stdout, flush=True)
            return
        if not self.shown:  # in the output of the cell that writes the first record
            self.show()
        elif self._final:  # more records after the final drawing: the widget again, to draw them live
            self._update(live=True)
        self._throttle.poke()
        self._save_at_the_end()

    def _save_at_the_end(self) -> None:
        """See that the charts as they end up are written into the cell's output, which a saved
        notebook keeps: in IPython's main thread when the cell ends (post_execute, still within the
        cell, as the progress bars), and in another thread (a run in the background) when the
        call from Python that writes them ends."""
        if self._at_cell_end:
            return
        from IPython import get_ipython
        shell = get_ipython()
        if shell is None or threading.current_thread() is not threading.main_thread():
            progress.at_call_end(id(self), self.finish)
            return
        shell.events.register("post_execute", self._cell_ended)
        self._at_cell_end = True

    def _cell_ended(self) -> None:
        from IPython import get_ipython
        shell = get_ipython()
        if shell is not None:
            shell.events.unregister("post_execute", self._cell_ended)
        self._at_cell_end = False
        self.finish()

    def redraw(self) -> None:
        """Draw the charts of every record so far."""
        self._throttle.now()

    def flush(self) -> None:
        """The sink protocol's flush: the charts of every record so far, drawn now."""
        self.redraw()

    def _draw(self) -> None:
        if self.widget is not None:
            with sigint.held_back():  # no Ctrl-C inside the widget library (see progress.Bars)
                self.widget.value = self.html()

    def html(self) -> str:
        return charts_html(list(self.records), self.log, self.smooth)  # a copy: a timer may draw while the program writes

    def text(self) -> str:
        return charts_text(list(self.records))

    def _shown(self, live: bool = True) -> Any:
        """The widget (unless not `live`) with the charts as SVG and text beside it."""
        from .widgets import Shown
        records = list(self.records)
        return Shown(self.widget if live else None, charts_text(records), charts_html(records, self.log, self.smooth))

    def _update(self, live: bool) -> None:
        from .widgets import update_shown
        with sigint.held_back():
            update_shown(self._shown(live), self.display_id)
        self._final = not live

    def show(self) -> None:
        """Show the charts in the current cell's output (again, in a later cell, to follow a run there)."""
        if self.widget is None:
            raise RuntimeError("live: the charts need a Jupyter kernel with ipywidgets; here the sink prints "
                               f"the first record and every {self.every}-th instead")
        from IPython.display import display
        with sigint.held_back():
            display(self._shown(), display_id=self.display_id)
        self.shown = True
        self.redraw()

    def finish(self) -> None:
        """The final redraw: the charts of every record, in the widget and, as SVG and text, in each
        output showing them, which then hold those alone (JupyterLab draws a widget view rather
        than the HTML beside it, and a notebook reopened without the widgets' state has no view to
        draw). A record written later brings the widget back."""
        self._throttle.cancel()
        if self.widget is None:
            return
        self.redraw()
        if self.shown:
            self._update(live=False)

    def _repr_html_(self) -> str:
        return self.html()  # `sink` as a cell's last line: the charts as they are now

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.finish()  # the last records, drawn and saved: the flush, and more
