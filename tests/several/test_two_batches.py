"""A function of two batches of different sizes (`a: [b] Ex, c: [n] Ex`) on several devices: each
batch is cut in its own shares (before, the second was cut by the first's sizes: torch's
split_with_sizes error), and the values and a step's gradients equal one device's. With a mode, whose
draws are made for one batch's rows, such a call is refused with a ShapeError saying why."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import shapescript as ss

pytestmark = pytest.mark.slow

SOURCE = """\
dim D = 3

data Ex:
    x: [D] f64

model Net:
    param w: [D] f64 = normal(std=0.5)

fn both(m: Net, a: [b] Ex, c: [n] Ex) -> [] f64 = sum(a.x * m.w) + mean(c.x * m.w)

fn loss(m: Net, a: [b] Ex, c: [n] Ex) -> [] f64 = both(m, a, c) * both(m, a, c)

fn step(mut m: Net, mut opt: Sgd[Net], a: [b] Ex, c: [n] Ex) -> [] f64:
    l, g = value_and_grad(loss, m, a, c)
    update(mut m, mut opt, g)
    return l

fn noisy(m: Net, a: [b] Ex, c: [n] Ex, mode: Mode) -> [] f64 = sum(dropout(a.x, 0.5, mode) * m.w) + sum(c.x * m.w)
"""


@pytest.fixture(scope="module")
def programs() -> Iterator[dict[str, Any]]:
    progs = {devices: ss.load(SOURCE, devices=devices, name="two.ss") for devices in ("cpu", "cpu[0 1]", "cpu[0 1 2]")}
    try:
        yield progs
    finally:
        for prog in progs.values():
            prog.stop()


def batch(rows: int, seed: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(rows, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)}


def test_each_batch_is_cut_in_its_own_shares(programs: dict[str, Any]) -> None:
    a, c = batch(5, 0), batch(4, 1)
    m = programs["cpu"].Net.init(seed=0)
    expected = (a["x"] * m.w).sum() + (c["x"] * m.w).mean()
    for devices, prog in programs.items():
        got = prog.both(prog.Net.init(seed=0), a, c)
        torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12, msg=lambda s: f"{devices}: {s}")
        opt_m = prog.Net.init(seed=0)
        prog.step(opt_m, ss.sgd(opt_m, lr=0.1), a, c)
        after = programs["cpu"].Net.init(seed=0)
        programs["cpu"].step(after, ss.sgd(after, lr=0.1), a, c)
        torch.testing.assert_close(opt_m.w, after.w, atol=1e-12, rtol=1e-12, msg=lambda s: f"{devices}: {s}")


def test_a_mode_with_two_batch_sizes_is_refused_on_several_devices(programs: dict[str, Any]) -> None:
    prog = programs["cpu[0 1]"]
    with pytest.raises(ss.ShapeError, match="batches of 4 and 5 rows and a mode"):
        prog.noisy(prog.Net.init(seed=0), batch(5, 0), batch(4, 1), ss.Train(seed=0))
    same = prog.noisy(prog.Net.init(seed=0), batch(5, 0), batch(5, 1), ss.Train(seed=0))  # one size: drawn as one device
    one = programs["cpu"]
    torch.testing.assert_close(same, one.noisy(one.Net.init(seed=0), batch(5, 0), batch(5, 1), ss.Train(seed=0)))
