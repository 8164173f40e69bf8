"""An error that only one worker meets inside a step: an extern fn that refuses one
example raises on the worker holding it. No worker updates the models: the error is one device's,
in its class, the models and the optimizer state are as before the step, the workers stay up, and
the next call runs. The reference for every device count is the same calls without the bad one.

The pools get a short collective timeout, so that a regression fails within seconds."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from programs import LIN_HEADER, LIN_STEP
from support import importable, loaded_with_timeout

import shapescript as ss

DEVICES = ["cpu", "cpu[0 1]", "cpu[0 1 2]"]
TIMEOUT_S = 5.0
BATCH = 6
BAD = 99.0  # an x the extern fn refuses

PROGRAM = LIN_HEADER + textwrap.dedent("""\

    extern fn guard(x: [b D]) -> [b D] = "ss_guard_extern.guard"

    fn loss(m: Lin, batch: [b] Ex) -> [] = cross_entropy(guard(batch.x) @ m.w, batch.y, over=C)

    fn plain_loss(m: Lin, batch: [b] Ex) -> [] = cross_entropy(batch.x @ m.w, batch.y, over=C)

    """) + LIN_STEP + textwrap.dedent(f"""\

    fn late_step(mut m: Lin, mut opt: AdamW[Lin], batch: [b] Ex) -> [b D]:
        l, g = value_and_grad(plain_loss, m, batch)
        checked = guard(batch.x)
        update(mut m, mut opt, g)
        return checked

    fn fit(mut m: Lin, mut opt: AdamW[Lin], data: Dataset[Ex], log: Sink):
        for batch in data |> batches({BATCH}):
            l = step(mut m, mut opt, batch)
            write(log, logs(loss=l))
    """)

GUARD = f"""
    import shapescript as ss

    def guard(x):
        if (x.abs() > {BAD / 2}).any():
            raise ss.DomainError(f"guard: a value of {{x.abs().max().item():g}} is too big")
        return x
"""


@pytest.fixture(scope="module")
def guard_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with importable(tmp_path_factory.mktemp("guard"), "ss_guard_extern", GUARD) as folder:
        yield folder


@pytest.fixture(scope="module", params=DEVICES)
def program(request: pytest.FixtureRequest, guard_module: Path) -> Iterator[Any]:
    with loaded_with_timeout(PROGRAM, request.param, "guard.ss", TIMEOUT_S) as prog:
        yield prog


def examples(n: int, bad: int | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    if bad is not None:
        x[bad, 2] = BAD
    return {"x": x, "y": torch.randint(0, 3, (n,), generator=g)}


def state(m: Any, opt: Any) -> dict[str, torch.Tensor]:
    return {"w": m.state_dict()["w"], **{f"opt.{k}": v for k, v in opt.state_dict().items()}}


def assert_state(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-5, rtol=0, msg=key)


def error_of(call: Any, *args: Any) -> tuple[type, str]:
    with pytest.raises(ss.ShapeScriptError) as info:
        call(*args)
    return type(info.value), str(info.value)


# the bad example in the first worker's part, and in the last worker's (one device: both its own)
@pytest.mark.parametrize("bad", [0, BATCH - 1])
@pytest.mark.parametrize("fn", ["step", "late_step"])
def test_an_error_on_one_worker_changes_nothing_and_the_next_call_runs(program: Any, fn: str, bad: int) -> None:
    m = program.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.1)
    getattr(program, fn)(m, opt, examples(BATCH, seed=1))
    before = state(m, opt)
    error = error_of(getattr(program, fn), m, opt, examples(BATCH, bad, seed=2))
    assert error == (ss.DomainError, f"guard: a value of {BAD:g} is too big"), error
    assert_state(state(m, opt), before)  # late_step: no worker updated after the gradients' sum
    after = getattr(program, fn)(m, opt, examples(BATCH, seed=3))  # the workers are up

    m1 = program.Lin.init(seed=0)  # the reference: the same calls without the bad one
    opt1 = ss.adamw(m1, lr=0.1)
    getattr(program, fn)(m1, opt1, examples(BATCH, seed=1))
    torch.testing.assert_close(getattr(program, fn)(m1, opt1, examples(BATCH, seed=3)), after, atol=1e-5, rtol=0)
    assert_state(state(m, opt), state(m1, opt1))


@pytest.mark.parametrize("bad", [BATCH + 1, 2 * BATCH + BATCH - 1])
def test_a_loop_whose_steps_are_sent_ahead_stops_at_the_step_one_worker_refuses(program: Any, bad: int) -> None:
    data = examples(4 * BATCH, bad, seed=4)
    m = program.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.1)
    sink = ss.sinks.memory()
    error = error_of(program.fit, m, opt, ss.TensorDataset(**data), sink)
    assert error == (ss.DomainError, f"guard: a value of {BAD:g} is too big"), error

    good = bad // BATCH * BATCH  # the reference: the loop over the batches before the bad one
    m1 = program.Lin.init(seed=0)
    opt1 = ss.adamw(m1, lr=0.1)
    sink1 = ss.sinks.memory()
    program.fit(m1, opt1, ss.TensorDataset(**{k: v[:good] for k, v in data.items()}), sink1)
    assert [r["loss"] for r in sink.records] == pytest.approx([r["loss"] for r in sink1.records], abs=1e-5)
    assert_state(state(m, opt), state(m1, opt1))
    program.step(m, opt, examples(BATCH, seed=5))  # the workers are up
    program.step(m1, opt1, examples(BATCH, seed=5))
    assert_state(state(m, opt), state(m1, opt1))
