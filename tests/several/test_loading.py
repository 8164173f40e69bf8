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


class _Pool:
    """What Datasets.handle uses of a pool: each call's message made as the pool makes it (once
    for every worker), then read back as a worker reads it."""

    def __init__(self) -> None:
        self.received: list[tuple] = []

    def call(self, handler: str, args: tuple, where: str = "") -> list:
        import pickle

        from shapescript.parallel.messages import Call, message_from, wire
        from shapescript.parallel.worker import dumps

        message = message_from(pickle.loads(dumps(wire(Call(handler, where, tuple(args))))))
        self.received.append((message.handler, *message.args))
        return [None]

    def release(self, handle: int) -> None:
        pass


def test_a_dataset_is_pickled_once_each_time_it_is_sent() -> None:
    from sample_data import CountedRows

    from shapescript.parallel.loading import Datasets

    datasets, pool, spec = Datasets(), _Pool(), types.SimpleNamespace(name="Ex")
    data = CountedRows(5)
    CountedRows.PICKLED = 0
    handle = datasets.handle(pool, data, spec)
    assert CountedRows.PICKLED == 1  # once: no second pickling to see whether it can be sent
    (name, sent_handle, arrived, spec_name), = pool.received
    assert (name, sent_handle, spec_name) == ("keep_dataset", handle, "Ex")
    assert type(arrived) is CountedRows and arrived is not data and arrived.n == 5  # as a worker gets it
    assert datasets.handle(pool, data, spec) == handle and CountedRows.PICKLED == 1  # kept: not sent again
    data.n = 7  # its length changed: sent anew, pickled once more
    assert datasets.handle(pool, data, spec) != handle and CountedRows.PICKLED == 2
    assert len(pool.received) == 2


@pytest.mark.slow
def test_a_dataset_sent_to_real_workers_is_pickled_once() -> None:
    from sample_data import CountedRows

    prog = ss.load(PROGRAM, devices="cpu[0 1]", name="fit.ss")
    try:
        m = prog.Lin.init(seed=0)
        data = CountedRows(21)
        CountedRows.PICKLED = 0
        for _ in range(2):  # sent with the first loop, kept for the second
            prog.fit(m, ss.adamw(m, lr=0.1), data, ss.sinks.memory())
        assert CountedRows.PICKLED == 1
    finally:
        prog.stop()


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
