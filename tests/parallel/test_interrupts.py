"""Ctrl-C during a call on the workers, a safe interrupt: the first waits for the step to end
on every worker, and the models stay; a second within a few seconds stops the workers at once."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from programs import README
from support import LONG_STEP, interrupted_once, interrupted_twice

import shapescript as ss
from shapescript.errors import WorkerError
from shapescript.parallel.interrupts import StepInterrupt

pytestmark = pytest.mark.slow


def test_an_interrupt_waits_for_the_step_and_the_models_stay(no_stray_interrupts: None) -> None:
    prog = ss.load(README, devices="cpu[0 1]", name="mlp.ss")
    try:
        m = prog.Mlp.init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        before = m.w1
        pool = prog.workers()
        interrupt = interrupted_once(pool)  # in the middle of a step, which runs to its end
        assert f"{LONG_STEP} ended on every worker" in "\n".join(interrupt.__notes__)
        assert pool.alive and torch.equal(m.w1, before)  # the workers and the model are still there
        batch = {"img": torch.randn(8, 784), "label": torch.arange(8) % 10}
        assert float(prog.train_step(m, opt, batch)) > 0  # and train on
        assert not torch.equal(m.w1, before)
    finally:
        prog.stop()


def test_a_second_interrupt_stops_the_workers_at_once(no_stray_interrupts: None) -> None:
    prog = ss.load(README, devices="cpu[0 1]", name="mlp.ss")
    try:
        m = prog.Mlp.init(seed=0)
        pool = prog.workers()
        interrupt = interrupted_twice(pool)  # at once
        assert f"were stopped in the middle of {LONG_STEP}" in "\n".join(interrupt.__notes__)
        assert not pool.alive
        with pytest.raises(WorkerError, match="workers that have stopped"):
            m.w1  # noqa: B018  (a read, refused)
    finally:
        prog.stop()


def test_an_interrupt_while_the_arguments_are_checked_waits_for_the_step(
        no_stray_interrupts: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C before the call reaches the workers (here: while its batch is checked, where a loop of
    calls from Python spends some of its time) counts as during the step: the step runs, then
    StepInterrupt, as for one that comes while the workers compute."""
    prog = ss.load(README, devices="cpu[0 1]", name="mlp.ss")
    try:
        m = prog.Mlp.init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        batch = {"img": torch.randn(8, 784), "label": torch.arange(8) % 10}
        step = prog.train_step
        step(m, opt, batch)
        before = m.w1
        checked = step._checked_args

        def interrupted(*args: object) -> object:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # handled here, between bytecodes, before the call reaches the workers
            return checked(*args)

        monkeypatch.setattr(step, "_checked_args", interrupted)
        with pytest.raises(StepInterrupt) as info:
            step(m, opt, batch)
        assert "ended on every worker" in "\n".join(info.value.__notes__)
        assert not torch.equal(m.w1, before)  # the step ran
        monkeypatch.undo()
        after = m.w1
        assert float(step(m, opt, batch)) > 0 and not torch.equal(m.w1, after)  # and training goes on
    finally:
        prog.stop()


def test_each_press_is_said_at_once_and_a_double_click_is_ignored(capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The first Ctrl-C says what it does, on stderr, while the step still runs; a second within
    DOUBLE_CLICK_S is the same press, ignored and said so; one later stops. The
    handler itself only writes to a pipe: the saying is a thread's."""
    from types import SimpleNamespace

    from shapescript.parallel import interrupts
    clock = [100.0]
    monkeypatch.setattr(interrupts, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    seen = interrupts.NotedInterrupts()
    seen(signal.SIGINT, None)
    clock[0] += interrupts.DOUBLE_CLICK_S / 2
    seen(signal.SIGINT, None)  # ignored
    assert seen.first == 100.0
    clock[0] += interrupts.DOUBLE_CLICK_S
    with pytest.raises(KeyboardInterrupt):
        seen(signal.SIGINT, None)
    deadline = time.monotonic() + 10
    said = ""
    while said != interrupts.FIRST_SAID + interrupts.DOUBLE_SAID and time.monotonic() < deadline:
        time.sleep(0.01)
        said += capsys.readouterr().err
    assert said == interrupts.FIRST_SAID + interrupts.DOUBLE_SAID
    later = interrupts.NotedInterrupts()  # long after: a first press again
    clock[0] += interrupts.SECOND_INTERRUPT_S + 1
    later(signal.SIGINT, None)
    assert later.first == clock[0]
