"""Training in the background: `fit(..., background=True)` returns at once; while
it trains, reads of the model and other calls see the state between two steps; `stop()` ends it at
a step boundary with the models as that step left them. On one device and on two, against the same
loop run in the foreground (which records the model after every step: the reference)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from programs import LINEAR

import shapescript as ss
from shapescript.background import BackgroundRun
from shapescript.runtime import steps
from shapescript.runtime.sinks import Sink, Value

DEVICES = ["cpu", "cpu[0 1]"]
STEPS = 40  # batches of 8 in one pass


class Snapshots(Sink):
    """Keeps the model's state after each step (the sink is written at the end of every step)."""

    def __init__(self, model: object) -> None:
        super().__init__()
        self.model = model
        self.states: list[dict[str, torch.Tensor]] = []

    def _emit(self, step: int, values: dict[str, Value]) -> None:
        self.states.append(self.model.state_dict())  # type: ignore[attr-defined]


class Slow(Sink):
    """A sink that takes a while, so that a run is still going when the test looks; `reached` is set
    once `at` steps have ended."""

    def __init__(self, at: int, seconds: float = 0.01) -> None:
        super().__init__()
        self.at, self.seconds, self.reached = at, seconds, threading.Event()
        self.inside = False  # in the middle of a step (the sink is written inside the loop's body)

    def _emit(self, step: int, values: dict[str, Value]) -> None:
        self.inside = True
        time.sleep(self.seconds)
        if step >= self.at:
            self.reached.set()
        self.inside = False


def data() -> ss.TensorDataset:
    g = torch.Generator().manual_seed(5)
    return ss.TensorDataset(x=torch.randn(8 * STEPS, 4, generator=g), y=torch.randint(0, 3, (8 * STEPS,), generator=g))


def reference(prog: ss.Program) -> list[dict[str, torch.Tensor]]:
    """The state after 0, 1, ..., STEPS steps of the loop, run in the foreground."""
    m = prog.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.05)
    log = Snapshots(m)
    prog.fit(m, opt, data(), log)
    return [prog.Lin.init(seed=0).state_dict()] + log.states


def step_of(state: dict[str, torch.Tensor], states: list[dict[str, torch.Tensor]]) -> int:
    """Which reference step `state` is, exactly; -1 if none (a state half-way through a step)."""
    for k, ref in enumerate(states):
        if all(torch.equal(state[name], ref[name]) for name in ref):
            return k
    return -1


def started(prog: ss.Program, at: int) -> tuple[object, object, Slow, BackgroundRun]:
    """A model, its optimizer, a Slow sink and a background run of `fit`, once `at` steps have ended."""
    m = prog.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.05)
    log = Slow(at=at)
    run = prog.fit(m, opt, data(), log, background=True)
    assert log.reached.wait(30)
    return m, opt, log, run


@pytest.fixture(params=DEVICES)
def prog(request: pytest.FixtureRequest):
    program = ss.load(LINEAR, devices=request.param, name="fit.ss")
    yield program
    program.stop()


@pytest.mark.slow
def test_a_background_run_ends_where_the_foreground_one_does(prog: ss.Program) -> None:
    states = reference(prog)
    m = prog.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.05)
    log = ss.sinks.memory()
    run = prog.fit(m, opt, data(), log, background=True)
    assert isinstance(run, BackgroundRun)
    assert run.wait(timeout=60) is None and run.state == "finished" and run.done
    assert run.steps == STEPS == len(log.records)
    assert step_of(m.state_dict(), states) == STEPS
    assert run.progress()["batches"] == STEPS and "finished" in repr(run)


@pytest.mark.slow
def test_reads_and_calls_while_it_trains_see_a_state_between_steps(prog: ss.Program, tmp_path: Path) -> None:
    states = reference(prog)
    m, opt, log, run = started(prog, at=3)
    seen = []
    x = torch.randn(5, 4)
    while not run.done and len(seen) < 10:
        with steps.between_steps():  # what every read and call takes: the run can't be in a step
            assert not log.inside
            seen.append(step_of(m.state_dict(), states))
        w = m.w  # a single read, between steps too
        assert step_of({"w": w}, [{"w": s["w"]} for s in states]) >= 0
        scores = prog.scores(m, x)  # another call, between two of the run's steps
        assert scores.shape == (5, 3)
    ss.save(tmp_path / "mid.safetensors", m, opt)  # params and optimizer state of one and the same step
    assert run.wait(timeout=60) is None
    saved = prog.Lin.init(seed=1)
    saved_opt = ss.adamw(saved, lr=0.05)
    ss.restore(tmp_path / "mid.safetensors", saved, saved_opt)
    k = step_of(saved.state_dict(), states)
    assert k >= 3 and float(saved_opt.state_dict()["w.step"]) == k
    assert len(seen) >= 3 and -1 not in seen, seen  # never a state half-way through a step
    assert seen == sorted(seen) and seen[-1] < STEPS, seen  # read while it went on
    assert step_of(m.state_dict(), states) == STEPS


@pytest.mark.slow
def test_stop_ends_the_run_at_a_step_boundary_and_the_model_trains_on(prog: ss.Program) -> None:
    states = reference(prog)
    m, opt, log, run = started(prog, at=5)
    run.stop(timeout=30)
    assert run.state == "stopped" and run.wait() is None
    k = run.steps
    assert 5 <= k < STEPS and log.step == k  # each step it began, it ended
    assert step_of(m.state_dict(), states) == k
    assert "stopped at a step boundary" in repr(run)
    prog.fit(m, opt, data(), ss.sinks.memory())  # the model and optimizer go on, in the foreground
    assert step_of(m.state_dict(), states) == -1  # a further pass from where it stopped: no longer a prefix


@pytest.mark.slow
def test_an_error_in_the_background_is_raised_by_wait(prog: ss.Program) -> None:
    m = prog.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.05)
    log = ss.sinks.memory()
    log.close()  # writing to it is an error
    run = prog.fit(m, opt, data(), log, background=True)
    with pytest.raises(ValueError, match="closed"):
        run.wait(timeout=60)
    assert run.state == "failed" and isinstance(run.error, ValueError)


def test_bad_arguments_are_refused_before_anything_starts() -> None:
    prog = ss.load(LINEAR, devices="cpu", name="fit.ss")
    m = prog.Lin.init(seed=0)
    with pytest.raises(TypeError, match="background is True or False"):
        prog.fit(m, ss.adamw(m, lr=0.1), data(), ss.sinks.memory(), background="yes")
    with pytest.raises(TypeError, match="missing"):
        prog.fit(m, background=True)  # checked in the caller's thread, at once


def test_program_stop_stops_its_background_runs_first() -> None:
    prog = ss.load(LINEAR, devices="cpu[0 1]", name="fit.ss")
    try:
        run = started(prog, at=2)[3]
    finally:
        prog.stop()
    assert run.state == "stopped" and 2 <= run.steps < STEPS
