"""A SimpleViT-style program (lucidrains/vit-pytorch's simple_vit.py, small) that declares LayerNorm,
Linear and a bias-free projection once each as generic models and uses them at several sizes, with
one `normed` and one `linear` for every use: its logits equal a PyTorch transcription in f64, and
it computes on `cpu[0 1]`, `cpu[0 1 2]` and with `split H` and `shard params` what it computes on
`cpu`, the logits and a training step's gradients."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from every_layout import loaded_everywhere, one_step_everywhere

pytestmark = pytest.mark.slow

SOURCE = textwrap.dedent("""\
    dim Ch = 3
    dim P = 4
    dim Side = 2
    dim Img = Side * P
    dim N = Side * Side
    dim PD = P * P * Ch
    dim D = 16
    dim H = 2
    dim Dh = 8
    dim M = 32
    dim L = 2
    dim C = 5

    data Image:
        x: [Ch Img Img] f64
        y: [] Index[C]

    model LayerNorm[F]:
        param g: [F] f64 = normal(mean=1.0, std=0.1)
        param b: [F] f64 = normal(std=0.1)

    model Linear[I O]:
        param w: [I O] f64 = normal(std=0.3)
        param b: [O] f64 = normal(std=0.1)

    model Proj[I O]:
        param w: [I O] f64 = normal(std=0.3)

    model Attention:
        norm: LayerNorm[D]
        qkv: Proj[D 3*H*Dh]
        out: Proj[H*Dh D]

    model FeedForward:
        norm: LayerNorm[D]
        up: Linear[D M]
        down: Linear[M D]

    model Block:
        attn: Attention
        ff: FeedForward

    model Net:
        buffer pos: [N D] f64 = normal(std=0.1)
        patch_norm: LayerNorm[PD]
        embed: Linear[PD D]
        embed_norm: LayerNorm[D]
        blocks: [L] Block
        head_norm: LayerNorm[D]
        head: Linear[D C]

    fn normed(m: LayerNorm[f], x: [b n f] f64) -> [b n f] f64 = layer_norm(x, over=f) * m.g + m.b

    fn linear(m: Linear[i o], x: [b n i] f64) -> [b n o] f64 = x @ m.w + m.b

    fn attention(q: [b H i Dh] f64, k: [b H j Dh] f64, v: [b H j Dh] f64) -> [b H i Dh] f64:
        s = einsum(q, k, b h i d, b h j d -> b h i j) * (1.0 / Dh ** 0.5)
        return einsum(softmax(s, over=j), v, b h i j, b h j d -> b h i d)

    fn attend(m: Attention, x: [b n D] f64) -> [b n D] f64:
        q, k, v = split(normed(m.norm, x) @ m.qkv.w, b n (3 H Dh) -> b H n Dh)
        return rearrange(attention(q, k, v), b h n d -> b n (h d)) @ m.out.w

    fn feed(m: FeedForward, x: [b n D] f64) -> [b n D] f64 = linear(m.down, gelu(linear(m.up, normed(m.norm, x))))

    fn logits(m: Net, images: [b Ch Img Img] f64) -> [b C] f64:
        patches = rearrange(images, b c (h p1) (w p2) -> b (h w) (p1 p2 c), h=Side, w=Side)
        x = normed(m.embed_norm, linear(m.embed, normed(m.patch_norm, patches))) + m.pos
        for block in m.blocks:
            x = attend(block.attn, x) + x
            x = feed(block.ff, x) + x
        pooled = mean(x, over=N)
        return (layer_norm(pooled, over=D) * m.head_norm.g + m.head_norm.b) @ m.head.w + m.head.b

    fn loss(m: Net, batch: [b] Image) -> [] f64 = cross_entropy(logits(m, batch.x), batch.y, over=C)

    fn train_step(mut m: Net, mut opt: Sgd[Net], batch: [b] Image) -> [] f64:
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, g)
        return l
    """)


@pytest.fixture(scope="module")
def programs() -> Iterator[dict[str, Any]]:
    yield from loaded_everywhere(SOURCE, "simple_vit.ss")


def images(n: int = 5, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 3, 8, 8, generator=g, dtype=torch.float64), "y": torch.randint(0, 5, (n,), generator=g)}


def reference_logits(m: Any, x: torch.Tensor) -> torch.Tensor:
    """simple_vit.py's forward with this model's params: patches, LayerNorm, Linear, LayerNorm, the
    position embedding, pre-norm attention and feed-forward blocks with residuals, mean pooling, head."""
    def norm(p: Any, t: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(t, (t.shape[-1],), p.g, p.b)

    def linear(p: Any, t: torch.Tensor) -> torch.Tensor:
        return t @ p.w + p.b

    b = x.shape[0]
    patches = x.reshape(b, 3, 2, 4, 2, 4).permute(0, 2, 4, 3, 5, 1).reshape(b, 4, 48)  # b c (h p1) (w p2) -> b (h w) (p1 p2 c)
    h = norm(m.embed_norm, linear(m.embed, norm(m.patch_norm, patches))) + m.pos
    for block in m.blocks:
        a = block.attn
        q, k, v = (norm(a.norm, h) @ a.qkv.w).reshape(b, 4, 3, 2, 8).permute(2, 0, 3, 1, 4)
        attn = torch.softmax(q @ k.transpose(-1, -2) * 8 ** -0.5, dim=-1) @ v
        h = attn.permute(0, 2, 1, 3).reshape(b, 4, 16) @ a.out.w + h
        f = block.ff
        h = linear(f.down, F.gelu(linear(f.up, norm(f.norm, h)))) + h
    return linear(m.head, norm(m.head_norm, h.mean(dim=1)))


def test_one_declaration_serves_every_size(programs: dict[str, Any]) -> None:
    checked = programs["cpu"].checked
    uses = sorted(name for name, model in checked.models.items() if model.of is not None)
    assert uses == ["LayerNorm[D]", "LayerNorm[PD]", "Linear[D C]", "Linear[D M]", "Linear[M D]",
                    "Linear[PD D]", "Proj[D 3*Dh*H]", "Proj[Dh*H D]"], uses
    m = programs["cpu"].Net.init(seed=0)
    assert m.patch_norm.g.shape == (48,) and m.embed_norm.g.shape == (16,)
    assert m.embed.w.shape == (48, 16) and m.head.w.shape == (16, 5) and m.blocks[0].attn.qkv.w.shape == (16, 48)


def test_the_logits_are_simple_vits_and_one_devices_everywhere(programs: dict[str, Any]) -> None:
    data = images()
    m = programs["cpu"].Net.init(seed=0)
    expected = reference_logits(m, data["x"])
    for devices, prog in programs.items():
        got = prog.logits(prog.Net.init(seed=0), data["x"])
        torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12, msg=lambda s: f"{devices}: {s}")


def test_a_step_takes_one_devices_gradients(programs: dict[str, Any]) -> None:
    results = one_step_everywhere(programs, images(seed=1))
    for devices, got in results.items():
        torch.testing.assert_close(got, results["cpu"], atol=1e-12, rtol=1e-12, msg=lambda s: f"{devices}: {s}")
    moved = results["cpu"][1]
    assert all(bool(moved[name].abs().sum() > 0) for name in moved if not name.endswith("pos")), \
        [name for name in moved if not bool(moved[name].abs().sum() > 0)]
