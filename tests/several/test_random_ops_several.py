"""The random ops on several devices: `cpu[0 1]` and `cpu[0 1 2]` draw for each example exactly what
`cpu` draws (the batch axis first or last in the value, a part of 3, 2 or 0 examples a device), a
mode passed from Python goes on alike, and training with noise gives one device's params; under
`split H` and `shard params` too. One program per device count, loaded once, shared by the tests."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from every_layout import loaded_everywhere

import shapescript as ss

pytestmark = pytest.mark.slow

SOURCE = textwrap.dedent("""\
    dim D = 3
    dim H = 6
    dim V = 5

    data Ex:
        x: [D]
        probs: [V]
        y: [] Index[V]

    model Net:
        param w: [D H] = normal(std=0.5)
        param v: [H V] = normal(std=0.5)

    fn normals(batch: [b] Ex, mode: Mode) -> [b D] = random_normal(batch.x, mode, mean=1.0, std=2.0)
    fn uniforms(batch: [b] Ex, mode: Mode) -> [D b] = random_uniform(rearrange(batch.x, b d -> d b), mode, low=-1.0, high=3.0)
    fn coins(batch: [b] Ex, mode: Mode) -> [b V] bool = bernoulli(batch.probs, mode)
    fn ints(batch: [b] Ex, mode: Mode) -> [b D] i64 = randint(batch.x, mode, low=-3, high=7)
    fn picks(batch: [b] Ex, mode: Mode) -> [b] Index[V] = categorical(batch.probs, mode, over=V)
    fn fresh(batch: [b] Ex) -> [b D] = random_normal(batch.x, Train(seed=3))
    fn head_noise(m: Net, batch: [b] Ex, mode: Mode) -> [b H] = random_normal(batch.x @ m.w, mode, std=0.1)
    fn head_picks(m: Net, batch: [b] Ex, mode: Mode) -> [b] Index[H] = categorical(softmax(batch.x @ m.w, over=H), mode, over=H)

    fn loss(m: Net, batch: [b] Ex, mode: Mode) -> []:
        h = batch.x @ m.w
        h = relu(h + random_normal(h, mode, std=0.3)) * to(bernoulli(sigmoid(h), mode), f32)
        return cross_entropy(h @ m.v, batch.y, over=V)

    fn train_step(mut m: Net, mut opt: AdamW[Net], batch: [b] Ex, mode: Mode) -> []:
        l, g = value_and_grad(loss, m, batch, mode)
        update(mut m, mut opt, g)
        return l
    """)
@pytest.fixture(scope="module")
def programs() -> Iterator[dict[str, Any]]:
    yield from loaded_everywhere(SOURCE, "draws.ss", with_options="cpu[0 1 2]")


def batch(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 3, generator=g), "probs": torch.rand(n, 5, generator=g),
            "y": torch.randint(0, 5, (n,), generator=g)}


def draws(prog: Any) -> list[Any]:
    """Every op's draws for a batch of 7 (3/2/2 on three devices) and one of 2 (the third empty),
    with one mode across the calls; then the mode's count and a mode made in the program."""
    mode, m = ss.Train(seed=11), prog.Net.init(seed=0)
    out: list[Any] = []
    for b in (batch(7, 1), batch(2, 2)):
        out += [prog.normals(b, mode), prog.uniforms(b, mode), prog.coins(b, mode), prog.ints(b, mode),
                prog.picks(b, mode), prog.head_picks(m, b, mode)]
    return out + [mode.draws, prog.fresh(batch(7, 1))]


def test_every_device_count_and_layout_draws_one_devices_numbers(programs: dict[str, Any]) -> None:
    results = {name: draws(prog) for name, prog in programs.items()}
    reference = results["cpu"]
    assert reference[-2] == 12
    for name, got in results.items():
        for k, (a, b) in enumerate(zip(got, reference)):
            assert (a == b) if isinstance(a, int) else torch.equal(a, b), (name, k)


def test_noise_along_h_is_one_devices(programs: dict[str, Any]) -> None:
    def noise(prog: Any) -> torch.Tensor:
        return prog.head_noise(prog.Net.init(seed=0), batch(7, 1), ss.Train(seed=4))

    reference = noise(programs["cpu"])
    for name, prog in programs.items():
        torch.testing.assert_close(noise(prog), reference, atol=0, rtol=0, msg=lambda m: f"{name}: {m}")


def test_training_with_noise_gives_one_devices_params(programs: dict[str, Any]) -> None:
    def train(prog: Any) -> tuple[list[float], dict[str, torch.Tensor], int]:
        m, mode = prog.Net.init(seed=0), ss.Train(seed=7)
        opt = ss.adamw(m, lr=0.05)
        losses = [float(prog.train_step(m, opt, batch(n, 10 + k), mode)) for k, n in enumerate([7, 7, 2, 5, 7])]
        return losses, dict(m.state_dict()), mode.draws

    results = {name: train(prog) for name, prog in programs.items()}
    losses, state, count = results["cpu"]
    assert count == 10  # two draws a step
    for name, (got_losses, got_state, got_count) in results.items():
        assert got_losses == pytest.approx(losses, abs=1e-5) and got_count == count, name
        for key in state:
            torch.testing.assert_close(got_state[key], state[key], atol=1e-5, rtol=0, msg=lambda m: f"{name} {key}: {m}")
