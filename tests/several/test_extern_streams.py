"""A random extern fn on several devices: each worker draws from a stream of its own, keyed by the
program's seed (torch's seed in the controller as the workers load the program) and the worker, so
the workers' parts differ from each other, and a run repeats with the same seed."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import shapescript as ss

pytestmark = pytest.mark.slow

NOISE = textwrap.dedent("""\
    devices cpu[0 1]

    dim D = 3

    data Ex:
        x: [D]

    extern fn noisy(x: [b D]) -> [b D] = "extern_noise.noisy"

    fn f(batch: [b] Ex) -> [b D] = noisy(batch.x)
    """)

ROWS = 6  # 3 rows a worker on 2, 2 on 3: every worker has rows


def run(devices: str, seed: int, calls: int = 2) -> list[torch.Tensor]:
    """`calls` calls' results of a program loaded (and its workers started) with torch's seed `seed`."""
    with torch.random.fork_rng():  # this process's generator as it was, for the tests after these
        torch.manual_seed(seed)
        prog = ss.load(NOISE, devices=devices, name="noise.ss")
        try:
            return [prog.f({"x": torch.zeros(ROWS, 3)}) for _ in range(calls)]
        finally:
            prog.stop()


@pytest.fixture(scope="module", params=["cpu[0 1]", "cpu[0 1 2]"])
def runs(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[torch.Tensor], list[torch.Tensor]]]:
    devices = request.param
    yield devices, run(devices, 7), run(devices, 7)


def test_each_worker_draws_numbers_of_its_own(runs: Any) -> None:
    """Every column (torch's, Python's `random`, NumPy's) of every worker's part differs from every
    other worker's part of the same call: no two workers start from the same state."""
    devices, first, _ = runs
    workers = int(devices.count(" ")) + 1
    for result in first:
        parts = torch.split(result, ROWS // workers)
        for column, state in enumerate(("torch", "random", "numpy")):
            values = {tuple(part[:, column].tolist()) for part in parts}
            assert len(values) == workers, f"{state}: two workers drew the same numbers on {devices}"
    assert not torch.equal(first[0], first[1])  # the next call goes on with each worker's stream


def test_the_same_seed_draws_the_same_numbers_again(runs: Any) -> None:
    devices, first, again = runs
    for a, b in zip(first, again):
        assert torch.equal(a, b), devices


def test_another_seed_draws_other_numbers() -> None:
    one, other = run("cpu[0 1]", 7, calls=1)[0], run("cpu[0 1]", 8, calls=1)[0]
    assert not (one == other).any()
