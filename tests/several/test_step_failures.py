"""A step that fails leaves the models as one device leaves them, and the workers up: a bad item
in a batch of the controller's loop, whose steps are sent ahead (the loader's
error, none of the steps after it run); a sink that raises as it writes a step's record (the models
as that step left them, none after it); an error that only one worker meets inside a step (no
worker updates, the next call runs).

The reference for every device count, one device included, is independent of the failure: the same
loop over the good prefix of the data, which fails nowhere. The pools get a short collective
timeout, so that a regression (a controller waiting for workers that wait for each other) fails
within seconds rather than hanging for the default 600."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from programs import LIN_HEADER, LIN_LOSS, LIN_STEP
from sample_data import Rows, RowsBadAt, RowsBadLabelAt
from support import loaded_with_timeout

import shapescript as ss
from shapescript.runtime.sinks import Sink

DEVICES = ["cpu", "cpu[0 1]", "cpu[0 1 2]"]
BATCH = 8
TIMEOUT_S = 5.0  # the pools' collective timeout: what a regression waits, rather than 600 s

# The README's loop, in small: every step sent ahead on several devices (its result only logged).
FIT = LIN_HEADER + LIN_LOSS + LIN_STEP + textwrap.dedent(f"""\

    fn fit(mut m: Lin, mut opt: AdamW[Lin], data: Dataset[Ex], log: Sink):
        for batch in data |> batches({BATCH}):
            l = step(mut m, mut opt, batch)
            write(log, logs(loss=l))
    """)


@pytest.fixture(scope="module", params=DEVICES)
def program(request: pytest.FixtureRequest) -> Iterator[Any]:
    with loaded_with_timeout(FIT, request.param, "fit.ss", TIMEOUT_S) as prog:
        yield prog


@dataclass
class Outcome:
    error: tuple[type, str] | None
    losses: list[float]
    w: torch.Tensor
    opt: dict[str, torch.Tensor]


def fit(prog: Any, data: Any, sink: Sink | None = None) -> tuple[Outcome, Any, Any]:
    """`fit` from a fresh model over `data`: what it raised, the records the sink kept, the model and
    the optimizer state after it; and the model and optimizer, to go on with."""
    m = prog.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.1)
    sink = sink if sink is not None else ss.sinks.memory()
    error = None
    try:
        prog.fit(m, opt, data, sink)
    except Exception as e:
        error = (type(e), str(e))
    records = getattr(sink, "records", [])
    return Outcome(error, [r["loss"] for r in records], m.state_dict()["w"], opt.state_dict()), m, opt


def assert_same(got: Outcome, want: Outcome) -> None:
    """The same records, params and optimizer state, up to the order of the additions."""
    assert got.losses == pytest.approx(want.losses, abs=1e-5)
    torch.testing.assert_close(got.w, want.w, atol=1e-5, rtol=0)
    assert got.opt.keys() == want.opt.keys()
    for key in want.opt:
        torch.testing.assert_close(got.opt[key], want.opt[key], atol=1e-5, rtol=0, msg=key)


def goes_on(prog: Any, m: Any, opt: Any) -> list[float]:
    """The workers are up and the models usable: a further pass over good data, its losses."""
    sink = ss.sinks.memory()
    prog.fit(m, opt, Rows(2 * BATCH), sink)
    return [r["loss"] for r in sink.records]


# -- a bad item in a loop whose steps are sent ahead -----------------------------------------------

N = 5 * BATCH  # five batches: a bad item in the first, a middle one and the last


@pytest.mark.parametrize(("data", "bad"), [
    (RowsBadAt, 0),  # the first batch, the first worker's part
    (RowsBadAt, BATCH - 1),  # the first batch, the last worker's part
    (RowsBadLabelAt, 2 * BATCH + 3),  # a batch in the middle
    (RowsBadAt, N - BATCH),  # the last batch
    (RowsBadLabelAt, N - 1),
])
def test_a_bad_item_raises_the_loaders_error_and_keeps_the_models(program: Any, data: type, bad: int) -> None:
    got, m, opt = fit(program, data(N, bad))
    want, m1, opt1 = fit(program, Rows(bad // BATCH * BATCH))  # the batches before the bad one
    kind = ss.ShapeError if data is RowsBadAt else ss.DomainError
    assert got.error is not None and got.error[0] is kind and f"item {bad} " in got.error[1], got.error
    assert want.error is None
    assert_same(got, want)
    assert goes_on(program, m, opt) == pytest.approx(goes_on(program, m1, opt1), abs=1e-5)


# -- a sink that raises ----------------------------------------------------------------------------

class FailingSink(Sink):
    """Keeps the records it was given, and raises as it is given record number `at` (from 1)."""

    def __init__(self, at: int, passive: bool) -> None:
        super().__init__()
        self.at, self.passive = at, passive
        self.records: list[dict[str, Any]] = []

    def _emit(self, step: int, values: dict[str, Any]) -> None:
        if step == self.at:
            raise OSError(28, "No space left on device")
        self.records.append(values)


@pytest.mark.parametrize(("at", "passive"), [(1, True), (3, True), (5, True), (3, False)])
def test_a_sink_that_raises_leaves_the_models_as_the_step_it_records(program: Any, at: int, passive: bool) -> None:
    got, m, opt = fit(program, Rows(N), FailingSink(at, passive))
    want, m1, opt1 = fit(program, Rows(at * BATCH))  # the steps up to the one whose record failed
    assert got.error == (OSError, "[Errno 28] No space left on device")
    want.losses = want.losses[:at - 1]  # every record before the one that failed
    assert_same(got, want)
    assert goes_on(program, m, opt) == pytest.approx(goes_on(program, m1, opt1), abs=1e-5)


def test_a_jsonl_sink_on_a_full_disk(program: Any) -> None:
    """/dev/full: every write fails with ENOSPC, so the first record's flush raises."""
    sink = ss.sinks.jsonl("/dev/full")
    try:
        got, m, opt = fit(program, Rows(N), sink)
    finally:
        try:
            sink.close()
        except OSError:
            pass
    want, m1, opt1 = fit(program, Rows(BATCH))
    assert got.error is not None and got.error[0] is OSError and "No space left" in got.error[1]
    want.losses = []
    assert_same(got, want)
    assert goes_on(program, m, opt) == pytest.approx(goes_on(program, m1, opt1), abs=1e-5)
