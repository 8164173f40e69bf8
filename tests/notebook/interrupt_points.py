"""Ctrl-C landed at a chosen point of a library's code, as a signal lands there: at the k-th line
that code runs, the handler SIGINT has at that moment is called in that frame (Python's own raises
KeyboardInterrupt there; a holder of ours notes it). No timing: each point is hit exactly.

Used by test_interrupted_bars.py in the test process, and read into a kernel by its kernel test."""

from __future__ import annotations

import gc
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

Tracer = Callable[[FrameType, str, Any], Any]


def _package_dirs(packages: Sequence[str]) -> tuple[str, ...]:
    import importlib
    dirs = []
    for name in packages:
        module = importlib.import_module(name)
        dirs.append(module.__file__.rsplit("/", 1)[0] + "/")  # type: ignore[union-attr]
    return tuple(dirs)


def _in_finalizer(frame: FrameType | None) -> bool:
    """Whether `frame` runs inside a `__del__`: Python drops an exception raised there (a KeyboardInterrupt
    too, by design), so a Ctrl-C can't be counted on to come out of one."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _traced(run: Callable[[], Any], packages: Sequence[str], on_line: Callable[[FrameType], None]) -> None:
    """Run `run` with `on_line` called at every line run in `packages`' code (this thread only),
    but for lines a finalizer runs: an object of an earlier run (kept alive by its exception's
    traceback) may be collected in the middle of this one, wherever the collector happens to run."""
    dirs = _package_dirs(packages)
    gc.collect()  # the earlier runs' garbage goes now, not in the middle of this run

    def local(frame: FrameType, event: str, arg: Any) -> Tracer:
        if event == "line" and not _in_finalizer(frame):
            on_line(frame)
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Tracer | None:
        return local if frame.f_code.co_filename.startswith(dirs) else None

    sys.settrace(calls)
    try:
        run()
    finally:
        sys.settrace(None)


Point = tuple[str, int, int]  # a line of a file, and which time it runs (from 1)
LOCKING = ("acquire", "release", "__enter__", "__exit__")


def lines_run(run: Callable[[], Any], packages: Sequence[str]) -> list[tuple[str, Point]]:
    """Each line `packages`' code runs during `run()`, in order: its function's name, and the point."""
    seen: list[tuple[str, Point]] = []
    times: dict[tuple[str, int], int] = {}

    def on_line(frame: FrameType) -> None:
        line = (frame.f_code.co_filename, frame.f_lineno)
        times[line] = times.get(line, 0) + 1
        seen.append((frame.f_code.co_name, (*line, times[line])))
    _traced(run, packages, on_line)
    return seen


def points(run: Sequence[tuple[str, Point]], most: int) -> list[Point]:
    """Where to land Ctrl-C in a run like `run` (lines_run's), about `most` points and some: each line
    of the functions that take and give back locks, the first four times it runs (a lock of tqdm's is
    two locks, taken one after the other, by one line), and the first time of evenly spaced others
    (a later time of those may not come again: tqdm redraws by the clock)."""
    firsts = [(name, point) for name, point in run if point[2] == 1 and name not in LOCKING]
    chosen = [point for name, point in run if name in LOCKING and point[2] <= 4]
    chosen += [point for _, point in firsts[::max(1, len(firsts) // most)]]
    return chosen


def interrupted_at(point: Sequence[Any], run: Callable[[], Any], packages: Sequence[str],
                   tries: int = 3) -> tuple[bool, BaseException | None]:
    """Run `run` with one Ctrl-C landed at `point` of `packages`' code: whether the point came, and the
    KeyboardInterrupt raised, if any. A run where the point didn't come is tried again, up to `tries`
    runs in all: a library may run a line only when enough time has passed (a bar's redraw)."""
    for _ in range(tries):
        came, raised = _interrupted_once(point, run, packages)
        if came:
            break
    return came, raised


def _interrupted_once(point: Sequence[Any], run: Callable[[], Any], packages: Sequence[str]) -> tuple[bool, BaseException | None]:
    file, line, nth = point
    times = 0

    def on_line(frame: FrameType) -> None:
        nonlocal times
        if frame.f_lineno == line and frame.f_code.co_filename == file:
            times += 1
            if times == nth:
                sys.settrace(None)
                handler = signal.getsignal(signal.SIGINT)
                assert callable(handler), handler
                handler(signal.SIGINT, frame)

    try:
        _traced(run, packages, on_line)
    except KeyboardInterrupt as e:
        return times >= nth, e
    return times >= nth, None


def lock_free(lock: Any, timeout: float = 5.0) -> bool:
    """Whether another thread can take `lock` (tqdm's: its every lock) within `timeout`."""
    import threading
    locks = getattr(lock, "locks", [lock])
    taken: list[bool] = []

    def take() -> None:
        for one in locks:
            got = one.acquire(timeout=timeout)
            taken.append(got)
            if got:
                one.release()

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    thread.join(timeout * len(locks) + 1)
    return len(taken) == len(locks) and all(taken)
