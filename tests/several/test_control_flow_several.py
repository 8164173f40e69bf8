"""The guarantee for counted loops, `if` and growing loop variables: on `cpu[0 1]` and `cpu[0 1 2]`
(an uneven split of 7) a program that accumulates micro-batches in a `range` loop, branches on a
scalar it computes (a `[] bool` every device holds whole), grows a value by appending along an axis
and crops it with `last` computes what it computes on `cpu`; and under `split H` with `shard params`
too. The DeviceTable multiplies a loop's collectives by its count. One program per device count,
loaded once."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from every_layout import loaded_everywhere, one_step_everywhere

pytestmark = pytest.mark.slow

SOURCE = textwrap.dedent("""\
    dim K = 3
    dim D = 3
    dim H = 4
    dim C = 5
    dim T = 4
    dim S = 1

    data Ex:
        x: [K D] f64
        y: [K] Index[C]

    model Net:
        param w: [D H] f64 = normal(std=0.5)
        param v: [H C] f64 = normal(std=0.5)

    fn micro(m: Net, batch: [b] Ex, k: int) -> [] f64:
        h = tanh(take(batch.x, k, over=K) @ m.w)
        return cross_entropy(h @ m.v, take(batch.y, k, over=K), over=C)

    fn total(m: Net, batch: [b] Ex) -> [] f64:
        s = micro(m, batch, 0)
        for k in range(1, K):
            if s > 2.0:
                s = s + micro(m, batch, k) * 0.5
            else:
                s = s + micro(m, batch, k)
        return s / K

    fn start(h: [b H] f64) -> [b 1 H] f64 = repeat(h, b h -> b o h, o=1)

    fn grow(m: Net, batch: [b] Ex) -> [b H] f64:
        seq = window(batch.x @ m.w, 0, S, over=K)
        for i in range(5):
            seq = cat(seq, start(tanh(take(seq, -1, over=S)) * 0.5), over=S)
        return sum(last(seq, T, over=S), over=T)

    fn train_step(mut m: Net, mut opt: Sgd[Net], batch: [b] Ex) -> [] f64:
        l, g = value_and_grad(total, m, batch)
        for k in range(1, K):
            lk, gk = value_and_grad(micro, m, batch, k)
            g = g + gk
        update(mut m, mut opt, g / K)
        return l
    """)


@pytest.fixture(scope="module")
def programs() -> Iterator[dict[str, Any]]:
    yield from loaded_everywhere(SOURCE, "flow.ss")


def batch(n: int = 7, seed: int = 0, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": scale * torch.randn(n, 3, 3, generator=g, dtype=torch.float64),
            "y": torch.randint(0, 5, (n, 3), generator=g)}


def assert_all_close(results: dict[str, Any]) -> None:
    for devices, got in results.items():
        torch.testing.assert_close(got, results["cpu"], atol=1e-12, rtol=1e-12, msg=lambda m: f"{devices}: {m}")


@pytest.mark.parametrize("size, scale", [(7, 1.0), (7, 8.0), (1, 1.0)])
def test_loops_and_branches_compute_one_devices(programs: dict[str, Any], size: int, scale: float) -> None:
    """Small inputs take one branch, large ones (a loss above 2) the other, on every device."""
    data = batch(size, scale=scale)
    results = {}
    for devices, prog in programs.items():
        m = prog.Net.init(seed=0)
        results[devices] = {"total": prog.total(m, data), "grow": prog.grow(m, data)}
    assert_all_close(results)
    m = programs["cpu"].Net.init(seed=0)
    w, v = m.w.detach(), m.v.detach()

    def micro(k: int) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(torch.tanh(data["x"][:, k] @ w) @ v, data["y"][:, k])
    s = micro(0)
    for k in (1, 2):
        s = s + micro(k) * (0.5 if s > 2.0 else 1.0)
    torch.testing.assert_close(results["cpu"]["total"], s / 3, atol=1e-12, rtol=0)
    seq = [data["x"][:, 0] @ w]
    for _ in range(5):
        seq.append(torch.tanh(seq[-1]) * 0.5)
    torch.testing.assert_close(results["cpu"]["grow"], sum(seq[-4:]), atol=1e-12, rtol=0)


def test_a_step_takes_one_devices_gradients(programs: dict[str, Any]) -> None:
    results = one_step_everywhere(programs, batch(seed=1))
    assert_all_close(results)
    assert all(bool(g.abs().sum() > 0) for g in results["cpu"][1].values())


def test_the_device_table_multiplies_a_loops_collectives_by_its_count(programs: dict[str, Any]) -> None:
    table = programs["cpu[0 1]"].device_table
    line = next(k for k, text in enumerate(SOURCE.splitlines(), 1) if "lk, gk = value_and_grad" in text)
    items = table.lines[line]
    assert [item.repeats for item in items] == [2]  # range(1, K): K - 1 passes
    total = table.lines[next(k for k, text in enumerate(SOURCE.splitlines(), 1) if "s = s + micro(m, batch, k) * 0.5" in text)]
    assert [item.repeats for item in total] == [2]
