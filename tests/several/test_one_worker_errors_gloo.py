"""An error that only one worker meets inside a step, where the step's collectives go through Gloo:
with SHAPESCRIPT_SHM_REDUCE=off, under `shard params` (all-gathers of the
params, reduce-scatters of their gradients) and under `split H` (all-gathers of values split along
H). The worker that failed joins the collectives its peers still start, with zeros, and every worker
skips the update (runtime/ledger.py): the error is one device's, in its class, the models and the
optimizer state are as before the step on every device count, the workers stay up and the next
call runs; a loop whose steps are sent ahead stops at that step. The reference is one device's
calls without the bad one.

The pools get a short collective timeout, so that a regression (the peers left waiting in Gloo, the
pool stopping them) fails within seconds."""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from programs import HEADS_NET
from support import importable, loaded_with_timeout

import shapescript as ss
from shapescript.runtime import shm_reduce

DEVICES = ["cpu", "cpu[0 1]", "cpu[0 1 2]"]
TIMEOUT_S = 5.0
BATCH = 6
BAD = 99.0  # an x the extern fn refuses
MODULE = "ss_guard_gloo_extern"

D = 6
EX = textwrap.dedent(f"""\
    dim D = {D}
    dim H = 6
    dim C = 3

    data Ex:
        x: [D]
        y: [] Index[C]
    """)

# A linear classifier (its gradient's all-reduce, or with shard params its all-gathers and
# reduce-scatters), and a net with an H axis whose softmax along H gathers it whole under split H
# (and its gradient is reduce-scattered), then sums the devices' parts of its last matmul.
LIN = textwrap.dedent("""\
    model Net:
        param w: [D C] = normal(std=0.1)

    fn scores(m: Net, x: [b D]) -> [b C] = x @ m.w
    """)

STEPS = textwrap.dedent("""\
    extern fn guard(x: [b D]) -> [b D] = "{module}.{guard}"

    fn loss(m: Net, batch: [b] Ex) -> [] = cross_entropy(scores(m, guard(batch.x)), batch.y, over=C)

    fn plain_loss(m: Net, batch: [b] Ex) -> [] = cross_entropy(scores(m, batch.x), batch.y, over=C)

    fn step(mut m: Net, mut opt: AdamW[Net], batch: [b] Ex) -> []:
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, g)
        return l

    fn late_step(mut m: Net, mut opt: AdamW[Net], batch: [b] Ex) -> [b D]:
        l, g = value_and_grad(plain_loss, m, batch)
        checked = guard(batch.x)
        update(mut m, mut opt, g)
        return checked

    fn fit(mut m: Net, mut opt: AdamW[Net], data: Dataset[Ex], log: Sink):
        for batch in data |> batches({batch}):
            write(log, logs(loss=step(mut m, mut opt, batch)))
    """)

# layout: (its devices line's options, its model, its guard, the workers' environment)
LAYOUTS: dict[str, tuple[str, str, str, dict[str, str]]] = {
    "gloo": ("", LIN, "guard", {shm_reduce.ENV: "off"}),  # every all-reduce through Gloo
    "shard params": ("    shard params\n", LIN, "guard", {}),  # Gloo's all-gathers beside shared memory's sums
    "split H": ("    split H\n", HEADS_NET, "guard_heads", {}),
}

# Split along the batch, a worker meets a bad value in its own rows alone. Split along H, every device
# holds the whole batch, and an extern fn gets its arguments whole: `guard_heads` stands for an error
# that one device meets alone (its memory, its files), refusing on the device that holds the heads of
# the number of the bad value's column.
GUARD = f"""
    import shapescript as ss
    import torch.distributed as dist

    def refuse(x):
        raise ss.DomainError(f"guard: a value of {{x.abs().max().item():g}} is too big")

    def guard(x):
        if (x.abs() > {BAD / 2}).any():
            refuse(x)
        return x

    def guard_heads(x):
        bad = (x.abs() > {BAD / 2}).nonzero()
        if len(bad):
            world = dist.get_world_size() if dist.is_initialized() else 1
            if world == 1 or dist.get_rank() == int(bad[0, 1]) * world // x.shape[1]:
                refuse(x)
        return x
"""


def source(layout: str) -> str:
    options, model, guard, _ = LAYOUTS[layout]
    return "devices cpu\n" + options + "\n" + EX + "\n" + model + "\n" + STEPS.format(module=MODULE, guard=guard,
                                                                                      batch=BATCH)


@pytest.fixture(scope="module")
def guard_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with importable(tmp_path_factory.mktemp("guard_gloo"), MODULE, GUARD) as folder:
        yield folder


@pytest.fixture(scope="module", params=[(layout, devices) for layout in LAYOUTS for devices in DEVICES],
                ids=lambda p: f"{p[0]}-{p[1]}")
def program(request: pytest.FixtureRequest, guard_module: Path) -> Iterator[tuple[str, Any]]:
    layout, devices = request.param
    with pytest.MonkeyPatch.context() as env:  # read by the workers as they start
        for name, value in LAYOUTS[layout][3].items():
            env.setenv(name, value)
        # pytest's name for the test running would make the fork server's key (its environment)
        # another for every pool, and each pool wait for a fresh server's import of torch
        env.delenv("PYTEST_CURRENT_TEST", raising=False)
        with loaded_with_timeout(source(layout), devices, "guard.ss", TIMEOUT_S) as prog:
            if devices != "cpu":
                prog.workers().start()  # now, with that environment
            yield layout, prog


def examples(n: int, bad: int | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """`n` examples; with `bad`, a value the extern fn refuses in row `bad`: in its first column if
    that is the first row, else in its last (the first device's, or the last's, by rows or by
    `guard_heads`' rule)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g)
    if bad is not None:
        x[bad, 0 if bad == 0 else D - 1] = BAD
    return {"x": x, "y": torch.randint(0, 3, (n,), generator=g)}


def state(m: Any, opt: Any) -> dict[str, torch.Tensor]:
    return {**m.state_dict(), **{f"opt.{k}": v for k, v in opt.state_dict().items()}}


def assert_state(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-5, rtol=0, msg=key)


def assert_refused(call: Any, *args: Any) -> None:
    with pytest.raises(ss.ShapeScriptError) as info:
        call(*args)
    assert (type(info.value), str(info.value)) == (ss.DomainError, f"guard: a value of {BAD:g} is too big")


@functools.cache
def one_device(layout: str) -> tuple[list[float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One device's losses and states of the good calls alone: after the first two, after the last."""
    prog = ss.load(source(layout), devices="cpu", name="guard.ss")
    m = prog.Net.init(seed=0)
    opt = ss.adamw(m, lr=0.1)
    first = float(prog.step(m, opt, examples(BATCH, seed=1)))
    prog.late_step(m, opt, examples(BATCH, seed=5))
    after_first = state(m, opt)
    last = float(prog.step(m, opt, examples(BATCH, seed=3)))
    return [first, last], after_first, state(m, opt)


def test_an_error_on_one_worker_in_a_gloo_collective_step_changes_nothing(program: tuple[str, Any],
                                                                          guard_module: Path) -> None:
    layout, prog = program
    losses, after_first, after_last = one_device(layout)
    m = prog.Net.init(seed=0)
    opt = ss.adamw(m, lr=0.1)
    # The workers' ledgers of these calls' collectives: a call of a kind never seen can't be joined
    first = float(prog.step(m, opt, examples(BATCH, seed=1)))
    prog.late_step(m, opt, examples(BATCH, seed=5))
    assert_state(state(m, opt), after_first)
    for bad in (0, BATCH - 1):  # in the first worker's part, then in the last's
        assert_refused(prog.step, m, opt, examples(BATCH, bad, seed=2))
        assert_state(state(m, opt), after_first)
    assert_refused(prog.late_step, m, opt, examples(BATCH, BATCH - 1, seed=2))  # after the gradients' sums
    assert_state(state(m, opt), after_first)
    last = float(prog.step(m, opt, examples(BATCH, seed=3)))  # the workers are up
    assert [first, last] == pytest.approx(losses, abs=1e-5)
    assert_state(state(m, opt), after_last)


def test_a_loop_whose_steps_are_sent_ahead_stops_at_the_step_one_worker_refuses(program: tuple[str, Any]) -> None:
    layout, prog = program
    data = examples(3 * BATCH, BATCH + BATCH - 1, seed=4)  # in the second batch, the last worker's rows
    m = prog.Net.init(seed=0)
    opt = ss.adamw(m, lr=0.1)
    sink = ss.sinks.memory()
    assert_refused(prog.fit, m, opt, ss.TensorDataset(**data), sink)
    m1 = prog.Net.init(seed=0)  # the reference: the loop over the first batch alone, on these devices
    opt1 = ss.adamw(m1, lr=0.1)
    first = float(prog.step(m1, opt1, {k: v[:BATCH] for k, v in data.items()}))
    assert [r["loss"] for r in sink.records] == pytest.approx([first], abs=1e-5)
    assert_state(state(m, opt), state(m1, opt1))


def test_the_first_call_of_its_kind_that_one_worker_refuses_changes_nothing(program: tuple[str, Any]) -> None:
    """No worker has seen the collectives of a call of this batch size (a kind of its own): the call
    is careful (runtime/ledger.py), and the one that fails, the next good one of that kind (careful
    still: the failed one taught the ledger nothing) and a second bad one (now known) change nothing."""
    layout, prog = program
    size = BATCH + 3
    m = prog.Net.init(seed=0)
    opt = ss.adamw(m, lr=0.1)
    before = state(m, opt)
    assert_refused(prog.step, m, opt, examples(size, size - 1, seed=6))
    assert_state(state(m, opt), before)
    good = examples(size, seed=7)
    loss = float(prog.step(m, opt, good))
    assert_refused(prog.step, m, opt, examples(size, 0, seed=6))
    one = ss.load(source(layout), devices="cpu", name="guard.ss")  # the reference: the good call alone
    m1 = one.Net.init(seed=0)
    opt1 = ss.adamw(m1, lr=0.1)
    assert loss == pytest.approx(float(one.step(m1, opt1, good)), abs=1e-5)
    assert_state(state(m, opt), state(m1, opt1))


def test_a_loop_stops_at_its_smaller_last_batch_that_one_worker_refuses(program: tuple[str, Any]) -> None:
    """The last batch of an epoch, smaller than the others, is a kind no worker has seen."""
    layout, prog = program
    n = 2 * BATCH + 4
    data = examples(n, n - 1, seed=8)
    m = prog.Net.init(seed=0)
    opt = ss.adamw(m, lr=0.1)
    sink = ss.sinks.memory()
    assert_refused(prog.fit, m, opt, ss.TensorDataset(**data), sink)
    one = ss.load(source(layout), devices="cpu", name="guard.ss")
    m1 = one.Net.init(seed=0)
    opt1 = ss.adamw(m1, lr=0.1)
    first = [float(one.step(m1, opt1, {k: v[s:s + BATCH] for k, v in data.items()})) for s in (0, BATCH)]
    assert [r["loss"] for r in sink.records] == pytest.approx(first, abs=1e-5)
    assert_state(state(m, opt), state(m1, opt1))
