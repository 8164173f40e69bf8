"""Records held while their values come from a GPU (runtime/sinks.py): a passive sink's record is
written when the program next changes a model, runs a recorded step, writes a record that isn't held,
or returns, not when `write` runs. On the CPU nothing is held; these tests hold CPU values too
(HELD_DEVICES), which runs the same bookkeeping, their copies never ready before they must be (as a
GPU still busy with the step), and compare each run with one that holds nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from programs import LIN_HEADER, LIN_LOSS, LIN_STEP

import shapescript as ss
from shapescript.errors import ShapeScriptError
from shapescript.runtime import sinks

FIT = LIN_HEADER + LIN_LOSS + LIN_STEP + """
fn fit(mut m: Lin, mut opt: AdamW[Lin], data: Dataset[Ex], log: Sink, other: Sink):
    for batch in data |> shuffle(seed=3) |> batches(4):
        l = step(mut m, mut opt, batch)
        write(log, logs(loss=l))
        write(other, logs(twice=2 * l))
"""


def dataset(n: int = 20, bad_at: int | None = None) -> Any:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (n,), generator=g)
    if bad_at is not None:
        y[bad_at] = 7  # out of Index[C]: its batch's loader error
    return ss.TensorDataset(x=torch.randn(n, 4, generator=g), y=y)


def fit(held: bool, data: Any, log: Any, other: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, BaseException | None]:
    """The program's loop from the same init, holding CPU values (`held`) or not; its model and the
    error it raised, if any."""
    with monkeypatch.context() as patch:
        patch.setattr(sinks, "HELD_DEVICES", frozenset({"cuda", "cpu"} if held else {"cuda"}))
        patch.setattr(sinks._Held, "ready", lambda self: False)  # as a GPU still busy with the step
        prog = ss.load(FIT, devices="cpu", name="fit.ss")
        m = prog.Lin.init(seed=0)
        opt = ss.adamw(m, lr=0.1)
        try:
            prog.fit(m, opt, data, log, other)
        except Exception as e:
            return m, e
    return m, None


def after_steps(k: int) -> torch.Tensor:
    """The model after the loop's first k steps, taken by calling `step` from Python on its batches
    (the order `shuffle(seed=3)` documents: torch.randperm from a generator seeded with 3)."""
    prog = ss.load(FIT, devices="cpu", name="fit.ss")
    m = prog.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.1)
    data, order = dataset(), torch.randperm(20, generator=torch.Generator().manual_seed(3))
    for i in range(k):
        idx = order[4 * i:4 * i + 4]
        prog.step(m, opt, {name: t[idx] for name, t in data.fields.items()})
    return m.w.detach()


def in_order(events: list[tuple[str, int, dict]]) -> Callable[[str, bool], Any]:
    """A sink that appends (its name, step, record) to `events`, passive or not."""
    def make(name: str, passive: bool) -> Any:
        return ss.sinks.call(lambda step, values: events.append((name, step, values)), passive=passive)
    return make


@pytest.mark.parametrize("other_passive", [True, False])
def test_held_records_come_whole_in_order_by_the_calls_end(monkeypatch: pytest.MonkeyPatch, other_passive: bool) -> None:
    runs = []
    for held in (False, True):
        events: list[tuple[str, int, dict]] = []
        make = in_order(events)
        m, error = fit(held, dataset(), make("log", True), make("other", other_passive), monkeypatch)
        assert error is None
        runs.append((events, m.w.detach().clone()))
    (plain, w_plain), (held_events, w_held) = runs
    assert len(plain) == 10  # 5 steps, two records each
    assert held_events == plain  # the same records, numbered alike, in the order the program wrote them
    assert torch.equal(w_held, w_plain)
    assert sinks._held.records == []  # nothing left held after the call


def test_a_held_sink_that_fails_leaves_the_models_as_its_records_step_did(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record of step 3 raises: the loop ends there, the model as step 3 left it, whether the
    record was written at once or held until step 4 was about to update."""
    runs = []
    for held in (False, True):
        written: list[int] = []

        def emit(step: int, values: dict) -> None:
            if step == 3:
                raise OSError("no space left on device")
            written.append(step)
        other = ss.sinks.memory()
        m, error = fit(held, dataset(), ss.sinks.call(emit, passive=True), other, monkeypatch)
        assert isinstance(error, OSError) and "no space left" in str(error)
        runs.append((written, len(other.records), m.w.detach().clone()))
    (written_plain, others_plain, w_plain), (written_held, others_held, w_held) = runs
    assert written_plain == written_held == [1, 2]
    assert others_plain == others_held == 2  # step 3's second record never came
    assert torch.equal(w_held, w_plain)
    assert torch.equal(w_plain, after_steps(3))
    assert sinks._held.records == []


def test_a_record_held_when_the_next_batch_is_bad_is_written_before_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = []
    for held in (False, True):
        log = ss.sinks.memory()
        m, error = fit(held, dataset(bad_at=None), log, ss.sinks.memory(), monkeypatch)
        assert error is None
        order = torch.randperm(20, generator=torch.Generator().manual_seed(3))
        bad = int(order[9])  # the third batch's second item
        log = ss.sinks.memory()
        m, error = fit(held, dataset(bad_at=bad), log, ss.sinks.memory(), monkeypatch)
        assert isinstance(error, ShapeScriptError) and "7" in str(error)
        runs.append((log.records, m.w.detach().clone()))
    (records_plain, w_plain), (records_held, w_held) = runs
    assert len(records_plain) == 2 and records_held == records_plain
    assert torch.equal(w_held, w_plain) and torch.equal(w_plain, after_steps(2))


def test_no_more_than_two_records_are_held_between_two_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop that only writes (no update to send them) keeps at most HOLD_AT_MOST held."""
    source = LIN_HEADER + LIN_LOSS + """
fn watch(m: Lin, data: Dataset[Ex], log: Sink):
    for batch in data |> batches(2):
        write(log, logs(loss=loss(m, batch)))
"""
    seen: list[int] = []
    monkeypatch.setattr(sinks, "HELD_DEVICES", frozenset({"cuda", "cpu"}))
    monkeypatch.setattr(sinks._Held, "ready", lambda self: False)
    prog = ss.load(source, devices="cpu", name="watch.ss")
    log = ss.sinks.call(lambda step, values: seen.append(len(sinks._held.records)), passive=True)
    prog.watch(prog.Lin.init(seed=0), dataset(12), log)
    assert len(seen) == 6
    assert max(seen) <= sinks.HOLD_AT_MOST - 1  # while one is written, the others held beside it


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_loop_records_are_held_and_equal_to_those_read_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """On cuda[0] the loss records are held (their copies to the host started, written at the next
    update) and are the same as when each is read at once."""
    results = []
    for held_devices in (frozenset(), frozenset({"cuda"})):
        monkeypatch.setattr(sinks, "HELD_DEVICES", held_devices)
        prog = ss.load(FIT, devices="cuda[0]", name="fit.ss")
        m = prog.Lin.init(seed=0)
        data = dataset()
        data = ss.TensorDataset(**{k: v.cuda() for k, v in data.fields.items()})
        log, other = ss.sinks.memory(), ss.sinks.memory()
        prog.fit(m, ss.adamw(m, lr=0.1), data, log, other)
        losses = [r["loss"] for r in log.records]
        results.append((losses, [r["twice"] for r in other.records], m.w.detach().cpu()))
    assert results[1][0] == pytest.approx(results[0][0], abs=1e-6) and len(results[1][0]) == 5
    assert results[1][1] == pytest.approx(results[0][1], abs=1e-6)
    torch.testing.assert_close(results[1][2], results[0][2])
