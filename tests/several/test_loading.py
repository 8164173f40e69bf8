"""The workers make each loop's order from the shuffles' seeds and load their own parts, ahead of
the step: the parts they load are the controller's batches, split as calls split them."""

from __future__ import annotations

import types

import pytest
import torch
from test_remote import PROGRAM

import shapescript as ss
from shapescript.parallel.loading import WorkerLoop
from shapescript.runtime.data import DataSpec
from shapescript.runtime.loops import batches, shuffle


def _spec() -> DataSpec:
    return ss.load(PROGRAM, devices="cpu", name="fit.ss").Ex


@pytest.mark.parametrize("world", [1, 2, 3])
def test_each_worker_loads_its_part_of_the_controllers_batches(world: int) -> None:
    spec = _spec()
    data = ss.TensorDataset(x=torch.arange(23 * 4.0).reshape(23, 4), y=torch.arange(23) % 3)
    looped = batches(shuffle(shuffle(data, 3), 9), 8, spec)  # two shuffles: their orders compose
    expected = [data.__getitems__(ix)["x"] for ix in looped.indices()]
    loops = [WorkerLoop(types.SimpleNamespace(rank=r, world=world, device=torch.device("cpu")),
                        data, looped.seeds, 8, spec) for r in range(world)]
    for number, whole in enumerate(expected):
        parts = [loop.take(number, *loop.my_share(number)) for loop in loops]
        assert torch.equal(torch.cat([p.x for p in parts]), whole)
        if number == 0:  # the next two batches are already loading
            assert set(loops[0].ahead) == {1, 2}
    assert [loop.my_share(2)[1] for loop in loops] == {1: [7], 2: [4, 3], 3: [3, 2, 2]}[world]


@pytest.mark.slow
def test_items_loaded_by_the_workers_train_as_on_one_device() -> None:
    from sample_data import Rows  # a module the workers import, so the dataset is sent to them

    losses = {}
    for devices in ("cpu", "cpu[0 1]", "cpu[0 1 2]"):
        prog = ss.load(PROGRAM, devices=devices, name="fit.ss")
        try:
            m = prog.Lin.init(seed=0)
            sink = ss.sinks.memory()
            for _ in range(3):  # three epochs, each a new loop of 21 items: batches of 8, 8 and 5
                prog.fit(m, ss.adamw(m, lr=0.1), Rows(21), sink)
            losses[devices] = torch.tensor([r["loss"] for r in sink.records])
        finally:
            prog.stop()
    assert len(losses["cpu"]) == 9
    torch.testing.assert_close(losses["cpu[0 1]"], losses["cpu"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses["cpu[0 1 2]"], losses["cpu"], rtol=1e-5, atol=1e-6)
