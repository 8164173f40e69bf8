"""`ss.sinks.live()`: a sink that draws what a program logs, live, in a notebook.

`write(log, logs(loss=l))` in a program sends records to it; it keeps every record (`.records`,
as the memory sink does) and, in a Jupyter kernel with ipywidgets, shows one small line chart per
logged number in an `ipywidgets.HTML`, redrawn at most `fps` times a second (the last redraw comes
a moment after the last record, from a timer). The charts are inline SVG drawn here, so nothing
else is needed. Anywhere else (a terminal, a script) it prints every `every`-th record as the
stdout sink would. The sink receives records in the controller, so it works the same on one
device and on several.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Any

from ..runtime.sinks import Sink, Value, _text
from . import markup as M

WIDTH, HEIGHT, PAD = 360, 110, 4  # each chart's size in pixels, and the room left at its edges
MAX_POINTS = 2000  # a longer run's line keeps every k-th record so that a redraw stays cheap


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


def svg_chart(key: str, points: list[tuple[int, float]], last: Value | None = None,
              most: int = MAX_POINTS) -> str:
    """One `<svg>` with a `<polyline>` of (step, value) points, one per record (up to `most`),
    scaled to fit, with the key, its last value and its range written beside it."""
    shown = _thin(points, most)
    head = f"{key}: {_text(last)}" if last is not None else key
    if not shown:
        return (f'<svg class="ss-chart" width="{WIDTH}" height="{HEIGHT}"><text x="{PAD}" y="14" '
                f'font-size="12">{M.esc(head)} (nothing to draw yet)</text></svg>')
    steps = [s for s, _ in shown]
    values = [v for _, v in shown]
    x0, x1 = steps[0], max(steps[-1], steps[0] + 1)
    lo, hi = min(values), max(values)
    if hi == lo:  # a flat line sits in the middle
        lo, hi = lo - 0.5, hi + 0.5
    top, bottom = 20, HEIGHT - 14  # room for the title above and the step range below

    def xy(step: int, value: float) -> str:
        x = PAD + (step - x0) / (x1 - x0) * (WIDTH - 2 * PAD)
        y = bottom - (value - lo) / (hi - lo) * (bottom - top)
        return f"{x:.1f},{y:.1f}"

    line = " ".join(xy(s, v) for s, v in shown)
    small = 'font-size="10" fill="gray"'
    return (f'<svg class="ss-chart" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}">'
            f'<rect x="0" y="{top}" width="{WIDTH}" height="{bottom - top}" fill="none" stroke="rgba(127,127,127,0.3)"/>'
            f'<text x="{PAD}" y="14" font-size="12">{M.esc(head)}</text>'
            f'<text x="{WIDTH - PAD}" y="14" text-anchor="end" {small}>{M.esc(_text(max(values)))} max, '
            f'{M.esc(_text(min(values)))} min</text>'
            f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{line}"/>'
            f'<text x="{PAD}" y="{HEIGHT - 2}" {small}>step {steps[0]}</text>'
            f'<text x="{WIDTH - PAD}" y="{HEIGHT - 2}" text-anchor="end" {small}>step {steps[-1]}</text></svg>')


def charts_html(records: list[dict[str, Value]]) -> str:
    """Every key's chart, side by side, wrapping."""
    if not records:
        return M.note("No records yet: the charts start with the first write(log, logs(...)).")
    series = numbers(records)
    if not series:
        return M.note(f"{len(records)} records, none with a number to draw.")
    latest = {k: next(r[k] for r in reversed(records) if k in r) for k in series}
    charts = "".join(svg_chart(k, pts, latest[k]) for k, pts in series.items())
    return f'<div class="ss-live" style="display:flex;flex-wrap:wrap;gap:8px">{charts}</div>'


def _widget_html() -> Any:
    """An empty ipywidgets.HTML when a live frontend can show it (a Jupyter kernel), else None."""
    from .widgets import in_kernel, ipywidgets
    widgets = ipywidgets()
    return widgets.HTML() if widgets is not None and in_kernel() else None


class LiveSink(Sink):
    """The live sink: `records` holds every record, without step numbers, as memory()'s does."""

    def __init__(self, every: int = 10, fps: float = 10.0) -> None:
        super().__init__()
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"live: every must be a positive int (print every N-th record), got {every!r}")
        if not isinstance(fps, (int, float)) or not fps > 0:
            raise ValueError(f"live: fps must be a positive number of redraws a second, got {fps!r}")
        self.records: list[dict[str, Value]] = []
        self.every, self.interval = every, 1.0 / fps
        self.widget = _widget_html()  # None: no notebook, print instead
        self.shown = False
        self.drawn_at = 0.0  # time.monotonic() of the last redraw
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def _emit(self, step: int, values: dict[str, Value]) -> None:
        self.records.append(values)
        if self.widget is None:
            if step == 1 or step % self.every == 0:
                fields = "  ".join(f"{k}={_text(v)}" for k, v in values.items())
                print(f"step {step}  {fields}".rstrip(), file=sys.stdout, flush=True)
            return
        if not self.shown:  # in the output of the cell that writes the first record
            self.show()
        self._redraw_soon()

    def _redraw_soon(self) -> None:
        """Redraw now if the last redraw is `interval` old; otherwise once, when it will be."""
        with self._lock:
            wait = self.drawn_at + self.interval - time.monotonic()
            if wait > 0:
                if self._timer is None:
                    self._timer = threading.Timer(wait, self._redraw_later)
                    self._timer.daemon = True
                    self._timer.start()
                return
        self.redraw()

    def _redraw_later(self) -> None:
        with self._lock:
            self._timer = None
        self.redraw()

    def redraw(self) -> None:
        """Draw the charts of every record so far."""
        self.drawn_at = time.monotonic()
        if self.widget is not None:
            self.widget.value = self.html()

    def html(self) -> str:
        return charts_html(list(self.records))  # a copy: a timer may draw while the program writes

    def show(self) -> None:
        """Show the charts in the current cell's output (again, in a later cell, to follow a run there)."""
        if self.widget is None:
            raise RuntimeError("live: the charts need a Jupyter kernel with ipywidgets; here the sink prints "
                               f"every {self.every}-th record instead")
        from IPython.display import display

        from .widgets import Shown
        display(Shown(self.widget, "live charts of the logged numbers (drawn by Jupyter; `.records` holds them)"))
        self.shown = True
        self.redraw()

    def _repr_html_(self) -> str:
        return self.html()  # `sink` as a cell's last line: the charts as they are now

    def close(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if self.widget is not None and not self.closed:
            self.redraw()  # the last records, drawn
        super().close()
