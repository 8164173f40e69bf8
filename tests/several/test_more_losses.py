"""The guarantee for the losses of values against a target (mse_loss, l1_loss, smooth_l1_loss,
binary_cross_entropy_with_logits, kl_div), nll_loss and cosine_similarity: on `cpu[0 1]` and
`cpu[0 1 2]` (an uneven split of 7) each computes what it computes on `cpu`, masked or not, with
the same gradients; and on `cpu[0 1]` the collectives a step runs are those the DeviceTable lists.
Under `split H` with `shard params` the same program computes the same too. One program per
device count, shared by the tests. (The batch's fields have no axis H: under `split H` a batch is
whole, and a field of it with an axis H is taken for a part of it, which plan/layout.py doesn't cut.)"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from every_layout import loaded_everywhere, one_step_everywhere
from test_comms import expected, recorded

import shapescript as ss

pytestmark = pytest.mark.slow

SOURCE = textwrap.dedent("""\
    dim D = 3
    dim H = 4
    dim C = 3

    data Ex:
        x: [D] f64
        y: [D] f64
        soft: [C] f64
        label: [] Index[C]
        keep: [] bool

    model Net:
        param t: [D H] f64 = normal(std=0.5)
        param w_mse: [D H] f64 = normal(std=0.5)
        param w_l1: [D H] f64 = normal(std=0.5)
        param w_huber: [D H] f64 = normal(std=0.5)
        param w_bce: [D H] f64 = normal(std=0.5)
        param w_nll: [D C] f64 = normal(std=0.5)
        param w_kl: [D C] f64 = normal(std=0.5)
        param w_klb: [D H] f64 = normal(std=0.5)
        param w_cos: [D H] f64 = normal(std=0.5)
        param w_cosc: [D H C] f64 = normal(std=0.5)

    fn mse(m: Net, batch: [b] Ex) -> [] f64 = mse_loss(batch.x @ m.w_mse, batch.y @ m.t)
    fn l1(m: Net, batch: [b] Ex) -> [] f64 = l1_loss(batch.x @ m.w_l1, batch.y @ m.t, mask=batch.y @ m.t > 0.0)
    fn huber(m: Net, batch: [b] Ex) -> [] f64 = smooth_l1_loss(softplus(batch.x @ m.w_huber), batch.y @ m.t, beta=0.5)
    fn bce(m: Net, batch: [b] Ex) -> [] f64 = binary_cross_entropy_with_logits(batch.x @ m.w_bce, sigmoid(batch.y @ m.t), mask=batch.keep)
    fn nll(m: Net, batch: [b] Ex) -> [] f64 = nll_loss(log_softmax(batch.x @ m.w_nll, over=C), batch.label, over=C, mask=batch.keep)
    fn kl(m: Net, batch: [b] Ex) -> [] f64 = kl_div(log_softmax(batch.x @ m.w_kl, over=C), batch.soft, over=C)
    fn kl_b(m: Net, batch: [b] Ex) -> [] f64 = kl_div(batch.x @ m.w_klb, sigmoid(batch.y @ m.t), over=b)
    fn angle(m: Net, batch: [b] Ex) -> [b] f64 = cosine_similarity(batch.x @ m.w_cos, batch.y @ m.t, over=H)
    fn angle_c(m: Net, batch: [b] Ex) -> [b H] f64 = cosine_similarity(batch.x @ m.w_cosc, erf(batch.x @ m.w_cosc), over=C)

    fn total(m: Net, batch: [b] Ex) -> [] f64:
        fits = mse(m, batch) + l1(m, batch) + huber(m, batch) + bce(m, batch)
        divergences = nll(m, batch) + kl(m, batch) + kl_b(m, batch)
        return fits + divergences + mean(1.0 - angle(m, batch)) + mean(1.0 - angle_c(m, batch))

    fn train_step(mut m: Net, mut opt: Sgd[Net], batch: [b] Ex) -> [] f64:
        l, g = value_and_grad(total, m, batch)
        update(mut m, mut opt, g)
        return l
    """)
LOSSES = ["mse", "l1", "huber", "bce", "nll", "kl", "kl_b", "total"]
PER_EXAMPLE = ["angle", "angle_c"]
# The same program with both layout options (the devices it is loaded on replace the line's).
@pytest.fixture(scope="module")
def programs() -> Iterator[dict[str, Any]]:
    yield from loaded_everywhere(SOURCE, "losses.ss")


def batch(n: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 3, generator=g, dtype=torch.float64),
            "y": torch.randn(n, 3, generator=g, dtype=torch.float64),
            "soft": torch.randn(n, 3, generator=g, dtype=torch.float64).softmax(1),
            "label": torch.randint(0, 3, (n,), generator=g),
            "keep": torch.rand(n, generator=g) < 0.7}


def assert_all_close(results: dict[str, Any]) -> None:
    """Every device count's results equal `cpu`'s, up to the order of additions."""
    reference = results["cpu"]
    for devices, got in results.items():
        torch.testing.assert_close(got, reference, atol=1e-12, rtol=1e-12, msg=lambda m: f"{devices}: {m}")


def test_each_loss_and_cosine_similarity_is_one_devices(programs: dict[str, Any]) -> None:
    data = batch()
    results = {}
    for devices, prog in programs.items():
        m = prog.Net.init(seed=0)
        results[devices] = {name: getattr(prog, name)(m, data) for name in LOSSES + PER_EXAMPLE}
    assert_all_close(results)
    assert all(results["cpu"][name].shape == () for name in LOSSES)
    assert results["cpu"]["angle"].shape == (7,) and results["cpu"]["angle_c"].shape == (7, 4)


def test_a_step_takes_one_devices_gradients(programs: dict[str, Any]) -> None:
    """One step of Sgd with lr 1 from the same model: each param moves by its gradient, which only
    its own loss reaches (one param per loss, and `t`, the targets' projection, that several share)."""
    data = batch(seed=1)
    results = one_step_everywhere(programs, data)
    assert_all_close(results)
    assert all(bool(g.abs().sum() > 0) for g in results["cpu"][1].values())  # every loss has a gradient


def test_a_step_sends_what_the_table_says(programs: dict[str, Any]) -> None:
    """Each loss's sum and count (kl_div over the batch axis: each distribution's part), forward and
    backward, and the gradients: as the DeviceTable lists them."""
    prog = programs["cpu[0 1]"]
    m = prog.Net.init(seed=0)
    got, _ = recorded(prog, m, ss.sgd(m, lr=0.1), batch())
    assert got == expected(prog, "train_step", {"b": 7})
    values = sorted(values for (_, _, values, _, op), times in got.items() for _ in range(times) if op == "all-reduce")
    assert values.count(2) == 2 * 6 + 2 * 2  # six losses and two means, each forward and backward


@pytest.mark.parametrize("size", [1, 2])
def test_a_batch_smaller_than_the_devices_is_one_devices(programs: dict[str, Any], size: int) -> None:
    """A worker with an empty part adds a zero sum and a zero count (kl_div over the batch axis:
    zero partial sums), so the losses are the whole batch's."""
    data = batch(size, seed=2)
    data["keep"][:] = True  # a mask that holds nowhere is a mean of nothing, on every device count
    results = {}
    for devices, prog in programs.items():
        m = prog.Net.init(seed=0)
        results[devices] = {name: getattr(prog, name)(m, data) for name in LOSSES + PER_EXAMPLE}
    assert_all_close(results)
