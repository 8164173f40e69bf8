"""The guarantee for the built-in norms: a small model with a layer_norm whose gain and bias fuse into
it, an rms_norm with its weight over a middle axis, and a group_norm with its weight and bias computes
on `cpu[0 1]` and `cpu[0 1 2]` (an uneven split of 7) what it computes on `cpu`, and what torch's
functional norms compute, its logits and a training step's gradients; and under `split H` with
`shard params`: the layer_norm along Dh keeps each device's heads (it sends nothing), the rms_norm
over H takes its operand and its weight whole."""

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
    dim D = 4
    dim H = 2
    dim Dh = 3
    dim C = 4
    dim L = 5
    dim Out = 3

    data Ex:
        x: [D] f64
        img: [C L] f64
        y: [] Index[Out]

    model Net:
        param w: [D H Dh] f64 = normal(std=0.5)
        param gain: [Dh] f64 = normal(mean=1.0, std=0.2)
        param bias: [Dh] f64 = normal(std=0.2)
        param scale: [H] f64 = normal(mean=1.0, std=0.2)
        param gc: [C] f64 = normal(mean=1.0, std=0.2)
        param bc: [C] f64 = normal(std=0.2)
        param out: [(H Dh) Out] f64 = normal(std=0.3)
        param out2: [(C L) Out] f64 = normal(std=0.3)

    fn logits(m: Net, batch: [b] Ex) -> [b Out] f64:
        h = layer_norm(batch.x @ m.w, over=Dh) * m.gain + m.bias
        h = rms_norm(h, m.scale, over=H)
        c = group_norm(batch.img, 2, m.gc, m.bc, over=C)
        return rearrange(h, b h d -> b (h d)) @ m.out + rearrange(c, b c l -> b (c l)) @ m.out2

    fn loss(m: Net, batch: [b] Ex) -> [] f64 = cross_entropy(logits(m, batch), batch.y, over=Out)

    fn train_step(mut m: Net, mut opt: Sgd[Net], batch: [b] Ex) -> [] f64:
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, g)
        return l
    """)


@pytest.fixture(scope="module")
def programs() -> Iterator[dict[str, Any]]:
    yield from loaded_everywhere(SOURCE, "norms.ss")


def examples(n: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 4, generator=g, dtype=torch.float64),
            "img": torch.randn(n, 4, 5, generator=g, dtype=torch.float64), "y": torch.randint(0, 3, (n,), generator=g)}


def test_the_logits_are_torchs_and_one_devices_everywhere(programs: dict[str, Any]) -> None:
    data = examples()
    results = {devices: prog.logits(prog.Net.init(seed=0), data) for devices, prog in programs.items()}
    m = programs["cpu"].Net.init(seed=0)
    h = F.layer_norm(torch.tensordot(data["x"], m.w, dims=1), (3,), m.gain, m.bias)
    h = F.rms_norm(h.transpose(1, 2), (2,), m.scale).transpose(1, 2)
    c = F.group_norm(data["img"], 2, m.gc, m.bc)
    expected = h.flatten(1) @ m.out + c.flatten(1) @ m.out2
    for devices, got in results.items():
        torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12, msg=lambda s: f"{devices}: {s}")


def test_a_step_takes_one_devices_gradients(programs: dict[str, Any]) -> None:
    results = one_step_everywhere(programs, examples(seed=1))
    for devices, got in results.items():
        torch.testing.assert_close(got, results["cpu"], atol=1e-12, rtol=1e-12, msg=lambda s: f"{devices}: {s}")
    assert all(bool(g.abs().sum() > 0) for g in results["cpu"][1].values())


def test_split_h_keeps_each_devices_heads_but_where_a_norm_is_over_h(programs: dict[str, Any]) -> None:
    prog = programs["cpu[0 1] split H, shard params"]
    lines = (OPTIONS + SOURCE).splitlines()  # that program has the options' lines first

    def sent(text: str) -> list[str]:
        line = next(k for k, source in enumerate(lines, 1) if text in source)
        return [s.collective.what for item in prog.device_table.lines.get(line, []) for s in item.sent]

    # Fused: the gain and bias, gathered from their pieces, are the call's weight and bias.
    assert "_rt.layer_norm(torch.tensordot(batch.x, m._m_w, dims=1), 2, _rt.gather_param(m, '_m_gain'" \
        in prog.worker_source
    layer_norm = sent("layer_norm(")
    assert not any("part of H" in what for what in layer_norm), layer_norm  # each device's own heads
    rms_norm = sent("rms_norm(")
    assert rms_norm.count("a [b H Dh] f64 whole from every device's part along H") == 1, rms_norm
    assert not any("part of H" in what for what in sent("group_norm(")), sent("group_norm(")
