"""A program's workers as Ray actors (parallel/ray_workers.py), on a simulated cluster of 2 nodes on
this machine's loopback (conftest.py): the same results as one device, nothing listening beyond the
loopback, nothing left on the cluster after a stop, and a killed worker reported at once."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest
import torch

import shapescript as ss
from programs import README
from shapescript.errors import WorkerError
from shapescript.parallel import cluster as clusters
from shapescript.parallel.handlers import listening_sockets
from shapescript.parallel.ray_workers import ACTOR_CLASS, GROUP_PREFIX

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.usefixtures("ray_cluster")

STEPS = 20


def digit_batches(n: int, rows: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{"img": torch.randn(rows, 784, generator=g), "label": torch.randint(0, 10, (rows,), generator=g)}
            for _ in range(n)]


def train(devices: str, batches: list[dict[str, torch.Tensor]],
          inspect: Callable[[Any], None] = lambda pool: None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The README MLP's losses and final params after a train_step on each batch; `inspect` is given
    the worker pool (on several devices) before it stops."""
    prog = ss.load(README, devices=devices, name="mlp.ss")
    try:
        m = prog.Mlp.init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        losses = [float(prog.train_step(m, opt, b)) for b in batches]
        if prog.several:
            assert prog.pool is not None and prog.pool._launcher is not None, "the workers didn't run on the cluster"
            inspect(prog.pool)
        return losses, m.state_dict()
    finally:
        prog.stop()


def assert_same(reference: tuple[list[float], dict[str, torch.Tensor]],
                other: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    assert other[0] == pytest.approx(reference[0], abs=1e-5)
    assert set(other[1]) == set(reference[1])
    for name, value in reference[1].items():
        torch.testing.assert_close(other[1][name], value, atol=1e-5, rtol=0, msg=lambda text: f"{name}: {text}")


def ours_on_the_cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The live actors of our workers' class, and the placement groups not removed."""
    actors = [a for a in ray._private.state.actors().values()
              if a["ActorClassName"].endswith(ACTOR_CLASS) and a["State"] != "DEAD"]
    groups = [g for g in ray.util.placement_group_table().values()
              if g["name"].startswith(GROUP_PREFIX) and g["state"] != "REMOVED"]
    return actors, groups


def eventually_nothing_left(seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while any(ours_on_the_cluster()) and time.monotonic() < deadline:
        time.sleep(0.2)
    actors, groups = ours_on_the_cluster()
    assert not actors, f"actors left on the cluster: {actors}"
    assert not groups, f"placement groups left on the cluster: {groups}"


def test_readme_mlp_on_one_host_of_the_cluster_then_nothing_left() -> None:
    def on_the_cluster(pool: Any) -> None:
        actors, groups = ours_on_the_cluster()
        assert len(actors) == 2 and len(groups) == 1  # what stop() must remove is there to see
        assert [w.label for w in pool._workers] == ["cpu:0 at 127.0.0.1", "cpu:1 at 127.0.0.1"]

    batches = digit_batches(STEPS, 64)  # as tests/several/test_equivalence.py: within 1e-5 on local workers too
    assert_same(train("cpu", batches), train("cpu[0 1]", batches, on_the_cluster))
    eventually_nothing_left()


def test_readme_mlp_on_two_hosts() -> None:
    """4 workers, 2 on each simulated node: the placement group spreads the hosts over the nodes."""
    def two_nodes(pool: Any) -> None:
        nodes = [w.proc.node_id for w in pool._workers]
        assert set(nodes) <= {n["NodeID"] for n in ray.nodes()}
        assert nodes[0] == nodes[1] and nodes[2] == nodes[3] and nodes[0] != nodes[2], nodes
        assert [w.label.split(" at ")[0] for w in pool._workers] == [
            "cpu:0 on host 0", "cpu:1 on host 0", "cpu:0 on host 1", "cpu:1 on host 1"]

    batches = digit_batches(STEPS, 64)
    assert_same(train("cpu", batches), train("2 x cpu[0 1]", batches, two_nodes))
    eventually_nothing_left()


def loopback(address: str) -> bool:
    return address.removeprefix("::ffff:").startswith("127.") or address == "::1"  # IPv4 in IPv6 too


def test_nothing_listens_beyond_the_loopback() -> None:
    """While a program runs: this process (the controller), its workers, and every process of Ray's
    (all descendants of this one, which started the simulated nodes)."""
    prog = ss.load(README, devices="cpu[0 1]", name="mlp.ss")
    try:
        m = prog.Mlp.init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        prog.train_step(m, opt, digit_batches(1, 8)[0])
        workers = prog.pool.pids
        ray_processes = [p.pid for p in psutil.Process().children(recursive=True)]
        assert set(workers) <= set(ray_processes)  # the actors are Ray's worker processes
        listening = {pid: listening_sockets(pid) for pid in {os.getpid(), *ray_processes}}
        for pid in workers:  # Gloo's sockets, and worker 0's store: the look does see sockets
            assert listening[pid], f"worker process {pid} listens on nothing"
        beyond = {pid: [a for a in found if not loopback(a[0])] for pid, found in listening.items()}
        assert not {pid: found for pid, found in beyond.items() if found}, \
            {pid: psutil.Process(pid).cmdline()[:2] for pid, found in beyond.items() if found}
    finally:
        prog.stop()


def test_a_killed_worker_is_reported_at_once() -> None:
    prog = ss.load(README, devices="cpu[0 1]", name="mlp.ss")
    batch = digit_batches(1, 8)[0]
    try:
        m = prog.Mlp.init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        prog.train_step(m, opt, batch)
        os.kill(prog.pool.pids[1], signal.SIGKILL)
        began = time.monotonic()
        with pytest.raises(WorkerError) as caught:
            prog.train_step(m, opt, batch)
        assert time.monotonic() - began < 10
        message = str(caught.value)
        assert "worker 1 (cpu:1 at 127.0.0.1)" in message and "actor" in message.lower(), message
    finally:
        prog.stop()
    eventually_nothing_left()
    assert_same(train("cpu", [batch]), train("cpu[0 1]", [batch]))  # and a new program runs


def test_without_ray_a_typed_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(clusters.RayNotInstalledError, match=r"pip install 'shapescript\[ray\]'"):
        clusters.ray_module()
