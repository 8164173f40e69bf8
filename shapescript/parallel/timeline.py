"""Where each worker's time goes in a call on the workers: computing, loading
data, in each collective (by its .ss line), waiting for the other workers, and the controller's
messages. One step is one call of a program's function on the workers (`train_step`).

On a worker, a `StepClock` times each run of the "call" handler (program_handlers.py, which runs
the program's code): the whole call, the loading of its batches (`loading()`, around decoding the
arguments: a batch the prefetch thread has ready costs nothing here), and every collective, which
`WorkerState.waiting_at` brackets with `begin` / `end` (the compiled code calls it around each one,
with its .ss location; `collectives.operation_hook` names the operation just before). On cpu these
are `time.perf_counter()` reads (Gloo's collectives return when they are done): a few µs a call
(see docs/several-devices.md). On cuda a collective only starts when `dist.all_reduce` returns, so
each is a pair of `torch.cuda.Event`s on the current stream, read at the call's end after waiting for
its last event (the call's result is copied to the CPU then anyway); untested without a GPU.

The handler's answer carries the worker's `WorkerTiming` back; the controller's `RemoteFunction`
adds every worker's to the pool's `Timeline` with its own wall time of the call (from its start,
splitting the arguments, to the joined result; a call that first waits for the workers to start or
to load the program isn't kept), and each `Step` splits every worker's time into parts that add up
to that wall time by construction:

- transfer, per collective: the fastest worker's time in that occurrence of it (matched across the
  workers by order: every worker runs the same collectives); waiting: the rest of each worker's time
  there, spent until the last worker arrived;
- data: the worker's time loading its part of the batches;
- compute: the rest of the worker's time in the call;
- messages: the controller's wall time less the worker's: splitting and pickling the arguments,
  the pipes, and waiting for the other workers' replies.

A step sent without waiting (parallel/pipeline.py) has for its wall time the time from its sending,
or from the answer to the step before it if that came later, to its own answer: the loop's time per
step, of which the round trip the pipeline hides is no part.

`SHAPESCRIPT_TIMELINE=off` in the environment turns the workers' clocks off.
"""

from __future__ import annotations

import html
import os
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

import torch

from shapescript.cell_styles import FIGURE_CELL, TEXT_CELL

TIMELINE_ENV = "SHAPESCRIPT_TIMELINE"
KEEP = 500  # steps the controller keeps


# -- on a worker ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkerTiming:
    """One worker's call, in seconds: the whole call, loading data, and each collective in the order
    it ran, as (.ss location, operation, seconds); the operation is "" where the runtime names none."""

    total: float
    data: float
    collectives: tuple[tuple[str, str, float], ...]


def _enabled() -> bool:
    return os.environ.get(TIMELINE_ENV, "on").strip().lower() not in ("off", "0", "no", "false")


class StepClock:
    """A worker's timing of its current call. Outside a timed call every method does nothing."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.enabled = _enabled()
        self.running = False
        self.last: WorkerTiming | None = None  # the last timed call's, until `take`n
        self._start = 0.0
        self._data = 0.0
        self._op = ""
        self._spans: list[list[Any]] = []  # [where, operation, start, end]: floats, or cuda events

    def operation(self, op: str) -> None:
        """The operation of the collective about to start (collectives.operation_hook)."""
        self._op = op

    def start(self) -> None:
        self.running, self.last = True, None
        self._data, self._op, self._spans = 0.0, "", []
        self._start = time.perf_counter()

    def begin(self, where: str) -> None:
        """A collective at `where` starts."""
        if self.running:
            op, self._op = self._op, ""
            self._spans.append([where, op, self._now(), None])

    def end(self) -> None:
        """The collective last begun has ended."""
        if self.running and self._spans and self._spans[-1][3] is None:
            self._spans[-1][3] = self._now()

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def loading(self) -> _Loading:
        """Around loading the call's batches."""
        return _Loading(self)

    def finish(self) -> None:
        """The call has ended: `last` is its WorkerTiming."""
        if not self.running:
            return
        self.running = False
        if self.cuda and self._spans:
            done = self._now()
            done.synchronize()  # the collectives' events are read once the call's work has run
            seconds = [(w, op, a.elapsed_time(b if b is not None else done) / 1000) for w, op, a, b in self._spans]
        else:
            ended = time.perf_counter()
            seconds = [(w, op, (b if b is not None else ended) - a) for w, op, a, b in self._spans]
        self.last = WorkerTiming(time.perf_counter() - self._start, self._data, tuple(seconds))

    def abandon(self) -> None:
        self.running, self.last = False, None

    def take(self) -> WorkerTiming | None:
        """The last call's timing, once."""
        timing, self.last = self.last, None
        return timing


WiredTiming = tuple[float, float, tuple[tuple[str, str, float], ...]]


def wired(timing: WorkerTiming | None) -> WiredTiming | None:
    """A WorkerTiming as a reply carries it: its fields in a plain tuple, which pickles in a third of
    the dataclass's time, on every call (`Timeline.add` rebuilds it)."""
    return None if timing is None else (timing.total, timing.data, timing.collectives)


# The two context managers below are classes, not @contextmanager generators: they run on every call
# (a generator's set-up costs a few µs a call, a class's well under one).

class _Loading:
    """StepClock.loading(): adds the block's time to the call's data time."""

    def __init__(self, clock: StepClock) -> None:
        self._clock, self._began = clock, 0.0

    def __enter__(self) -> None:
        self._began = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._clock._data += time.perf_counter() - self._began


class timed:
    """Around a call of the program's code (the "call" handler); then `clock.take()` is its timing."""

    def __init__(self, clock: StepClock) -> None:
        self._clock = clock

    def __enter__(self) -> None:
        if self._clock.enabled:
            self._clock.start()

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if not self._clock.enabled:
            return
        if exc_type is not None:
            self._clock.abandon()
        else:
            self._clock.finish()


# -- on the controller ---------------------------------------------------------------------------

def label(where: str, op: str) -> str:
    """A collective's column: "mlp.ss:18:12 all-reduce"."""
    return f"{where} {op}" if op else where


@dataclass(frozen=True)
class WorkerParts:
    """One worker's share of one step, in seconds; the parts add up to `step`."""

    rank: int
    device: str
    step: float  # the controller's wall time of the call
    compute: float
    data: float
    transfer: dict[str, float]  # by collective label: the fastest worker's time there
    waiting: float
    waited_at: dict[str, float]  # the waiting, by collective label
    messages: float

    @property
    def busy(self) -> float:
        """What the others wait for: the worker's own computing and loading."""
        return self.compute + self.data


@dataclass(frozen=True)
class Step:
    """One call on the workers: which function (`where`, as the pool names it), the controller's wall
    time of it, and every worker's timing, in rank order."""

    number: int
    where: str
    wall: float
    workers: tuple[WorkerTiming, ...]
    devices: tuple[str, ...]
    _parts: tuple[WorkerParts, ...] | None = field(default=None, compare=False, repr=False)

    @property
    def fn(self) -> str:
        """The function's name: "train_step" from "`train_step` (mlp.ss:21:1)"."""
        return self.where.split("`")[1] if self.where.count("`") >= 2 else self.where

    def parts(self) -> tuple[WorkerParts, ...]:
        """Each worker's parts, in rank order (computed once; a display's thread may ask too)."""
        if self._parts is None:
            object.__setattr__(self, "_parts", tuple(_split(self)))
        assert self._parts is not None
        return self._parts

    def slowest(self) -> int:
        """The rank the others waited for: the most computing and loading."""
        return max(self.parts(), key=lambda p: p.busy).rank


def _split(step: Step) -> list[WorkerParts]:
    shared = min(len(w.collectives) for w in step.workers)  # occurrences every worker ran, matched in order
    fastest = [min(w.collectives[k][2] for w in step.workers) for k in range(shared)]
    out = []
    for rank, w in enumerate(step.workers):
        transfer: dict[str, float] = {}
        waited_at: dict[str, float] = {}
        for k, (where, op, seconds) in enumerate(w.collectives):
            name = label(where, op)
            quickest = fastest[k] if k < shared else seconds  # one no other worker ran: all transfer
            transfer[name] = transfer.get(name, 0.0) + quickest
            waited_at[name] = waited_at.get(name, 0.0) + seconds - quickest
        in_collectives = sum(s for _, _, s in w.collectives)
        out.append(WorkerParts(rank, step.devices[rank], step.wall, w.total - w.data - in_collectives, w.data,
                               transfer, sum(waited_at.values()), waited_at, step.wall - w.total))
    return out


Listener = Callable[["Timeline"], None]
LISTENERS: list[Listener] = []  # called after each step, in the calling thread: keep them quick


class Timeline:
    """A pool's last `KEEP` steps, and who to tell of each new one (`LISTENERS`)."""

    def __init__(self, devices: str, labels: list[str]) -> None:
        self.devices, self.labels = devices, tuple(labels)
        self.steps: deque[Step] = deque(maxlen=KEEP)
        self.count = 0  # steps so far, kept or not

    def add(self, where: str, wall: float, timings: list[Any]) -> Step | None:
        """A call that ended on every worker; kept if every worker timed it. `timings`: each worker's
        `wired` timing."""
        if not timings or any(not isinstance(t, tuple) for t in timings):
            return None
        self.count += 1
        step = Step(self.count, where, wall, tuple(WorkerTiming(*t) for t in timings), self.labels)
        self.steps.append(step)
        for listener in list(LISTENERS):
            try:
                listener(self)
            except Exception as exc:
                warnings.warn(f"the timeline's display failed: {type(exc).__name__}: {exc}", stacklevel=2)
        return step

    def table(self, last: int | None = None) -> TimelineTable:
        steps = list(self.steps)
        if last is not None:
            steps = steps[-last:] if last > 0 else []
        message = "" if steps else f"No calls on the workers on {self.devices} have been timed yet."
        return TimelineTable(steps, self.devices, message)


def table_of(timeline: Timeline | None, devices: str, several: bool, last: int | None = None) -> TimelineTable:
    """`Program.timeline()`: the table of the pool's timeline, or one that says why there is none."""
    if last is not None and (isinstance(last, bool) or not isinstance(last, int) or last < 0):
        raise ValueError(f"timeline: last is a number of steps (an int, 0 or more), not {last!r}")
    if not several:
        return TimelineTable([], devices, f"The program runs on one device ({devices}): the timeline shows "
                                          f"how the workers of several devices spend a call, and there are none.")
    if timeline is None:
        return TimelineTable([], devices, f"No workers run on {devices} now: the timeline is theirs, and "
                                          f"starts with the first call on them.")
    return timeline.table(last)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


@dataclass(frozen=True)
class Section:
    """One function's rows in the table: the mean of its steps' parts per worker, in milliseconds."""

    title: str
    header: tuple[str, ...]
    cells: tuple[tuple[str, ...], ...]  # per worker: the device, then the figures
    slowest: int  # the rank marked


class TimelineTable:
    """The timeline as a table: `str()` for a terminal, `_repr_html_` for a notebook, `.rows` for
    Python (one dict per step and worker, in seconds), `.steps` the steps themselves."""

    def __init__(self, steps: list[Step], devices: str, message: str = "") -> None:
        self.steps, self.devices, self.message = steps, devices, message
        self.say: Callable[[str], str] = lambda text: text  # how its titles and headers say the program's places

    def said_by(self, say: Callable[[str], str]) -> TimelineTable:
        """The same table, saying the program's places ("notebook.ss:12:5") as `say` does (a notebook's
        cells), before its columns are lined up."""
        table = TimelineTable(self.steps, self.devices, self.message)
        table.say = say
        return table

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Per step and worker: step, fn, worker, device, wall (the controller's time of the call), compute,
        data, one key per collective label (its transfer), waiting, messages, slowest (a bool)."""
        out = []
        for step in self.steps:
            slowest = step.slowest()
            for p in step.parts():
                out.append({"step": step.number, "fn": step.fn, "worker": p.rank, "device": p.device,
                            "wall": step.wall, "compute": p.compute, "data": p.data, **p.transfer,
                            "waiting": p.waiting, "messages": p.messages, "slowest": p.rank == slowest})
        return out

    def sections(self) -> list[Section]:
        """One per function, the most recently called first: each worker's mean parts over its steps."""
        by_fn: dict[str, list[Step]] = {}
        for step in reversed(self.steps):
            by_fn.setdefault(step.where, []).append(step)
        said = [_section(where, steps, self.devices) for where, steps in by_fn.items()]
        return [Section(self.say(s.title), tuple(map(self.say, s.header)), s.cells, s.slowest) for s in said]

    def __str__(self) -> str:
        if self.message:
            return self.message
        blocks = []
        for s in self.sections():
            grid = [list(s.header) + [""]] + [list(c) + ["<- slowest" if k == s.slowest else ""]
                                               for k, c in enumerate(s.cells)]
            widths = [max(len(r[k]) for r in grid) for k in range(len(grid[0]))]
            lines = ["  ".join(cell.ljust(w) if k == 0 else cell.rjust(w) for k, (cell, w) in
                               enumerate(zip(r[:-1], widths))) + ("  " + r[-1] if r[-1] else "") for r in grid]
            blocks.append("\n".join([s.title] + [line.rstrip() for line in lines]))
        return "\n\n".join(blocks)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        if self.message:
            return f'<div class="ss-note">{html.escape(self.message)}</div>'
        out = []
        for s in self.sections():
            head = "".join(f'<th style="{TEXT_CELL}">{html.escape(h)}</th>' for h in s.header + ("",))
            body = "".join(
                ('<tr class="ss-slowest">' if k == s.slowest else "<tr>")
                + f'<td style="{TEXT_CELL}">{html.escape(c[0])}</td>'
                + "".join(f'<td class="ss-num" style="{FIGURE_CELL}">{html.escape(v)}</td>' for v in c[1:])
                + f'<td style="{TEXT_CELL}">{"<b>slowest</b>" if k == s.slowest else ""}</td></tr>'
                for k, c in enumerate(s.cells))
            out.append(f"<div>{html.escape(s.title)}</div>"
                       f'<table class="ss-timeline-table"><tr>{head}</tr>{body}</table>')
        return "".join(out)


def _section(where: str, steps: list[Step], devices: str) -> Section:
    labels = list(dict.fromkeys(name for step in steps for p in step.parts() for name in p.transfer))
    per_worker = list(zip(*(step.parts() for step in steps)))  # each worker's parts, step by step

    cells = []
    for parts in per_worker:
        figures = [[p.step, p.compute, p.data, *(p.transfer.get(name, 0.0) for name in labels), p.waiting, p.messages]
                   for p in parts]
        cells.append((parts[0].device, *(_ms(fmean(column)) for column in zip(*figures))))
    slowest = max(range(len(per_worker)), key=lambda rank: fmean(p.busy for p in per_worker[rank]))
    calls = f"{len(steps)} call{'s' if len(steps) != 1 else ''}"
    title = f"{where} on {devices}: mean ms of {calls} (the last: #{steps[0].number})"
    return Section(title, ("worker", "call", "compute", "data", *labels, "waiting", "messages"),
                   tuple(cells), slowest)
