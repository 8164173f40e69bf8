"""A program's workers as Ray actors (parallel/ray_workers.py), on a simulated cluster of 2 nodes on
this machine's loopback (tests/conftest.py): the same results as one device, nothing listening beyond the
loopback, nothing left on the cluster after a stop. Failures: test_failures.py."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import psutil
import pytest
import torch
from ray_support import assert_same, digit_batches, eventually_nothing_left, ours_on_the_cluster, train

from shapescript.parallel import cluster as clusters
from shapescript.parallel.handlers import listening_sockets

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.usefixtures("ray_cluster")

# As tests/cluster/test_client.py: the actors' messages and placement are what is new here, which a few
# steps show; tests/several/test_equivalence.py trains the README MLP 20 steps on local workers. (20 took 8 s
# of steps on two hosts.)
STEPS = 5


@dataclass
class OneHost:
    """The README MLP trained on one device and on cpu[0 1] on the cluster (losses and params), and
    what the cluster held and this machine's processes listened on while those workers ran."""

    reference: tuple[list[float], dict[str, torch.Tensor]]
    run: tuple[list[float], dict[str, torch.Tensor]]
    actors: int
    groups: int
    labels: list[str]
    workers: list[int]
    ray_processes: list[int]
    listening: dict[int, list[tuple[str, int]]]
    commands: dict[int, list[str]]


@pytest.fixture(scope="module")
def one_host() -> OneHost:
    """One program's workers on one host for the tests that look at them (a start of actors is 5-8 s
    of the 2 CPUs): looked at once the steps are done, then stopped (`train` ends with the stop)."""
    seen: dict[str, Any] = {}

    def look(pool: Any) -> None:
        actors, groups = ours_on_the_cluster()
        ray_processes = [p.pid for p in psutil.Process().children(recursive=True)]
        listening = {pid: listening_sockets(pid) for pid in {os.getpid(), *ray_processes}}
        seen.update(actors=len(actors), groups=len(groups), labels=[w.label for w in pool._workers],
                    workers=list(pool.pids), ray_processes=ray_processes, listening=listening,
                    commands={pid: command(pid) for pid, found in listening.items() if found})

    batches = digit_batches(STEPS, 64)  # as tests/several/test_equivalence.py: within 1e-5 on local workers too
    return OneHost(train("cpu", batches), train("cpu[0 1]", batches, look), **seen)


def command(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()[:2]
    except psutil.NoSuchProcess:
        return []


def test_readme_mlp_on_one_host_of_the_cluster_then_nothing_left(one_host: OneHost) -> None:
    assert one_host.actors == 2 and one_host.groups == 1  # what stop() must remove is there to see
    assert one_host.labels == ["cpu:0 at 127.0.0.1", "cpu:1 at 127.0.0.1"]
    assert_same(one_host.reference, one_host.run)
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


def test_nothing_listens_beyond_the_loopback(one_host: OneHost) -> None:
    """While a program runs (one_host's look): this process (the controller), its workers, and every
    process of Ray's (all descendants of this one, which started the simulated nodes)."""
    listening = one_host.listening
    assert set(one_host.workers) <= set(one_host.ray_processes)  # the actors are Ray's worker processes
    for pid in one_host.workers:  # Gloo's sockets, and worker 0's store: the look does see sockets
        assert listening[pid], f"worker process {pid} listens on nothing"
    beyond = {pid: [a for a in found if not loopback(a[0])] for pid, found in listening.items()}
    assert not {pid: found for pid, found in beyond.items() if found}, \
        {pid: one_host.commands[pid] for pid, found in beyond.items() if found}


def test_without_ray_a_typed_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(clusters.RayNotInstalledError, match=r"pip install 'shapescript\[ray\]'"):
        clusters.ray_module()
