"""Whether a call's big batch goes through shared memory is its pool's to say (WorkerPool.shares_memory,
parallel/shared.py): a pool of this machine's processes shares, one whose workers a launcher starts
elsewhere (Ray actors on a cluster) never does, and a cluster being current changes nothing for a
local pool. With Ray, tests/cluster/test_programs.py checks the same of real actors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import shapescript as ss
from shapescript.api import parse_devices
from shapescript.parallel import cluster as clusters
from shapescript.parallel import shared
from shapescript.parallel.pool import WorkerPool
from shapescript.parallel.remote import RemoteFunction, SplitCall

MLP = Path(__file__).resolve().parents[2] / "examples" / "readme" / "mlp.ss"
ROWS = 201  # 630 KB of images: over shared.THRESHOLD, in ragged shares (101, 100)
SIMULATED = clusters.Cluster("127.0.0.1:6379", local=True, we_connected=False)  # what ss.cluster(...) makes current


class ElsewhereLauncher:
    """A launcher as RayLauncher is one, never asked to start anything here."""

    def labels(self, devices: Any) -> list[str]:
        return [f"{devices.kind}:{i} elsewhere" for i in range(devices.count)]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's shared buffers in tmp_path, in an arena of the test's own."""
    monkeypatch.setattr(shared, "FOLDER", str(tmp_path))
    monkeypatch.setattr(shared, "_arena", shared._Arena())
    return tmp_path


def sent_rows(pool: WorkerPool, value: torch.Tensor) -> list[Any]:
    """What each worker is sent of `value`, an argument split along its axis 0 (RemoteFunction)."""
    split = RemoteFunction(lambda: None, SplitCall("`f` (f.ss:1:1)", (0,), 0), "f")
    messages = split._messages(pool, (value,))
    assert isinstance(messages, list) and len(messages) == pool.world
    kinds_and_values = [message[1][0] for message in messages]
    assert all(kind == "tensor" for kind, _ in kinds_and_values)
    return [sent for _, sent in kinds_and_values]


def test_a_local_pool_sends_shared_rows_and_a_pool_with_a_launcher_the_rows_themselves(
        folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clusters, "_current", SIMULATED)
    value = torch.randn(ROWS, 784, generator=torch.Generator().manual_seed(0))
    want = torch.split(value, [101, 100])
    local = WorkerPool(parse_devices("cpu[0 1]"))
    elsewhere = WorkerPool(parse_devices("cpu[0 1]"), launcher=ElsewhereLauncher())
    assert local.shares_memory and not elsewhere.shares_memory

    through_memory = sent_rows(local, value)
    assert all(isinstance(s, shared.SharedRows) for s in through_memory)
    for sent, rows in zip(through_memory, want):
        assert torch.equal(shared.arrive(sent, torch.device("cpu")), rows)

    whole = sent_rows(elsewhere, value)
    assert all(isinstance(s, torch.Tensor) for s in whole)
    for sent, rows in zip(whole, want):
        assert torch.equal(sent, rows)

    monkeypatch.setattr(shared, "enabled", False)  # $SHAPESCRIPT_SHARED_BATCHES=0: no pool shares
    assert not local.shares_memory
    assert all(isinstance(s, torch.Tensor) for s in sent_rows(local, value))


def train(prog: ss.Program, batches: list[dict[str, torch.Tensor]]) -> tuple[list[float], dict[str, torch.Tensor]]:
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-3)
    losses = [float(prog.train_step(m, opt, batch)) for batch in batches]
    return losses, {k: v.detach().clone() for k, v in m.state_dict().items()}


@pytest.mark.slow
def test_a_local_pool_keeps_sharing_while_a_cluster_is_current(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program's workers started before a cluster became current stay this machine's processes,
    and their big batches keep coming through shared memory; the training is one device's."""
    g = torch.Generator().manual_seed(1)
    batches = [{"img": torch.rand(ROWS, 784, generator=g), "label": torch.randint(0, 10, (ROWS,), generator=g)}
               for _ in range(3)]
    reference = train(ss.load(MLP, devices="cpu"), batches)
    prog = ss.load(MLP, devices="cpu[0 1]")
    try:
        pool = prog.workers()
        monkeypatch.setattr(clusters, "_current", SIMULATED)
        before = pool.call("shared_reads", ())
        losses, params = train(prog, batches)
        assert prog.pool is pool and pool._launcher is None
        assert [after - b for after, b in zip(pool.call("shared_reads", ()), before)] == [len(batches)] * 2
    finally:
        prog.stop()
    assert losses == pytest.approx(reference[0], abs=1e-5)
    for name, value in reference[1].items():
        torch.testing.assert_close(params[name], value, atol=1e-5, rtol=0)
