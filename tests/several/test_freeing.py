"""What the workers hold follows the controller's handles: a model, an optimizer or a dataset is
freed on the workers once its last holder in Python is gone (with the pool's next call), so that
hours of notebook work don't grow the workers."""

from __future__ import annotations

import gc
import os
import weakref

import psutil
import pytest
import torch
from programs import LINEAR
from support import param_and_adamw_bytes

import shapescript as ss
from shapescript.notebook.workers import status_table


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


def rss(pids: list[int]) -> list[int]:
    return [psutil.Process(p).memory_info().rss for p in pids]


@pytest.mark.slow
def test_twenty_rounds_of_new_models_and_datasets_leave_the_workers_and_the_kernel_as_they_were() -> None:
    """Each round makes a model, an optimizer and a 9 MiB dataset and trains; the workers' and this
    process's (the controller's, a notebook's kernel) memory (RSS) must grow by less than four
    rounds' datasets (20 rounds would keep 180 MiB in each; a worker that kept its last four loops'
    datasets after they were freed grew by 56 MiB; the allocator's own slack is a few MiB), and
    `%shapescript status` lists what the live variables hold, and nothing else."""
    prog = ss.load(LINEAR.replace("batches(8)", "batches(20000)"), devices="cpu[0 1]", name="fit.ss")
    try:
        live = prog.Lin.init(seed=100)  # held all along: status must still list these
        live_opt = ss.adamw(live, lr=0.1)
        live_data = dataset(40, 100)
        prog.fit(live, live_opt, live_data, ss.sinks.memory())

        def round_(k: int) -> weakref.ref[ss.TensorDataset]:
            m = prog.Lin.init(seed=k)
            data = dataset(ROWS, k)
            prog.fit(m, ss.adamw(m, lr=0.1), data, ss.sinks.memory())
            return weakref.ref(data)

        for k in range(3):  # warm up: allocator pools, loaded code
            round_(k)
        gc.collect()
        pids = [os.getpid(), *prog.workers().pids]
        before = rss(pids)
        sent = []
        for k in range(3, 23):
            sent.append(round_(k))
            gc.collect()
        after = rss(pids)
        assert all(ref() is None for ref in sent), "the controller still holds a dataset it sent"
        growth = [a - b for a, b in zip(after, before)]
        one_round = sum(t.numel() * t.element_size() for t in dataset(ROWS, 0).fields.values())
        assert max(growth) < 4 * one_round, f"grew by {[round(g / 2**20) for g in growth]} MiB " \
                                                 f"(this process, then each worker) over 20 rounds"
        assert [sorted(h.values()) for h in held(prog)] == [["AdamW[Lin] optimizer", "Lin model",
                                                              "dataset TensorDataset"]] * 2

        status = status_table(prog, {"live": live, "live_opt": live_opt, "live_data": live_data}).text
        params, state = param_and_adamw_bytes([(4, 3)])  # Lin's w, and AdamW's state for it
        rows = sum(t.numel() * t.element_size() for t in live_data.fields.values())
        assert (f"Every worker holds: live (Lin model, {params} bytes per device), live_opt (AdamW[Lin] "
                f"optimizer, {state} bytes per device), live_data (dataset TensorDataset, {rows} bytes per "
                f"device).") in status, status
        assert prog.workers().released_pending == 0
    finally:
        prog.stop()
