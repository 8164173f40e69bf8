"""Step boundaries, for a function that runs in the background (`run(m, opt, data, log,
background=True)`, shapescript/background.py).

A step is one pass of a loop's body over a batch: loading the batch, the step it takes (on one
device or on the workers), and whatever the body writes. A background run holds `STEP_LOCK` for
each step, so anything else that reads or changes what a step changes (reading `m.w1`, a call of
another function, `%shapescript status`) takes it too and runs between two steps, never in the
middle of one. A stop asked of a run takes effect at the next boundary: the run's thread raises
`RunStopped` there, so nothing is left half-changed.

While no run is going, nothing here costs more than reading one int.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from . import sigint

# Held by a background run's thread while a step runs; re-entrant, so the run's own calls (which
# take it like anyone's) go through.
STEP_LOCK = threading.RLock()
_NOTHING_HELD = nullcontext()
_running = 0  # how many background runs are going (changed only under _count_lock)
_count_lock = threading.Lock()
_this_thread = threading.local()  # .control: the run this thread carries out, if any


class RunStopped(Exception):
    """Raised in a background run's thread at a step boundary, once a stop was asked for."""


class StepSkipped(Exception):
    """Raised on a worker whose call must change nothing there because the step failed elsewhere:
    another worker couldn't load its part of the batch (they agreed so before the step), another
    raised an error of its own (found at the sum of the failure flags before an update or at the
    call's end, runtime/ledger.py, or at a sum through shared memory: runtime/shm_reduce.py), or the
    controller couldn't write the record of the step sent before it (a "chained" call:
    parallel/pipeline.py). The worker answers that it skipped it, and skips a chained call after it."""


class StepControl:
    """What a background run's loops report to, and how it is asked to stop."""

    def __init__(self) -> None:
        self.steps = 0  # steps ended, over every loop of the run
        self.loop_steps = 0  # steps ended in the current pass of the current loop
        self.loop_total: int | None = None  # batches in that pass
        self.loop_name = ""  # its data type's name
        self.passes = 0  # passes of loops over batches begun
        self.stop_asked = False
        self.stopped = False  # stopped at a step boundary: the last batch's step had ended

    def boundary(self) -> None:
        if self.stop_asked:
            self.stopped = True
            raise RunStopped()

    def steps_of(self, batches: Iterator[Any], count: int, what: str) -> Iterator[Any]:
        """`batches`, each one loaded and used while this thread holds STEP_LOCK, checking for a
        stop before each."""
        self.passes += 1
        self.loop_steps, self.loop_total, self.loop_name = 0, count, what
        it = iter(batches)
        try:
            while True:
                self.boundary()
                with STEP_LOCK:
                    try:
                        batch = next(it)
                    except StopIteration:
                        return
                    yield batch  # the loop's body runs here, the lock still held
                self.steps += 1
                self.loop_steps += 1
                _let_waiters_in()
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()


class _BetweenSteps:
    """STEP_LOCK, counting who waits for it, so that a run lets them in at its next boundary (a
    lock's release wakes a waiter, but the thread that released it would most often take it again
    first, starving the rest).

    Taken so that Ctrl-C can't leave it held: a KeyboardInterrupt raised in `__enter__` after the
    lock was taken would leave it taken for good (no `__exit__` runs), and the background run would
    wait for it forever. So Ctrl-C is held back while the lock is waited for (a press gives up the
    wait, without the lock, and is passed on), and let through again as the last thing `__enter__`
    does, after which CPython checks for signals only inside the `with` block."""

    def __enter__(self) -> None:
        global _waiting
        with _count_lock:
            _waiting += 1
        try:
            while True:
                presses = sigint.Presses()
                token = sigint.hold_ctrl_c(presses)
                taken, poll = False, -1 if token is False else _PRESS_POLL_S  # False: no signals here
                while not (taken or presses.count):
                    taken = STEP_LOCK.acquire(timeout=poll)
                if taken and not presses.count:
                    break
                if taken:
                    STEP_LOCK.release()
                sigint.release_ctrl_c(token)
                presses.deliver()  # Python's handler raises KeyboardInterrupt; a holder's may go on
        finally:
            with _count_lock:
                _waiting -= 1
        sigint.release_ctrl_c(token)

    def __exit__(self, *exc: object) -> None:
        STEP_LOCK.release()


_BETWEEN_STEPS = _BetweenSteps()
_waiting = 0  # threads waiting for STEP_LOCK in between_steps
_PRESS_POLL_S = 0.05  # how soon a Ctrl-C while waiting for STEP_LOCK gives up the wait
LET_IN_S = 1.0  # the longest a run waits at a boundary for the others to take their turn


def _let_waiters_in() -> None:
    """At a step boundary, wait until whoever waits for the lock has taken it."""
    if not _waiting:
        return
    deadline = time.monotonic() + LET_IN_S
    while _waiting and time.monotonic() < deadline:
        time.sleep(0.0005)


def between_steps() -> AbstractContextManager[Any]:
    """Hold this around anything that reads or changes what a step changes: while a background run
    goes, it waits for the step in progress to end."""
    return _BETWEEN_STEPS if _running else _NOTHING_HELD


def current() -> StepControl | None:
    """The background run this thread carries out, if any."""
    return getattr(_this_thread, "control", None)


def run_started() -> None:
    """A background run is about to start (called by the thread that starts it, so that calls from
    that thread right after already wait for steps)."""
    global _running
    with _count_lock:
        _running += 1


def run_ended() -> None:
    global _running
    with _count_lock:
        _running -= 1


def carry_out(control: StepControl | None) -> None:
    """Set (or clear, with None) the run this thread carries out."""
    _this_thread.control = control
