"""`split H` with a batch whose field has an H axis: batches are whole on every device, so the field
is cut to each device's part where it is read (before, each device used the whole field against its
part of the params, broadcasting silently to a wrong sum). The values and a step's gradients equal
one device's, with the other layouts beside."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from every_layout import loaded_everywhere, one_step_everywhere

pytestmark = pytest.mark.slow

SOURCE = textwrap.dedent("""\
    dim H = 2
    dim D = 3

    data Ex:
        x: [H D] f64

    model Net:
        param w: [H D] f64 = normal(std=0.5)
        param v: [D] f64 = normal(std=0.5)

    fn score(m: Net, batch: [b] Ex) -> [b] f64 = sum(sum(batch.x * m.w, over=D), over=H)

    fn loss(m: Net, batch: [b] Ex) -> [] f64 = mean(score(m, batch) * score(m, batch)) + sum(m.v * m.v)

    fn train_step(mut m: Net, mut opt: Sgd[Net], batch: [b] Ex) -> [] f64:
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, g)
        return l
    """)


@pytest.fixture(scope="module")
def programs() -> Iterator[dict[str, Any]]:
    yield from loaded_everywhere(SOURCE, "fields.ss")


def examples(seed: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(5, 2, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)}


def test_a_field_with_an_h_axis_is_cut_where_it_is_read(programs: dict[str, Any]) -> None:
    data = examples(0)
    m = programs["cpu"].Net.init(seed=0)
    expected = (data["x"] * m.w).sum((1, 2))
    for devices, prog in programs.items():
        got = prog.score(prog.Net.init(seed=0), data)
        torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12, msg=lambda s: f"{devices}: {s}")


def test_a_step_takes_one_devices_gradients(programs: dict[str, Any]) -> None:
    results = one_step_everywhere(programs, examples(1))
    for devices, got in results.items():
        torch.testing.assert_close(got, results["cpu"], atol=1e-12, rtol=1e-12, msg=lambda s: f"{devices}: {s}")
