"""The guarantee for convolutions and pooling: a small CNN (conv2d, a bias, relu, max_pool2d,
avg_pool2d, a flattening product) computes on `cpu[0 1]` and `cpu[0 1 2]` (an uneven split of 7)
what it computes on `cpu`, its logits and a training step's gradients; and under `split H` with
`shard params`, where H is the convolution's output channels: each device computes its own
channels, and the flattening product's sum over them is the one all-reduce the DeviceTable shows."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from every_layout import OPTIONS, loaded_everywhere, one_step_everywhere

pytestmark = pytest.mark.slow

SOURCE = textwrap.dedent("""\
    dim C = 2
    dim H = 4
    dim K = 3
    dim Out = 5

    data Image:
        x: [C 8 8] f64
        y: [] Index[Out]

    model Net:
        param k: [H C K K] f64 = normal(std=0.3)
        param bias: [H] f64 = normal(std=0.1)
        param w: [(H 3 3) Out] f64 = normal(std=0.1)

    fn logits(m: Net, batch: [b] Image) -> [b Out] f64:
        h = max_pool2d(relu(conv2d(batch.x, m.k, padding=1) + m.bias), 2)
        return rearrange(avg_pool2d(h, 2, stride=1), b h i j -> b (h i j)) @ m.w

    fn loss(m: Net, batch: [b] Image) -> [] f64 = cross_entropy(logits(m, batch), batch.y, over=Out)

    fn train_step(mut m: Net, mut opt: Sgd[Net], batch: [b] Image) -> [] f64:
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, g)
        return l
    """)


@pytest.fixture(scope="module")
def programs() -> Iterator[dict[str, Any]]:
    yield from loaded_everywhere(SOURCE, "cnn.ss")


def images(n: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 2, 8, 8, generator=g, dtype=torch.float64), "y": torch.randint(0, 5, (n,), generator=g)}


def test_the_logits_are_torchs_and_one_devices_everywhere(programs: dict[str, Any]) -> None:
    data = images()
    results = {devices: prog.logits(prog.Net.init(seed=0), data) for devices, prog in programs.items()}
    m = programs["cpu"].Net.init(seed=0)
    h = F.max_pool2d(F.relu(F.conv2d(data["x"], m.k, m.bias, padding=1)), 2)
    expected = F.avg_pool2d(h, 2, stride=1).flatten(1) @ m.w
    for devices, got in results.items():
        torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12, msg=lambda s: f"{devices}: {s}")


def test_a_step_takes_one_devices_gradients(programs: dict[str, Any]) -> None:
    results = one_step_everywhere(programs, images(seed=1))
    for devices, got in results.items():
        torch.testing.assert_close(got, results["cpu"], atol=1e-12, rtol=1e-12, msg=lambda s: f"{devices}: {s}")
    assert all(bool(g.abs().sum() > 0) for g in results["cpu"][1].values())


def test_split_h_keeps_each_devices_channels_until_the_product(programs: dict[str, Any]) -> None:
    table = programs["cpu[0 1] split H, shard params"].device_table
    lines = (OPTIONS + SOURCE).splitlines()  # that program has the options' lines first
    product = next(k for k, text in enumerate(lines, 1) if "b h i j -> b (h i j)" in text)
    sent = [s.collective.what for item in table.lines.get(product, []) for s in item.sent]
    assert sent == ["the partial results of every device's part of H, added up"], sent
    conv = next(k for k, text in enumerate(lines, 1) if "conv2d(" in text)
    assert conv not in table.lines  # each device's own channels: the convolution sends nothing
