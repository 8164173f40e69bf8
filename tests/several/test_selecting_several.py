"""The guarantee for take, window, cat, stack and pad along the axes of each example: on `cpu[0 1]`
and `cpu[0 1 2]` (an uneven split of 7) a program that selects and joins along them computes what
it computes on `cpu`, values and gradients; and under `split H` with `shard params` too. One program
per device count, loaded once. (tests/compiler/test_selecting_ops.py refuses them along the batch
axis.)"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from every_layout import loaded_everywhere, one_step_everywhere

pytestmark = pytest.mark.slow

SOURCE = textwrap.dedent("""\
    dim T = 5
    dim D = 3
    dim H = 4
    dim V = 6

    data Ex:
        x: [T D] f64
        ids: [T] Index[V]

    model Net:
        param w: [D H] f64 = normal(std=0.5)
        param e: [V H] f64 = normal(std=0.5)

    fn crop(h: [b m H] f64) -> [b T H] f64 = window(h, -T, T, over=m)

    fn joined(m: Net, batch: [b] Ex) -> [b T H] f64:
        h = batch.x @ m.w
        last = take(h, -1, over=T) + take(h, T - 2, over=T)
        both = rearrange(stack(last, last * 2.0), k b h -> b k h)
        grown = cat(h, window(h, 1, 2, over=T), both, over=T)
        return crop(grown) + pad(batch.x, 1, 0, over=D, value=1.0) @ pad(m.w, 1, 0, over=D)

    fn widened(m: Net, batch: [b] Ex) -> [b T H+3] f64 = pad(batch.x @ m.w, 1, 2, over=H, value=0.5)

    fn tokens(m: Net, batch: [b] Ex) -> [b T+1] Index[V] = cat(window(batch.ids, -1, 1, over=T), batch.ids, over=T)

    fn pairs(m: Net, batch: [b] Ex) -> [2 b T] f64 = stack(sum(batch.x, over=D), take(batch.x, 0, over=D))

    fn total(m: Net, batch: [b] Ex) -> [] f64:
        picked = embedding(m.e, tokens(m, batch)) + embedding(m.e, pad(batch.ids, 1, 0, over=T))
        return mean(joined(m, batch)) + mean(widened(m, batch) ** 2) + mean(take(picked, 0, over=H) ** 2)

    fn train_step(mut m: Net, mut opt: Sgd[Net], batch: [b] Ex) -> [] f64:
        l, g = value_and_grad(total, m, batch)
        update(mut m, mut opt, g)
        return l
    """)
FUNCTIONS = ["joined", "widened", "tokens", "pairs", "total"]
# The same program with both layout options (the devices it is loaded on replace the line's).
@pytest.fixture(scope="module")
def programs() -> Iterator[dict[str, Any]]:
    yield from loaded_everywhere(SOURCE, "selecting.ss")


def batch(n: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 5, 3, generator=g, dtype=torch.float64), "ids": torch.randint(0, 6, (n, 5), generator=g)}


def assert_all_close(results: dict[str, Any]) -> None:
    """Every device count's results equal `cpu`'s, up to the order of additions."""
    for devices, got in results.items():
        torch.testing.assert_close(got, results["cpu"], atol=1e-12, rtol=1e-12, msg=lambda m: f"{devices}: {m}")


@pytest.mark.parametrize("size", [7, 1])
def test_each_function_is_one_devices(programs: dict[str, Any], size: int) -> None:
    """7 examples split 4 + 3 and 3 + 2 + 2; one example leaves the other workers empty parts."""
    data = batch(size)
    results = {}
    for devices, prog in programs.items():
        m = prog.Net.init(seed=0)
        results[devices] = {name: getattr(prog, name)(m, data) for name in FUNCTIONS}
    assert_all_close(results)
    x, ids = data["x"], data["ids"]
    assert torch.equal(results["cpu"]["tokens"], torch.cat((ids[:, -1:], ids), 1))
    assert results["cpu"]["joined"].shape == (size, 5, 4) and results["cpu"]["widened"].shape == (size, 5, 7)
    assert torch.equal(results["cpu"]["widened"][..., 0], torch.full((size, 5), 0.5, dtype=x.dtype))
    assert torch.equal(results["cpu[0 1 2]"]["pairs"], torch.stack((x.sum(2), x[:, :, 0])))  # its batch axis second


def test_a_step_takes_one_devices_gradients(programs: dict[str, Any]) -> None:
    data = batch(seed=1)
    results = one_step_everywhere(programs, data)
    assert_all_close(results)
    assert all(bool(g.abs().sum() > 0) for g in results["cpu"][1].values())
