"""Ctrl-C (the notebook's interrupt) during a call on the workers: the first one lets the step that
is running finish on every worker and then stops the program at that step boundary, so the models
and optimizer state on the workers stay, as a step leaves them; a second one within a few seconds
stops at once, and the workers with it, since what they hold is then half-changed. The first says
so at once, on stderr; a second within DOUBLE_CLICK_S of it is a double click, ignored, and says so.

On one device the same holds by construction: an optimizer step defers Ctrl-C to its end
(runtime/optim.py)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from shapescript.errors import WorkerError
from shapescript.runtime import sigint

SECOND_INTERRUPT_S = 3.0  # a second Ctrl-C within this many seconds of the first stops the workers
DOUBLE_CLICK_S = 0.8  # but one this soon after the first is the same press (a double click on ■): ignored

# What the first Ctrl-C does, and a double click, said at once (the step may run for minutes yet).
FIRST_SAID = (f"Interrupting: the step that is running finishes on every worker first, and the models "
              f"stay as it leaves them. Interrupt again within {SECOND_INTERRUPT_S:g} s to stop the workers "
              f"now, losing the models on them.\n")
DOUBLE_SAID = ("A second interrupt right after the first was taken for a double click and ignored: the step "
               "still finishes. Interrupt again to stop the workers now.\n")


class _Announcer:
    """Writes FIRST_SAID or DOUBLE_SAID to stderr from a thread of its own. The signal handler only
    writes a byte to a pipe (safe in a handler): the stream's lock may be held by the very code the
    signal interrupted, and taking it in the handler would wait forever."""

    MESSAGES = {1: FIRST_SAID, 2: DOUBLE_SAID}

    def __init__(self) -> None:
        self._fd: int | None = None
        self._pid = 0

    def ready(self) -> None:
        """Start the thread, once per process (a forked child has the pipe but not the thread)."""
        if self._pid == os.getpid():
            return
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._fd, self._pid = write, os.getpid()
        threading.Thread(target=self._say, args=(read,), name="shapescript-interrupts", daemon=True).start()

    def __call__(self, message: int) -> None:
        if self._fd is not None and self._pid == os.getpid():
            try:
                os.write(self._fd, bytes([message]))
            except OSError:  # the pipe is full: a message is waiting to be said already
                pass

    def _say(self, read: int) -> None:
        while True:
            code = os.read(read, 1)
            if not code:
                return
            try:
                sys.stderr.write(self.MESSAGES[code[0]])
                sys.stderr.flush()
            except (OSError, ValueError, AttributeError):  # no stderr, or it was closed
                pass


announce = _Announcer()


def _pressed(first: float | None, now: float) -> bool:
    """A Ctrl-C at `now`, after a first at `first` (None: it is the first): True to stop at once (the
    second, soon after the first); else it is said what it does."""
    if first is None or now - first > SECOND_INTERRUPT_S:
        announce(1)
        return False
    if now - first < DOUBLE_CLICK_S:
        announce(2)
        return False
    return True


class StepInterrupt(KeyboardInterrupt):
    """Ctrl-C that waited for the workers' step to end: the models on the workers are as it left them."""


class NotedInterrupts:
    """A Ctrl-C holder (runtime/sigint.py) that notes when the first came (None: none yet) and
    raises KeyboardInterrupt at a second within SECOND_INTERRUPT_S (not within DOUBLE_CLICK_S),
    saying at once what each does."""

    def __init__(self) -> None:
        self.first: float | None = None
        announce.ready()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if _pressed(self.first, now):
            raise KeyboardInterrupt  # the second: stop now
        if self.first is None or now - self.first > SECOND_INTERRUPT_S:
            self.first = now


_early: float | None = None  # when a Ctrl-C came while a call was being prepared (see preparing_a_call)


def _note_early(signum: int, frame: FrameType | None) -> None:
    global _early
    now = time.monotonic()
    if _pressed(_early, now):
        raise KeyboardInterrupt  # the second: stop now (nothing of this call has reached the workers)
    if _early is None or now - _early > SECOND_INTERRUPT_S:
        _early = now


class preparing_a_call:
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
        announce.ready()
        self._token = sigint.hold_ctrl_c(_note_early)

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        global _early
        sigint.release_ctrl_c(self._token)
        noted, _early = _early, None
        if noted is not None and exc_type is None:
            raise step_interrupt(self._where, self._devices)


class until_the_step_ends:
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


class held_step(until_the_step_ends):
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
