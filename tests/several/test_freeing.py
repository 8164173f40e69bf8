"""What the workers hold follows the controller's handles: a model, an optimizer or a dataset is
freed on the workers once its last holder in Python is gone (with the pool's next call), so that
hours of notebook work don't grow the workers."""

from __future__ import annotations

import gc

import psutil
import pytest
import torch

import shapescript as ss
from support import LINEAR


def held(prog: ss.Program) -> list[dict]:
    """What each worker holds, by handle (the `objects` handler, as `%shapescript status` asks)."""
    return [reply["objects"] for reply in prog.workers().call("objects", ())]


def dataset(n: int, seed: int) -> ss.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return ss.TensorDataset(x=torch.randn(n, 4, generator=g), y=torch.randint(0, 3, (n,), generator=g))


@pytest.mark.slow
def test_a_handle_that_goes_frees_its_object_on_every_worker() -> None:
    prog = ss.load(LINEAR, devices="cpu[0 1]", name="fit.ss")
    try:
        keep = prog.Lin.init(seed=1)
        m = prog.Lin.init(seed=0)
        opt = ss.adamw(m, lr=0.1)
        data = dataset(40, 0)
        prog.fit(m, opt, data, ss.sinks.memory())
        kinds = sorted(held(prog)[0].values())
        assert len(held(prog)[0]) == 4 and sum("dataset" in k for k in kinds) == 1, kinds
        handles = {m._handle, opt._handle, keep._handle}
        assert handles <= set(held(prog)[0]) and held(prog)[0] == held(prog)[1]
        del opt  # the optimizer holds the model on the workers: the model's handle goes first, the
        gc.collect()  # model itself when the optimizer goes too
        assert len(held(prog)[0]) == 3
        del m, data
        gc.collect()
        assert [set(h) for h in held(prog)] == [{keep._handle}] * 2
        assert torch.equal(keep.w, prog.Lin.init(seed=1).w)  # what is held still works
    finally:
        prog.stop()


ROWS = 400_000  # x: 4 f32, y: one i64 a row: 9.2 MiB a dataset


@pytest.mark.slow
def test_twenty_rounds_of_new_models_and_datasets_leave_the_workers_as_they_were() -> None:
    """Each round makes a model, an optimizer and a 9 MiB dataset and trains; the workers' memory
    (RSS) must grow by much less than the rounds' datasets (20 rounds would keep 180 MiB on each
    worker; the allocator's own slack is a few tens of MiB)."""
    prog = ss.load(LINEAR.replace("batches(8)", "batches(20000)"), devices="cpu[0 1]", name="fit.ss")
    try:
        def round_(k: int) -> None:
            m = prog.Lin.init(seed=k)
            prog.fit(m, ss.adamw(m, lr=0.1), dataset(ROWS, k), ss.sinks.memory())

        for k in range(3):  # warm up: allocator pools, loaded code
            round_(k)
        gc.collect()
        pids = prog.workers().pids
        before = [psutil.Process(p).memory_info().rss for p in pids]
        for k in range(3, 23):
            round_(k)
            gc.collect()
        after = [psutil.Process(p).memory_info().rss for p in pids]
        assert all(h == {} for h in held(prog)), held(prog)
        growth = max(a - b for a, b in zip(after, before))
        one_round = sum(t.numel() * t.element_size() for t in dataset(ROWS, 0).fields.values())
        assert growth < 20 * one_round / 3, f"the workers grew by {growth / 2**20:.0f} MiB over 20 rounds"
        assert prog.workers().released_pending == 0
    finally:
        prog.stop()
