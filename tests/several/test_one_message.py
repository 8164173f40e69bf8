"""A call of a loop's step is one message for every worker, pickled once: its
batches are batchrefs that each worker resolves to its own share, and the worker works out where
that share lies in the whole batch itself, which random draws need. Results are compared with
devices="cpu", whose dropout masks are the whole batch's as the workers' are."""

from __future__ import annotations

import pickle
import textwrap
from typing import Any

import pytest
import torch
from programs import HEADS_HEADER, HEADS_NET, LIN_HEADER, LIN_LOSS

import shapescript as ss

# A loop whose step takes a Mode (dropout), and one whose step doesn't (sent ahead, pipelined).
PROGRAM = LIN_HEADER + "\n" + LIN_LOSS + textwrap.dedent("""\

    fn noisy_loss(m: Lin, batch: [b] Ex, mode: Mode) -> [] = cross_entropy(dropout(batch.x, 0.5, mode) @ m.w, batch.y, over=C)

    fn noisy_step(mut m: Lin, mut opt: AdamW[Lin], batch: [b] Ex, mode: Mode) -> []:
        l, g = value_and_grad(noisy_loss, m, batch, mode)
        update(mut m, mut opt, g)
        return l

    fn step(mut m: Lin, mut opt: AdamW[Lin], batch: [b] Ex) -> []:
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, g)
        return l

    fn fit(mut m: Lin, mut opt: AdamW[Lin], data: Dataset[Ex], log: Sink, mode: Mode):
        for batch in data |> shuffle(seed=1) |> batches(7):
            write(log, logs(noisy=noisy_step(mut m, mut opt, batch, mode), plain=step(mut m, mut opt, batch)))
    """)


def sent_messages(pool: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What the controller gives the pool to send from now on: each submit's and call's arguments."""
    sent: list[Any] = []
    submit, call = pool.submit, pool.call
    monkeypatch.setattr(pool, "submit", lambda handler, args, *rest: (sent.append(args), submit(handler, args, *rest))[1])
    monkeypatch.setattr(pool, "call", lambda handler, args, *rest, **kw: (sent.append(args), call(handler, args, *rest, **kw))[1])
    return sent


def data(n: int) -> ss.TensorDataset:
    g = torch.Generator().manual_seed(3)
    return ss.TensorDataset(x=torch.randn(n, 4, generator=g), y=torch.randint(0, 3, (n,), generator=g))


def trained(prog: Any) -> tuple[list[tuple[float, float]], torch.Tensor]:
    m = prog.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.1)
    sink = ss.sinks.memory()
    prog.fit(m, opt, data(33), sink, ss.Train(seed=4))  # 33 rows in 7s: the last batch has 5
    return [(r["noisy"], r["plain"]) for r in sink.records], m.state_dict()["w"]


@pytest.mark.slow
@pytest.mark.parametrize("devices", ["cpu[0 1]", "cpu[0 1 2]"])
def test_a_loops_steps_go_as_one_message_and_train_as_one_device(devices: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    one_losses, one_w = trained(ss.load(PROGRAM, devices="cpu", name="one.ss"))
    prog = ss.load(PROGRAM, devices=devices, name="one.ss")
    try:
        sent = sent_messages(prog.workers(), monkeypatch)
        losses, w = trained(prog)
    finally:
        prog.stop()
    steps = [args for args in sent if isinstance(args, tuple) and args and args[0] in ("step", "noisy_step")]
    assert len(steps) == 2 * 5  # both steps of each of the 5 batches, each one tuple for all workers
    assert all(args[2] == "own share" for args in steps)
    assert all(isinstance(a, tuple) and a[0] == "batchref" for args in steps for a in args[1] if a[0] == "batchref")
    assert len(losses) == len(one_losses) == 5
    for (noisy, plain), (one_noisy, one_plain) in zip(losses, one_losses):
        assert noisy == pytest.approx(one_noisy, abs=1e-5) and plain == pytest.approx(one_plain, abs=1e-5)
    torch.testing.assert_close(w, one_w, atol=1e-5, rtol=1e-5)


HEADS_PROGRAM = HEADS_HEADER + HEADS_NET + textwrap.dedent("""\

    fn loss(m: Net, batch: [b] Ex) -> [] = cross_entropy(scores(m, batch.x), batch.y, over=C)

    fn step(mut m: Net, mut opt: AdamW[Net], batch: [b] Ex) -> []:
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, g)
        return l

    fn fit(mut m: Net, mut opt: AdamW[Net], data: Dataset[Ex], log: Sink):
        for batch in data |> shuffle(seed=1) |> batches(64):
            write(log, logs(loss=step(mut m, mut opt, batch)))
    """)


@pytest.mark.parametrize("devices", ["cpu[0 1]", "cpu[0 1 2]"])
def test_a_loop_under_split_h_sends_each_worker_a_reference_to_the_whole_batch_not_the_dataset(
        devices: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Split H, every worker takes each batch whole: it loads it from the dataset it was sent once.
    (The batch object itself went before, with the dataset inside, pickled at every step.)"""
    g = torch.Generator().manual_seed(5)
    rows = 4000 + 37  # the last batch, of 5, is smaller
    dataset = ss.TensorDataset(x=torch.randn(rows, 6, generator=g), y=torch.randint(0, 3, (rows,), generator=g))

    def fit(prog: Any) -> tuple[list[float], dict[str, torch.Tensor]]:
        m = prog.Net.init(seed=0)
        opt = ss.adamw(m, lr=0.05)
        sink = ss.sinks.memory()
        prog.fit(m, opt, dataset, sink)
        return [r["loss"] for r in sink.records], m.state_dict()

    one_losses, one_state = fit(ss.load(HEADS_PROGRAM, devices="cpu", name="heads.ss"))
    prog = ss.load(HEADS_PROGRAM, devices=devices, name="heads.ss")
    try:
        sent = sent_messages(prog.workers(), monkeypatch)
        losses, state = fit(prog)
    finally:
        prog.stop()
    # each step's message: one for every worker, or one a worker (the heads of a split argument)
    steps = [m for args in sent for m in (args if isinstance(args, list) else [args])
             if isinstance(m, tuple) and m and m[0] == "step"]
    assert len(steps) >= len(one_losses) == 64
    batches = [m[1][2] for m in steps]
    assert all(b[0] == "batchref" and b[3] == 0 for b in batches), batches[:3]
    assert sorted({b[4] for b in batches}) == [5, 64]
    assert max(len(pickle.dumps(m)) for m in steps) < 2000  # the dataset is 110 kB
    assert losses == pytest.approx(one_losses, abs=1e-5)
    for name, value in one_state.items():
        torch.testing.assert_close(state[name], value, atol=1e-5, rtol=1e-5)
