"""The guarantee where the batch meets randomness, padding and tiny batches: on `cpu[0 1]` and
`cpu[0 1 2]` a program computes what it computes on `cpu`, within 1e-5, and fails where it fails.

- dropout in Train draws the whole batch's mask, keyed by the mode's seed and its count of draws, and
  each worker keeps its part's rows; a mode reused from Python draws fresh masks on every count;
- variable-length items loaded by the workers are padded to the whole batch's longest item;
- batch_norm trains alike on an uneven split, and a batch with one value per channel is refused alike;
- a worker with an empty part (a batch smaller than the workers) adds nothing, as one device would.

One program per device count, shared by the tests (each makes its own models)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import shapescript as ss

DEVICES = ["cpu", "cpu[0 1]", "cpu[0 1 2]"]
SOURCE = textwrap.dedent("""\
    dim D = 6
    dim Hd = 8
    dim C = 3
    dim V = 6
    dim E = 3

    data Ex:
        x: [D]
        y: [] Index[C]

    data Seq:
        tokens: [n] Index[V]
        targets: [n] Index[V]

    model Stats:
        buffer mean: [Hd] = zeros()
        buffer var: [Hd] = ones()

    model Net:
        param w1: [D Hd] = normal(std=0.3)
        norm: Stats
        param w2: [Hd C] = normal(std=0.3)

    model Emb:
        param emb: [V E] = normal(std=0.5)
        param out: [E V] = normal(std=0.5)

    fn loss(m: Net, batch: [b] Ex, mode: Mode) -> []:
        h = dropout(relu(batch_norm(batch.x @ m.w1, m.norm, mode, over=Hd)), 0.3, mode)
        return cross_entropy(h @ m.w2, batch.y, over=C)

    fn train_step(mut m: Net, mut opt: AdamW[Net], batch: [b] Ex, mode: Mode) -> []:
        l, g = value_and_grad(loss, m, batch, mode)
        update(mut m, mut opt, g)
        return l

    fn drop(x: [b C], mode: Mode) -> [b C] = dropout(x, 0.5, mode)

    fn drop_transposed(x: [b C], mode: Mode) -> [C b] = dropout(rearrange(x, b c -> c b), 0.5, mode)

    fn drop_fresh(x: [b C]) -> [b C] = dropout(x, 0.5, Train(seed=3))

    fn seq_loss(m: Emb, batch: [b] Seq) -> []:
        h = embedding(m.emb, batch.tokens)
        ce = cross_entropy(h @ m.out, batch.targets, over=V, mask=valid(batch, n))
        each = mean(h, over=n, mask=valid(batch, n))
        profile = sum(h, over=b)
        return ce + mean(each * each) + 0.1 * mean(profile * profile)

    fn seq_step(mut m: Emb, mut opt: AdamW[Emb], batch: [b] Seq) -> []:
        l, g = value_and_grad(seq_loss, m, batch)
        update(mut m, mut opt, g)
        return l

    fn fit(mut m: Emb, mut opt: AdamW[Emb], data: Dataset[Seq], log: Sink):
        for batch in data |> shuffle(seed=1) |> batches(4):
            write(log, logs(loss=seq_step(mut m, mut opt, batch)))
    """)


@pytest.fixture(scope="module")
def programs() -> Iterator[dict[str, Any]]:
    progs: dict[str, Any] = {}
    try:
        for devices in DEVICES:
            progs[devices] = ss.load(SOURCE, devices=devices, name="prog.ss")
        yield progs
    finally:
        for prog in progs.values():
            prog.stop()


def on_each(programs: dict[str, Any], run: Callable[[Any], Any]) -> dict[str, Any]:
    return {devices: run(prog) for devices, prog in programs.items()}


def assert_all_close(results: dict[str, Any]) -> None:
    """Every device count's results (tensors, floats, dicts and lists of them) equal `cpu`'s within 1e-5."""
    reference = results["cpu"]
    for devices, got in results.items():
        torch.testing.assert_close(got, reference, atol=1e-5, rtol=0, msg=lambda m: f"{devices}: {m}")


def examples(sizes: list[int], seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(n, 6, generator=g), "y": torch.randint(0, 3, (n,), generator=g)} for n in sizes]


def train(prog: Any, batches: list[dict], mode: Any) -> tuple[list[float], dict[str, torch.Tensor]]:
    m = prog.Net.init(seed=0)
    opt = ss.adamw(m, lr=0.05)
    losses = [float(prog.train_step(m, opt, b, mode)) for b in batches]
    return losses, dict(m.state_dict())


def test_dropout_in_train_trains_as_on_one_device(programs: dict[str, Any]) -> None:
    # batch 7 on 3 workers is 3/2/2, batch 2 leaves the third worker an empty part; one mode for all
    # the steps, so each step's masks are fresh and must be the same fresh ones on every count
    batches = examples([7, 7, 2, 7, 5, 7])
    results = on_each(programs, lambda prog: train(prog, batches, ss.Train(seed=11)))
    assert_all_close(results)
    losses, state = results["cpu"]
    in_eval, _ = train(programs["cpu"], batches, ss.Eval)
    assert losses[1:] != pytest.approx(in_eval[1:], abs=1e-3)  # dropout did drop
    assert not torch.equal(state["norm.mean"], torch.zeros(8))  # the running statistics moved


def test_successive_calls_with_one_mode_draw_fresh_masks_alike(programs: dict[str, Any]) -> None:
    x = torch.ones(7, 3)

    def masks(prog: Any) -> list[torch.Tensor]:
        mode = ss.Train(seed=5)  # one mode for three calls: the controller's must count the workers' draws
        return [prog.drop(x, mode), prog.drop(x, mode), prog.drop_transposed(x, mode),
                prog.drop_fresh(x), prog.drop_fresh(x)]

    results = on_each(programs, masks)
    for devices, (first, second, transposed, fresh, fresh_again) in results.items():
        assert not torch.equal(first, second), devices  # the mode's second draw is a new mask
        assert not torch.equal(transposed, first.T), devices
        assert torch.equal(fresh, fresh_again), devices  # a mode made in the program starts anew
        assert set(first.unique().tolist()) == {0.0, 2.0}, devices
    assert_all_close(results)  # the same masks on every count, the batch axis first or last


def test_ragged_items_loaded_by_the_workers_pad_as_one_batch(programs: dict[str, Any]) -> None:
    from sample_data import Sequences  # a module the workers import: they load the items themselves

    def fit(prog: Any) -> tuple[list[float], dict[str, torch.Tensor]]:
        m = prog.Emb.init(seed=0)
        opt = ss.adamw(m, lr=0.05)
        sink = ss.sinks.memory()
        for _ in range(2):  # 9 items in batches of 4, 4 and 1: the last leaves workers empty parts
            prog.fit(m, opt, Sequences(9), sink)
        return [r["loss"] for r in sink.records], dict(m.state_dict())

    results = on_each(programs, fit)
    assert len(results["cpu"][0]) == 6
    assert_all_close(results)


def test_a_batch_norm_batch_of_one_fails_alike(programs: dict[str, Any]) -> None:
    one = examples([1])[0]  # on cpu[0 1] shares 1 and 0; torch refuses it on one device

    def fail_then_eval(prog: Any) -> float:
        m = prog.Net.init(seed=0)
        with pytest.raises(ss.ShapeError, match=r"prog\.ss:\d+:\d+: batch_norm in Train needs more than "
                                                r"one value per channel.* has 1;"):
            prog.train_step(m, ss.adamw(m, lr=0.05), one, ss.Train(seed=0))
        return float(prog.loss(m, one, ss.Eval))  # Eval takes the running statistics: no error

    assert_all_close(on_each(programs, fail_then_eval))
