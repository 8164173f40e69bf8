"""The gradients' all-reduce sent in buckets during the backward pass, as DDP does
(runtime/collectives.py's BucketedAverage): a step on cpu[0 1] and cpu[0 1 2] computes what it
computes on one device, and what it computes with SHAPESCRIPT_OVERLAP=off (the whole gradient sent
after the backward), value for value on two devices, where a sum of two is the same in any order;
and the recorded collectives, which the DeviceTable and the timeline read, are the same list."""

from __future__ import annotations

import os
import textwrap

import pytest
import torch
import torch.distributed as dist
from programs import BATCH_NORM, README
from test_equivalence import digits

import shapescript as ss
from shapescript.runtime import collectives, shm_reduce
from shapescript.runtime.collectives import BucketedAverage, average_grads, plan_buckets

# Params of several sizes and two dtypes, and one the loss never uses (its gradient is zeros).
# `unused` comes first, so its bucket is the last and the others are sent during the backward.
SEVERAL = textwrap.dedent("""\
    dim D = 12
    dim H = 40
    dim C = 5

    data Row:
        x: [D]
        y: [] Index[C]

    model Net:
        param unused: [H] = normal(std=0.3)
        param w1: [D H] = normal(std=0.3)
        param b1: [H] = zeros()
        param w2: [H C] = normal(std=0.3)
        param b2: [C] = zeros()
        param scale: [C] f64 = ones()

    fn loss(m: Net, batch: [b] Row) -> []:
        h = relu(batch.x @ m.w1 + m.b1)
        return cross_entropy((h @ m.w2 + m.b2) * to(m.scale, f32), batch.y, over=C)

    fn train_step(mut m: Net, mut opt: AdamW[Net], batch: [b] Row) -> []:
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, g)
        return l
    """)

SMALL_BUCKETS = "0.0005"  # MB, 524 bytes: SEVERAL's f32 params make three buckets, the README's two
STEPS = 5


def rows(n_batches: int, size: int, d: int, classes: int) -> list[dict]:
    g = torch.Generator().manual_seed(3)
    return [{"x": torch.randn(size, d, generator=g), "y": torch.randint(0, classes, (size,), generator=g)}
            for _ in range(n_batches)]


def bn_batches() -> list[dict]:
    return rows(STEPS, 10, 6, 3)


CASES = {  # program, model, batches, extra arguments
    "readme": (README, "Mlp", lambda: digits(STEPS, 64, 784, 10), ()),
    "several-params": (SEVERAL, "Net", lambda: rows(STEPS, 10, 12, 5), ()),
    # batch_norm's all-reduce runs in the backward too, between the buckets' sends
    "batch-norm": (BATCH_NORM, "Net", bn_batches, (ss.Train(seed=0),)),
}


def run(case: str, devices: str, overlap: bool, monkeypatch: pytest.MonkeyPatch):
    """Losses and params after STEPS steps, and the collectives of the first step as recorded."""
    source, model, batches, extra = CASES[case]
    with monkeypatch.context() as env:  # read by the workers as they start
        env.setenv(collectives.OVERLAP_ENV, "on" if overlap else "off")
        env.setenv(collectives.BUCKET_ENV, SMALL_BUCKETS)  # several buckets (the README's fits in one)
        env.setenv(shm_reduce.ENV, "off")  # buckets are Gloo's: shared memory's sums have nothing to overlap
        prog = ss.load(source, devices=devices, name="prog.ss")
        try:
            m = getattr(prog, model).init(seed=0)
            opt = ss.adamw(m, lr=1e-3)
            pool = prog.workers() if devices != "cpu" else None
            losses, recorded = [], None
            for step, batch in enumerate(batches()):
                if pool is not None and step == 0:
                    pool.call("record_collectives", (True,))
                losses.append(float(prog.train_step(m, opt, batch, *extra)))
                if pool is not None and step == 0:
                    runs = pool.call("record_collectives", (False,))
                    assert all(r == runs[0] for r in runs)
                    recorded = runs[0]
            return losses, m.state_dict(), recorded
        finally:
            prog.stop()


def assert_same(got, want, atol: float) -> None:
    """The same losses and params within `atol` (0: value for value)."""
    (losses, state, _), (want_losses, want_state, _) = got, want
    assert losses == (want_losses if atol == 0 else pytest.approx(want_losses, abs=atol))
    assert set(state) == set(want_state)
    for k in want_state:
        torch.testing.assert_close(state[k], want_state[k], atol=atol, rtol=0, msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_overlap_on_two_devices_computes_what_one_device_and_no_overlap_do(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    on = run(case, "cpu[0 1]", True, monkeypatch)
    off = run(case, "cpu[0 1]", False, monkeypatch)
    assert_same(on, run(case, "cpu", True, monkeypatch), 1e-5)
    assert_same(on, off, 0)  # a sum of two values is the same whatever the buckets
    assert on[2] == off[2]  # one recorded all-reduce of the gradients per dtype, where it was


@pytest.mark.slow
@pytest.mark.parametrize("case", ["several-params", "batch-norm"])
def test_overlap_on_an_uneven_split_computes_what_one_device_does(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_same(run(case, "cpu[0 1 2]", True, monkeypatch), run(case, "cpu", True, monkeypatch), 1e-5)


# -- the buckets, in this process ----------------------------------------------------------------

def test_plan_buckets_fills_in_reverse_by_dtype_to_the_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collectives, "FIRST_BUCKET_BYTES", 100)
    monkeypatch.setattr(collectives, "BUCKET_BYTES", 200)
    sizes = [(30, torch.float32), (5, torch.float64), (10, torch.float32), (20, torch.float32),
             (60, torch.float32), (1, torch.float32)]
    params = [torch.zeros(n, dtype=dtype) for n, dtype in sizes]
    # from the last: f32 [5] 4 + [4] 240 bytes >= 100; [3] 80 + [2] 40 < 200, + [0] 120 >= 200;
    # f64 [1] 40 bytes is left open
    assert plan_buckets(params) == [[4, 5], [0, 2, 3], [1]]
    monkeypatch.setattr(collectives, "FIRST_BUCKET_BYTES", 1 << 20)
    assert plan_buckets(params) == [[0, 2, 3, 4, 5], [1]]  # one per dtype: average_grads' buffers


@pytest.fixture
def one_worker_group(tmp_path) -> object:
    """A Gloo group of one in this process: its all-reduce is the identity, so the buckets' sends can be
    watched here."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_buckets_are_sent_during_the_backward(one_worker_group, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collectives, "FIRST_BUCKET_BYTES", 64)
    monkeypatch.setattr(collectives, "BUCKET_BYTES", 64)
    recorded: list = []
    monkeypatch.setattr(collectives, "recorded", recorded)
    g = torch.Generator().manual_seed(0)
    unused, w1, w2 = (torch.randn(*s, generator=g, requires_grad=True) for s in [(4,), (6, 8), (8, 3)])
    params = [unused, w1, w2]
    x = torch.randn(5, 6, generator=g)
    sent_when: list[int] = []  # how many buckets had been sent when w1's gradient was first used

    def loss() -> torch.Tensor:
        h = (x @ w1).relu()
        h.register_hook(lambda grad: sent_when.append(len(buckets.sent)))  # runs before w1's hook
        return (h @ w2).square().mean() + (h @ w2).sum()  # w2 used twice: its hook sees the sum

    buckets = BucketedAverage(params, "here")
    assert buckets.buckets == [[2], [1], [0]]
    with buckets:
        grads = torch.autograd.grad(loss(), params, allow_unused=True)
    assert sent_when == [1]  # w2's bucket had gone before the backward reached w1
    assert len(buckets.sent) == 2  # and w1's when it ended; the unused param's waits for `finish`
    assert grads[0] is None
    tensors = [torch.zeros_like(unused), *grads[1:]]
    averaged = buckets.finish(tensors)
    assert recorded == [("here", 4 + 48 + 24, torch.float32, "all-reduce")]  # once: the whole collective
    reference = average_grads(tensors)  # one device: the gradients themselves
    for got, want in zip(averaged, reference):
        assert torch.equal(got, want)
    assert not any(p._backward_hooks for p in params)  # the hooks are gone after the backward


def test_overlap_is_on_unless_turned_off() -> None:
    assert collectives.overlap == (os.environ.get(collectives.OVERLAP_ENV, "on") != "off")
    assert collectives.bucketed_average([torch.zeros(1, requires_grad=True)], "x") is None  # one device
