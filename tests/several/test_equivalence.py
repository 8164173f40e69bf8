"""The guarantee: on cpu[0 1] and cpu[0 1 2] (an uneven split) a program computes what it computes
on one device, up to the order of floating-point additions."""

from __future__ import annotations

import pytest
import torch
from programs import BATCH_NORM, GPT, GPT_DIMS, README

import shapescript as ss

DEVICES = ["cpu[0 1]", "cpu[0 1 2]"]


def run(source: str, devices: str, model: str, batches: list[dict], extra: tuple = (), dims=None):
    prog = ss.load(source, devices=devices, dims=dims, name="prog.ss")
    try:
        m = getattr(prog, model).init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        losses = [float(prog.train_step(m, opt, b, *extra)) for b in batches]
        return losses, m.state_dict()
    finally:
        prog.stop()


def compare(reference, other) -> None:
    ref_losses, ref_state = reference
    losses, state = other
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    assert set(state) == set(ref_state)
    for k in ref_state:
        torch.testing.assert_close(state[k], ref_state[k], atol=1e-5, rtol=0, msg=k)


def digits(n_batches: int, size: int, d: int, classes: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"img": torch.randn(size, d, generator=g), "label": torch.randint(0, classes, (size,), generator=g)}
            for _ in range(n_batches)]


@pytest.mark.slow
@pytest.mark.parametrize("devices", DEVICES)
def test_readme_mlp(devices: str) -> None:
    batches = digits(20, 64, 784, 10)
    compare(run(README, "cpu", "Mlp", batches), run(README, devices, "Mlp", batches))


@pytest.mark.slow
@pytest.mark.parametrize("devices", DEVICES)
def test_attention_in_eval(devices: str) -> None:
    g = torch.Generator().manual_seed(1)
    batches = [{"tokens": torch.randint(0, 11, (7, 8), generator=g), "targets": torch.randint(0, 11, (7, 8), generator=g)}
               for _ in range(20)]
    reference = run(GPT, "cpu", "Gpt", batches, (ss.Eval,), GPT_DIMS)
    compare(reference, run(GPT, devices, "Gpt", batches, (ss.Eval,), GPT_DIMS))


@pytest.mark.slow
@pytest.mark.parametrize("devices", DEVICES)
def test_batch_norm_model(devices: str) -> None:
    g = torch.Generator().manual_seed(2)
    batches = [{"x": torch.randn(10, 6, generator=g), "y": torch.randint(0, 3, (10,), generator=g)} for _ in range(20)]
    reference = run(BATCH_NORM, "cpu", "Net", batches, (ss.Train(seed=0),))
    compare(reference, run(BATCH_NORM, devices, "Net", batches, (ss.Train(seed=0),)))
