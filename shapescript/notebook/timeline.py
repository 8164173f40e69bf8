"""`%shapescript timeline`: where each worker's time goes, live (parallel/timeline.py measures it).

One stacked horizontal bar per worker for the latest call on the workers (of each of the last three
functions called): computing, loading data, each collective's transfer (by .ss line), waiting for
the other workers, and the controller's messages, scaled to the call's time, the slowest worker
marked; below them the table of the means over the last calls. Inline SVG in an output of its own
(text/html, with the table's text beside it), redrawn by display updates after each call at most
`fps` times a second (the last redraw comes from a timer, a moment after the last call), from a
thread of its own, so a call never waits for a drawing.

No ipywidget: an output holds what it last showed, so a notebook saved and opened again (without
the widgets' state, JupyterLab's default), or turned into HTML, shows the timeline as it was, where
a widget's view would say "Error displaying widget: model not found".
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Callable
from typing import Any

from ..parallel import timeline as T
from . import markup as M
from .throttle import Throttle
from .widgets import Shown, in_kernel, update_shown

WIDTH, BAR, GAP, NAME = 640, 22, 8, 150  # pixels: the drawing, a bar's height, between bars, the names' column
MEAN_OF = 20  # calls in the table below the bars
FUNCTIONS = 3  # the latest call of each of the functions called last gets its bars
COLORS = {"compute": "#1f77b4", "data": "#9467bd", "waiting": "#d62728", "messages": "#7f7f7f"}
TRANSFER_COLORS = ("#2ca02c", "#ff7f0e", "#17becf", "#bcbd22", "#8c564b", "#e377c2", "#98df8a", "#ffbb78")


def _segments(parts: T.WorkerParts, colors: dict[str, str]) -> list[tuple[str, float, str]]:
    """(name, seconds, color) of a worker's bar, left to right."""
    out = [("data", parts.data, COLORS["data"]), ("compute", parts.compute, COLORS["compute"])]
    out += [(name, seconds, colors[name]) for name, seconds in parts.transfer.items()]
    return out + [("waiting", parts.waiting, COLORS["waiting"]), ("messages", parts.messages, COLORS["messages"])]


def _transfer_colors(step: T.Step) -> dict[str, str]:
    names = list(dict.fromkeys(name for p in step.parts() for name in p.transfer))
    return {name: TRANSFER_COLORS[k % len(TRANSFER_COLORS)] for k, name in enumerate(names)}


def bars_svg(step: T.Step) -> str:
    """One `<svg>`: a bar per worker (a `<g class="ss-timeline-bar">` of `<rect>`s, each with its
    part's name and milliseconds as a tooltip), the slowest's name marked, and a legend."""
    colors = _transfer_colors(step)
    # A worker's parts add up to the controller's time of the call, unless the worker's own time was
    # longer (a call sent ahead of the reply before it: its messages are then "negative", drawn as
    # nothing): the longest bar, not the call's time, sets the scale, so no bar runs off the drawing.
    longest = max((sum(max(0.0, s) for _, s, _ in _segments(p, colors)) for p in step.parts()), default=0.0)
    slowest, scale = step.slowest(), (WIDTH - NAME) / max(step.wall, longest, 1e-9)
    legend = [(n, COLORS[n]) for n in ("data", "compute")] + list(colors.items()) + \
             [(n, COLORS[n]) for n in ("waiting", "messages")]
    rows = []
    for k, parts in enumerate(step.parts()):
        y, x = k * (BAR + GAP), float(NAME)
        rects = []
        for name, seconds, color in _segments(parts, colors):
            width = max(0.0, seconds) * scale
            rects.append(f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="{BAR}" fill="{color}">'
                         f'<title>{M.esc(name)}: {seconds * 1000:.2f} ms</title></rect>')
            x += width
        mark = " ◀ slowest" if parts.rank == slowest else ""
        weight = ' font-weight="bold"' if mark else ""
        rows.append(f'<g class="ss-timeline-bar" data-worker="{parts.rank}"><text x="0" y="{y + BAR - 6}" '
                    f'font-size="12"{weight} {M.TEXT_FILL}>{M.esc(parts.device + mark)}</text>{"".join(rects)}</g>')
    top = len(rows) * (BAR + GAP) + 4
    keys, x = [], 0
    for name, color in legend:
        keys.append(f'<rect x="{x}" y="{top}" width="10" height="10" fill="{color}"/>'
                    f'<text x="{x + 14}" y="{top + 9}" font-size="11" {M.TEXT_FILL}>{M.esc(name)}</text>')
        x += 24 + 7 * len(name)
    height, width = top + 16, max(WIDTH, x)
    return (f'<svg class="ss-timeline-bars" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
            f'{"".join(rows)}{"".join(keys)}</svg>')


def latest_calls(timeline: T.Timeline, functions: int = FUNCTIONS) -> list[T.Step]:
    """The latest call of each of the last `functions` functions called, the most recent first."""
    latest: dict[str, T.Step] = {}
    for step in reversed(list(timeline.steps)):  # a copy: a call may add a step meanwhile
        latest.setdefault(step.where, step)
        if len(latest) == functions:
            break
    return list(latest.values())


def timeline_html(timeline: T.Timeline | None, idle: str) -> str:
    """The bars of the latest calls and the table of the last `MEAN_OF` calls' means; `idle` says why
    there are none."""
    if timeline is None or not timeline.steps:
        return f'<div class="ss-timeline">{M.note(idle)}</div>'
    drawn = []
    for step in latest_calls(timeline):
        head = (f"{step.where}, call #{step.number} on {timeline.devices}: {step.wall * 1000:.1f} ms on the "
                f"controller; each bar is one worker's share of it, and the slowest is the one with the most "
                f"computing and loading, which the others waited for")
        drawn.append(f'<div style="margin-top:0.4em">{M.esc(head)}</div>{bars_svg(step)}')
    # line-height: the rows of the table close together, as in a terminal
    return (f'<div class="ss-timeline" style="line-height:1.35">{M.STYLE}{"".join(drawn)}'
            f"{timeline.table(MEAN_OF)._repr_html_()}</div>")


def _as_written(text: str) -> str:
    return text


class TimelineView:
    """The live timeline of a notebook: `source()` gives the timeline to show at first (the current
    program's pool's), `idle()` why there is none; after that, it shows whichever pool's timeline
    took the latest call."""

    def __init__(self, source: Callable[[], T.Timeline | None], idle: Callable[[], str], fps: float = 4.0,
                 in_cells: Callable[[str], str] | None = None) -> None:
        self.source, self.idle = source, idle
        self.in_cells = in_cells or _as_written  # the program's places as the cells say them
        self.timeline: T.Timeline | None = None
        self.idle_text = ""
        self.live = in_kernel()  # a frontend keeps the outputs and takes display updates
        self.display_id = f"ss-timeline-{uuid.uuid4().hex}"  # every output showing the view, updated together
        self.displayed = False  # whether an output shows it: only then do calls redraw it
        self.throttle = Throttle(self.redraw, 1.0 / fps)
        me = weakref.ref(self)  # the listener must not keep a forgotten view alive

        def listener(timeline: T.Timeline) -> None:
            view = me()
            if view is None:
                T.LISTENERS.remove(listener)
                return
            view.timeline = timeline
            if view.displayed:
                view.throttle.poke()

        T.LISTENERS.append(listener)

    def html(self) -> str:
        return self.in_cells(timeline_html(self.timeline, self.idle_text))

    def text(self) -> str:
        timeline = self.timeline
        if timeline is None or not timeline.steps:
            return self.idle_text
        return str(timeline.table(MEAN_OF).said_by(self.in_cells))

    def shown(self) -> Shown:
        """What `%shapescript timeline` shows: the current program's timeline (or why there is none),
        as the bars and the table in HTML, and the table's text."""
        self.timeline = self.source() or self.timeline
        self.idle_text = self.idle()
        return self._drawing()

    def _drawing(self) -> Shown:
        return Shown(None, self.text(), self.html())

    def redraw(self) -> None:
        """Every output showing the view, drawn again (from the throttle's timer thread: Ctrl-C
        comes to the main thread only, so no interrupt lands inside the kernel's messages)."""
        update_shown(self._drawing(), self.display_id)

    def show(self) -> None:
        """`%shapescript timeline`: the view in the cell's output, which later calls redraw, as they
        redraw every earlier cell's."""
        from IPython.display import display
        if not self.live:  # a terminal: the text, once
            display(self.shown())
            return
        display(self.shown(), display_id=self.display_id)
        self.displayed = True


_VIEWS: weakref.WeakKeyDictionary[Any, TimelineView] = weakref.WeakKeyDictionary()


def view_for(session: Any) -> TimelineView:
    """The session's one live view (displayed again by each `%shapescript timeline`, every display live)."""
    view = _VIEWS.get(session)
    if view is None:
        def source() -> T.Timeline | None:
            pool = session.program.last_pool if session.program is not None else None
            return pool.timeline if pool is not None else None

        def idle() -> str:  # the program's own words: one device, or no workers now
            program = session.program
            if program is None:
                return "No program yet: the timeline starts with the first call on the workers."
            bars = " The bars appear with the first call on them." if program.several else ""
            return program.timeline().message + bars

        in_cells = getattr(session, "in_cells", _as_written)  # a Session's; a stand-in may have none
        view = _VIEWS[session] = TimelineView(source, idle, in_cells=in_cells)
    return view
