"""Ctrl-C landed anywhere in a progress bar's code leaves no lock taken: a notebook
once stayed at "batch 0" for good after a few ■ presses during loops with bars, since one had landed
inside tqdm's lock code and left its lock taken; the background run then waited for it, holding the
step lock, and a read of `m.w1` waited for that. Each interrupt is landed at an exact line of tqdm's
code (interrupt_points.py), then another thread must be able to take tqdm's lock, and a background
run must train while a field is read. test_interrupted_bars_kernel.py does the same in a real kernel."""

from __future__ import annotations

import functools
import gc
import io
import threading
from collections.abc import Iterator

import pytest
import torch
from interrupt_points import interrupted_at, lines_run, lock_free, points
from test_widgets import FIT, dataset
from tqdm.std import tqdm  # type: ignore[import-untyped]

import shapescript as ss
from shapescript.notebook import progress
from shapescript.runtime import loops, steps

TEXT_BARS = functools.partial(tqdm, file=io.StringIO(), mininterval=0)  # every update draws: more code to land in
WAIT_S = 20.0  # for a background run of three batches, and a read, on a loaded machine


@pytest.fixture(scope="module")
def prog() -> ss.Program:
    return ss.load(FIT, devices="cpu", name="fit.ss")


@pytest.fixture(autouse=True)
def text_bars() -> object:
    """Bars for every loop, as in a notebook, and the hooks as they were afterwards."""
    with progress.bars(TEXT_BARS):
        yield


@pytest.fixture
def collections_see_this_test_only() -> Iterator[None]:
    """Each traced run first collects the earlier runs' garbage (interrupt_points._traced): a full
    collection, which late in the suite also scans all that the tests before left alive (the test
    took 32 s in CI, 20 s after tests/compiler and tests/runtime alone, 1 s by itself). What is alive
    before the test is frozen out of the collector's way, as tests/conftest.py freezes what
    collection left; each run's collection still frees all that the runs made. Afterwards all is
    unfrozen, collected, and frozen again (unfreezing undoes conftest's freeze too)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect()
        gc.freeze()


def read_while_training(prog: ss.Program) -> None:
    """A background run of `fit` ends, and a field is read meanwhile, each within WAIT_S."""
    m = prog.Lin.init(seed=0)
    run = prog.fit(m, ss.adamw(m, lr=0.1), dataset(), ss.sinks.memory(), background=True)
    read: list[torch.Tensor] = []
    reader = threading.Thread(target=lambda: read.append(m.w), daemon=True)  # the test must not hang
    reader.start()
    reader.join(WAIT_S)
    assert read and read[0].shape == (4, 3), "reading a field waited for good"
    run.wait(timeout=WAIT_S)
    assert run.state == "finished" and run.steps == 3


@pytest.mark.usefixtures("collections_see_this_test_only")
def test_ctrl_c_anywhere_in_tqdm_leaves_its_lock_free_and_a_background_run_trains(prog: ss.Program) -> None:
    m = prog.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.1)

    def fit() -> None:
        prog.fit(m, opt, dataset(), ss.sinks.memory())

    fit()  # tqdm does some things once (its multiprocessing lock, a check of the terminal): not counted
    run = lines_run(fit, ["tqdm"])
    tried = points(run, most=60)
    assert any(name == "acquire" for name, _ in run)  # tqdm takes its lock in what we call
    locking = {point for name, point in run if name in ("acquire", "release")}
    missed = []
    for point in tried:
        came, raised = interrupted_at(point, fit, ["tqdm"])
        where = f"Ctrl-C at {point} of tqdm's code"
        if not came:  # a line tqdm runs by the clock (its redraws), which a loaded machine may change
            missed.append(point)
            continue
        assert isinstance(raised, KeyboardInterrupt), f"{where} was lost"  # held back, not dropped
        assert lock_free(tqdm.get_lock()), f"{where} left tqdm's lock taken"
        assert not steps.STEP_LOCK._is_owned(), where  # type: ignore[attr-defined]
        read_while_training(prog)
    assert len(tried) > 40 and not locking & set(missed) and len(missed) <= len(tried) // 5, missed


def test_ctrl_c_while_waiting_for_a_step_gives_up_the_wait_without_the_lock(prog: ss.Program) -> None:
    """A Ctrl-C in the main thread while it waits for the background run's step (reading a field)
    raises KeyboardInterrupt there, and the step lock is not left taken: the run goes on."""
    import signal
    m = prog.Lin.init(seed=0)
    started, release = threading.Event(), threading.Event()

    class Held(ss.sinks.Sink):  # holds the run's first step until the test says
        def _emit(self, step: int, values: dict[str, object]) -> None:
            started.set()
            release.wait(WAIT_S)

    loops.progress = None
    run = prog.fit(m, ss.adamw(m, lr=0.1), dataset(), Held(), background=True)
    assert started.wait(WAIT_S)
    timer = threading.Timer(0.3, signal.raise_signal, (signal.SIGINT,))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            m.w  # noqa: B018  (a read that waits for the step, until the Ctrl-C)
    finally:
        timer.cancel()
        release.set()
    run.wait(timeout=WAIT_S)
    assert run.state == "finished" and run.steps == 3
    assert not steps.STEP_LOCK._is_owned()  # type: ignore[attr-defined]
