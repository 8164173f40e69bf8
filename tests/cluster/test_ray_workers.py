"""A program's workers as Ray actors (parallel/ray_workers.py), on a simulated cluster of 2 nodes on
this machine's loopback (tests/conftest.py): the same results as one device, nothing listening beyond the
loopback, nothing left on the cluster after a stop. Failures: test_failures.py."""

from __future__ import annotations

import os
import sys
from typing import Any

import psutil
import pytest
from programs import README
from ray_support import assert_same, digit_batches, eventually_nothing_left, ours_on_the_cluster, train

import shapescript as ss
from shapescript.parallel import cluster as clusters
from shapescript.parallel.handlers import listening_sockets

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.usefixtures("ray_cluster")

STEPS = 20


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


def test_without_ray_a_typed_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(clusters.RayNotInstalledError, match=r"pip install 'shapescript\[ray\]'"):
        clusters.ray_module()
