"""Ctrl-C (the notebook's interrupt) during a call on the workers: the first one lets the step that
is running finish on every worker and then stops the program at that step boundary, so the models
and optimizer state on the workers stay, as a step leaves them; a second one within a few seconds
stops at once, and the workers with it, since what they hold is then half-changed.

On one device the same holds by construction: an optimizer step defers Ctrl-C to its end
(runtime/optim.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from shapescript.runtime import sigint

SECOND_INTERRUPT_S = 3.0  # a second Ctrl-C within this many seconds of the first stops the workers


class StepInterrupt(KeyboardInterrupt):
    """Ctrl-C that waited for the workers' step to end: the models on the workers are as it left them."""


class _Interrupts:
    """The Ctrl-Cs seen while a call runs: when the first came (None: none yet)."""

    def __init__(self) -> None:
        self.first: float | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.first is not None and now - self.first <= SECOND_INTERRUPT_S:
            raise KeyboardInterrupt  # the second: stop now
        self.first = now


_early: float | None = None  # when a Ctrl-C came while a call was being prepared (see preparing_a_call)


def _note_early(signum: int, frame: FrameType | None) -> None:
    global _early
    now = time.monotonic()
    if _early is not None and now - _early <= SECOND_INTERRUPT_S:
        raise KeyboardInterrupt  # the second: stop now (nothing of this call has reached the workers)
    _early = now


@contextmanager
def preparing_a_call(where: str, devices: object) -> Iterator[None]:
    """Around a call on the workers from its start (checking and encoding its arguments) to its
    end: a Ctrl-C that comes before the call reaches the workers is noted, and the call's wait
    (`until_the_step_ends`) takes it as its first, so that the step runs and StepInterrupt follows;
    one that comes after the wait, as the results are joined, raises StepInterrupt as the call ends.
    Without it, Ctrl-C between the calls of a loop from Python would often land outside the wait
    and be a plain KeyboardInterrupt."""
    global _early
    token = sigint.hold_ctrl_c(_note_early)
    ended = False
    try:
        yield
        ended = True
    finally:
        sigint.release_ctrl_c(token)
        noted, _early = _early, None
        if noted is not None and ended:
            raise step_interrupt(where, devices)


@contextmanager
def until_the_step_ends() -> Iterator[_Interrupts]:
    """Around waiting for the workers' replies: Ctrl-C is noted, not raised (a second one within
    SECOND_INTERRUPT_S raises KeyboardInterrupt). Only the main thread gets signals; elsewhere
    nothing changes (runtime/sigint.py holds Ctrl-C without a handler install per call)."""
    global _early
    seen = _Interrupts()
    if threading.current_thread() is threading.main_thread():  # the thread that gets signals
        seen.first, _early = _early, None  # a Ctrl-C while the call was prepared counts as during its step
    token = sigint.hold_ctrl_c(seen)
    try:
        yield seen
    finally:
        sigint.release_ctrl_c(token)


def step_interrupt(where: str, devices: object, calls: int | None = None) -> StepInterrupt:
    """The interrupt raised once the step has ended on every worker; `calls`, when the caller counts
    them, is how many calls of `where` have ended so far (None: the note leaves the count out)."""
    so_far = "" if calls is None else f" ({calls} call{'s' if calls != 1 else ''} of it so far)"
    exc = StepInterrupt()
    exc.add_note(f"Interrupted after {where} ended on every worker{so_far}: the models and optimizer state on "
                 f"{devices} are as that step left them, and the workers go on. Interrupt twice within "
                 f"{SECOND_INTERRUPT_S:g} s to stop them in the middle of a step.")
    return exc
