"""Sinks on real libraries on `cpu[0 1]`: the program's own loop over a dataset writes
`write(log, logs(loss=l))`, its steps sent ahead (parallel/pipeline.py), and a TensorBoard event
file (read back with tensorboard's EventAccumulator), a CSV file and a function of the user's get
every step, equal to what `cpu` gives within 1e-6. Histograms of the params read the models as the
step of their record left them; a function that raises ends the loop with the models as on one
device (tests/runtime/test_interop_sinks.py does the one-device side)."""

from __future__ import annotations

import csv
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from programs import SINK_BATCH, SINK_MLP, SINK_STEPS, sink_digits
from support import loaded_with_timeout

import shapescript as ss
from shapescript.runtime.sinks import Value

pytestmark = pytest.mark.slow
needs_tensorboard = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                                       reason="the tensorboard package is not installed")

BATCH, STEPS = SINK_BATCH, SINK_STEPS
TIMEOUT_S = 10.0  # the pools' collective timeout: what a regression waits, rather than 600

MLP = SINK_MLP


digits = sink_digits


@pytest.fixture(scope="module")
def one() -> Iterator[Any]:
    with loaded_with_timeout(MLP, "cpu", "mlp.ss", TIMEOUT_S) as prog:
        yield prog


@pytest.fixture(scope="module")
def two() -> Iterator[Any]:
    with loaded_with_timeout(MLP, "cpu[0 1]", "mlp.ss", TIMEOUT_S) as prog:
        yield prog


def fit(prog: Any, sink: Any, steps: int = STEPS) -> Any:
    m = prog.Mlp.init(seed=0)
    prog.fit(m, ss.adamw(m, lr=1e-2), digits(steps), sink)
    return m


@pytest.fixture(scope="module")
def on_cpu(one: Any) -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    """What one device gives: each step's loss, and the params after each number of steps (0 to 4)."""
    sink = ss.sinks.memory()
    fit(one, sink)
    states = [fit(one, ss.sinks.memory(), steps).state_dict() for steps in range(1, STEPS + 1)]
    return [r["loss"] for r in sink.records], [one.Mlp.init(seed=0).state_dict(), *states]


def read_events(log_dir: Path) -> Any:
    from tensorboard.backend.event_processing import event_accumulator
    events = event_accumulator.EventAccumulator(
        str(log_dir), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0})
    events.Reload()
    return events


@needs_tensorboard
def test_tensorboard_holds_every_step(two: Any, on_cpu: Any, tmp_path: Path) -> None:
    losses, _ = on_cpu
    with ss.sinks.tensorboard(tmp_path) as sink:
        fit(two, sink)
    scalars = read_events(tmp_path).Scalars("loss")
    assert [s.step for s in scalars] == list(range(1, STEPS + 1))
    assert [s.value for s in scalars] == pytest.approx(losses, abs=1e-6)


@needs_tensorboard
def test_tensorboard_histograms_read_the_models_as_their_step_left_them(two: Any, on_cpu: Any,
                                                                      tmp_path: Path) -> None:
    _, states = on_cpu
    m = two.Mlp.init(seed=0)
    with ss.sinks.tensorboard(tmp_path, model=m, histograms_every=1) as sink:
        two.fit(m, ss.adamw(m, lr=1e-2), digits(), sink)
    events = read_events(tmp_path)
    for name in ("w1", "w2"):
        hist = events.Histograms(f"params/{name}")
        assert [h.step for h in hist] == list(range(1, STEPS + 1))
        for h in hist:  # step k's histogram: the params after k steps, not after the step sent ahead
            want = states[h.step][name]
            assert h.histogram_value.num == want.numel()
            assert h.histogram_value.sum == pytest.approx(float(want.double().sum()), abs=1e-5)
            assert h.histogram_value.max == pytest.approx(float(want.max()), abs=1e-6)


def test_csv_holds_every_step(two: Any, on_cpu: Any, tmp_path: Path) -> None:
    losses, _ = on_cpu
    path = tmp_path / "log.csv"
    with ss.sinks.csv(path) as sink:
        fit(two, sink)
    rows = list(csv.DictReader(path.open(newline="")))
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    assert [float(r["loss"]) for r in rows] == pytest.approx(losses, abs=1e-6)


@pytest.mark.parametrize("passive", [True, False])
def test_call_gets_every_step(two: Any, on_cpu: Any, passive: bool) -> None:
    losses, _ = on_cpu
    calls: list[tuple[int, dict[str, Value]]] = []
    ahead: list[int] = []  # steps sent whose answers weren't read, at each call

    def log(step: int, record: dict[str, Value]) -> None:
        calls.append((step, record))
        ahead.append(len(two.pool._in_flight))

    fit(two, ss.sinks.call(log, passive=passive))
    assert [step for step, _ in calls] == list(range(1, STEPS + 1))
    assert [float(r["loss"]) for _, r in calls] == pytest.approx(losses, abs=1e-6)  # type: ignore[arg-type]
    # Passive: each record written while the next step runs; else before the next step is sent.
    assert ahead == ([1] * (STEPS - 1) + [0] if passive else [0] * STEPS)


@pytest.mark.parametrize(("at", "passive"), [(1, True), (3, True), (STEPS, True), (3, False)])
def test_a_raising_call_leaves_the_models_as_on_one_device(two: Any, on_cpu: Any, at: int, passive: bool) -> None:
    losses, states = on_cpu
    got: list[float] = []

    def log(step: int, record: dict[str, Value]) -> None:
        if step == at:
            raise ConnectionError("the logging service is down")
        got.append(float(record["loss"]))  # type: ignore[arg-type]

    m = two.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-2)
    with pytest.raises(ConnectionError, match="the logging service is down") as info:
        two.fit(m, opt, digits(), ss.sinks.call(log, passive=passive))
    assert any(f"at step {at}" in note for note in info.value.__notes__)
    assert got == pytest.approx(losses[:at - 1], abs=1e-6)
    for name, value in m.state_dict().items():  # as the step whose record failed left them
        torch.testing.assert_close(value, states[at][name], atol=1e-6, rtol=0)
    # The workers go on: a further step from there.
    sink = ss.sinks.memory()
    two.fit(m, opt, digits(1), sink)
    assert len(sink.records) == 1
