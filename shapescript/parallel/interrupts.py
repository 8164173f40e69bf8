"""Ctrl-C (the notebook's interrupt) during a call on the workers: the first one lets the step that
is running finish on every worker and then stops the program at that step boundary, so the models
and optimizer state on the workers stay, as a step leaves them; a second one within a few seconds
stops at once, and the workers with it, since what they hold is then half-changed.

On one device the same holds by construction: an optimizer step defers Ctrl-C to its end
(runtime/optim.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import FrameType

from shapescript.errors import WorkerError
from shapescript.runtime import sigint

SECOND_INTERRUPT_S = 3.0  # a second Ctrl-C within this many seconds of the first stops the workers


class StepInterrupt(KeyboardInterrupt):
    """Ctrl-C that waited for the workers' step to end: the models on the workers are as it left them."""


class NotedInterrupts:
    """A Ctrl-C holder (runtime/sigint.py) that notes when the first came (None: none yet) and
    raises KeyboardInterrupt at a second within SECOND_INTERRUPT_S."""

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


class preparing_a_call:  # noqa: N801 (used as a function: `with preparing_a_call(where, devices):`)
    """Around a call on the workers from its start (checking and encoding its arguments) to its
    end: a Ctrl-C that comes before the call reaches the workers is noted, and the call's wait
    (`until_the_step_ends`) takes it as its first, so that the step runs and StepInterrupt follows;
    one that comes after the wait, as the results are joined, raises StepInterrupt as the call ends.
    Without it, Ctrl-C between the calls of a loop from Python would often land outside the wait
    and be a plain KeyboardInterrupt. (This and the one below are classes, not @contextmanager
    generators: they run on every call, where a generator's set-up costs several µs.)"""

    __slots__ = ("_where", "_devices", "_token")

    def __init__(self, where: str, devices: object) -> None:
        self._where, self._devices = where, devices

    def __enter__(self) -> None:
        self._token = sigint.hold_ctrl_c(_note_early)

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        global _early
        sigint.release_ctrl_c(self._token)
        noted, _early = _early, None
        if noted is not None and exc_type is None:
            raise step_interrupt(self._where, self._devices)


class until_the_step_ends:  # noqa: N801 (used as a function: `with until_the_step_ends() as seen:`)
    """Around waiting for the workers' replies: Ctrl-C is noted, not raised (a second one within
    SECOND_INTERRUPT_S raises KeyboardInterrupt). Only the main thread gets signals; elsewhere
    nothing changes (runtime/sigint.py holds Ctrl-C without a handler install per call)."""

    __slots__ = ("_seen", "_token")

    def __enter__(self) -> NotedInterrupts:
        global _early
        seen = self._seen = NotedInterrupts()
        if threading.current_thread() is threading.main_thread():  # the thread that gets signals
            seen.first, _early = _early, None  # a Ctrl-C while the call was prepared counts as during its step
        self._token = sigint.hold_ctrl_c(seen)
        return seen

    def __exit__(self, exc_type: type[BaseException] | None = None, exc: BaseException | None = None,
                 *rest: object) -> None:
        sigint.release_ctrl_c(self._token)


class held_step(until_the_step_ends):  # noqa: N801 (used as a function: `with held_step(...) as seen:`)
    """until_the_step_ends around sending a call and waiting for its answers; a second Ctrl-C, or a
    failure of our own (anything but a WorkerError), calls `stop` with why: the workers' state is
    then unknown."""

    __slots__ = ("_stop", "_where", "_devices")

    def __init__(self, stop: Callable[[str], None], where: str, devices: object) -> None:
        self._stop, self._where, self._devices = stop, where, devices

    def __exit__(self, exc_type: type[BaseException] | None = None, exc: BaseException | None = None,
                 *rest: object) -> None:
        super().__exit__()
        if exc is None or isinstance(exc, WorkerError):
            return
        self._stop(f"interrupted while running {self._where}")
        if isinstance(exc, KeyboardInterrupt):
            exc.add_note(f"The workers on {self._devices} were stopped in the middle of {self._where}: the models "
                         f"and optimizer state on them are gone (their handles now say so). Make new ones, "
                         f"or restore a checkpoint; the next call starts new workers.")


def step_interrupt(where: str, devices: object, calls: int | None = None) -> StepInterrupt:
    """The interrupt raised once the step has ended on every worker; `calls`, when the caller counts
    them, is how many calls of `where` have ended so far (None: the note leaves the count out)."""
    so_far = "" if calls is None else f" ({calls} call{'s' if calls != 1 else ''} of it so far)"
    exc = StepInterrupt()
    exc.add_note(f"Interrupted after {where} ended on every worker{so_far}: the models and optimizer state on "
                 f"{devices} are as that step left them, and the workers go on. Interrupt twice within "
                 f"{SECOND_INTERRUPT_S:g} s to stop them in the middle of a step.")
    return exc
