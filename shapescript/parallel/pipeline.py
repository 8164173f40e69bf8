"""Pipelined steps: a controller's loop sends the next step before it reads the answer to this one.

A loop over batches in the controller calls a fn on the workers once a step. Waiting for each
answer before sending the next call leaves the workers idle for a round trip every step. Where
the typed program shows that the loop only writes a step's result to a sink (ir/defer.py marks
the call, the controller's module calls `RemoteFunction.later`), the call is sent at once
(`WorkerPool.submit`) and its result is a `Pending`; the answers are read one step behind. What
the user sees stays as if each call had been waited for:

- a sink gets each step's record in order: `write` queues a record while a value in it, or a
  record before it, is still pending, and the queue is written out as the answers come; a sink
  that isn't `passive` (runtime/sinks.py: the user's own, which may read the models) gets its
  record before the next step is sent, so it sees the models as that step left them;
- any other call (from this thread or another, a read of `m.w1` say) first reads every answer
  outstanding, so it sees the workers as the last step sent left them;
- a step that fails raises its error as a waited-for call would; the step sent after it is
  skipped by the workers (a chained Call: parallel/messages.py), and the records queued
  after the failed step's own are dropped, as they would never have been written;
- Ctrl-C waits for the steps sent to end, then raises StepInterrupt; one that lands in the
  controller's own code between two calls does the same (`settled`); from a step's sending until
  its record is queued it is held (`hold_until_written`), so that no step the workers ran lacks
  its record;
- when the controller's fn returns or raises, every answer is read first (`settled`).

SHAPESCRIPT_PIPELINE=off waits for each answer, as before.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from shapescript.parallel.interrupts import NotedInterrupts, StepInterrupt
from shapescript.runtime import sigint, sinks

PIPELINE_ENV = "SHAPESCRIPT_PIPELINE"


def enabled() -> bool:
    return os.environ.get(PIPELINE_ENV, "on").strip().lower() not in ("off", "0", "no", "false")


@dataclass
class InFlight:
    """A call sent to the workers whose answers haven't been read."""

    where: str
    answered: Callable[[list[Any] | None], None]  # its results, or None: it failed or never ran
    interrupted: float | None  # a Ctrl-C that came while it was sent
    arguments: Any  # kept until the answers come: their shared-memory rows' leases (parallel/shared.py)


_NOT_HELD = object()


class _Writes:
    """One thread's records waiting for pending values, in the order they were written, and its
    hold of Ctrl-C while a step sent has no record queued yet."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # a sink's write may call the program, which reads answers
        self.queue: deque[tuple[Any, sinks.Logs]] = deque()
        self.unrecorded: list[Pending] = []  # steps sent that no record written holds yet
        self.hold: Any = _NOT_HELD  # sigint's token while Ctrl-C is held for them
        self.seen = NotedInterrupts()  # the Ctrl-Cs during the hold

    def recorded(self, record: Any) -> None:
        """A record is written or queued: its steps have one. Ctrl-C noted meanwhile is raised once
        none is left without one (`settled` makes it a StepInterrupt)."""
        if not self.unrecorded:
            return
        values = record.values.values() if isinstance(record, sinks.Logs) else ()
        self.unrecorded = [p for p in self.unrecorded if all(v is not p for v in values)]
        if not self.unrecorded and self.release():
            raise KeyboardInterrupt

    def release(self) -> bool:
        """End the hold, if any: whether a Ctrl-C came during it."""
        self.unrecorded.clear()
        if self.hold is _NOT_HELD:
            return False
        sigint.release_ctrl_c(self.hold)
        self.hold = _NOT_HELD
        return self.seen.first is not None

    def flush(self) -> None:
        """Write out the records at the head whose values have all come."""
        with self.lock:
            while self.queue and not _waits(self.queue[0][1]):
                sink, record = self.queue.popleft()
                sinks.write(sink, _answered(record))

    def drop_failed(self) -> None:
        """A step failed: what was queued before it is written, what came after it never happened."""
        self.flush()
        with self.lock:
            self.queue.clear()


_threads = threading.local()


def _writes() -> _Writes:
    writes = getattr(_threads, "writes", None)
    if writes is None:
        writes = _threads.writes = _Writes()
    return writes


class Pending:
    """The result of a step sent without waiting, until its answer is read."""

    __slots__ = ("value", "done", "settle", "_writes")

    def __init__(self, settle: Callable[[], None]) -> None:
        self.value: Any = None
        self.done = False
        self.settle = settle  # reads the answers outstanding, this one's among them
        self._writes = _writes()  # the queue of the thread that runs the loop

    def resolve(self, value: Any) -> None:
        self.value, self.done = value, True
        self._writes.flush()

    def fail(self) -> None:
        self._writes.drop_failed()

    def __repr__(self) -> str:
        return f"<pending {self.value!r}>" if self.done else "<pending: the step's answer hasn't come>"


def hold_until_written(step: Pending) -> None:
    """Before a step is sent without waiting: Ctrl-C is noted, not raised, until the loop's `write`
    has queued a record holding its result (or `settled` ends). A KeyboardInterrupt in between
    would leave the workers running a step whose record is never written: the models one step
    beyond the sink."""
    writes = step._writes
    writes.unrecorded.append(step)
    if writes.hold is _NOT_HELD:
        writes.seen = NotedInterrupts()
        writes.hold = sigint.hold_ctrl_c(writes.seen)


def _waits(record: sinks.Logs) -> bool:
    return any(type(v) is Pending and not v.done for v in record.values.values())


def _answered(record: sinks.Logs) -> sinks.Logs:
    """The record with each pending value's answer in its place (all have come)."""
    return sinks.Logs(**{k: v.value if type(v) is Pending else v for k, v in record.values.items()})


def write(sink: Any, record: sinks.Logs) -> None:
    """The controller's `write`: at once, unless a value in the record, or a record before it, is
    still pending. A sink that isn't `passive` (one of the user's, which may read the models) gets
    its record before the next step is sent: the answers are read now."""
    writes = _writes()
    if writes.queue or (isinstance(record, sinks.Logs) and _waits(record)):
        with writes.lock:
            writes.queue.append((sink, record))
        if not getattr(sink, "passive", False):
            for value in record.values.values():
                if type(value) is Pending and not value.done:
                    value.settle()
        writes.flush()  # the values may have come meanwhile, from another thread's call
    else:  # a step's result whose answer another call read meanwhile (`l = step(..)`, `forward(..)`, then
        sinks.write(sink, _answered(record) if isinstance(record, sinks.Logs) else record)  # `logs(loss=l)`)
    writes.recorded(record)


@contextmanager
def settled(pool: Callable[[], Any], where: str, devices: object) -> Iterator[None]:
    """Around a call of a controller's fn (api.Function): every step it sent is answered before it
    returns or raises. Ctrl-C in the controller's own code, between two calls, is a StepInterrupt
    once the steps sent have ended: the workers are then between two steps, as after any."""
    writes = _writes()
    holding = writes.hold is not _NOT_HELD  # a caller's hold (a controller fn called by another's loop)
    try:
        yield
        if not holding and writes.release():  # a step sent whose record the fn never wrote
            raise KeyboardInterrupt
    except KeyboardInterrupt as exc:
        if not holding:
            writes.release()
        workers = pool()
        if isinstance(exc, StepInterrupt) or workers is None:  # already one, or the workers were stopped
            raise
        workers.settle()
        interrupt = StepInterrupt()
        interrupt.add_note(f"Interrupted in {where} between two steps: the steps sent to the workers ended "
                           f"first, so the models and optimizer state on {devices} are as the last of them "
                           f"left them, and the workers go on.")
        raise interrupt from None
    finally:
        if not holding:
            writes.release()
        workers = pool()
        if workers is not None:
            workers.settle()
