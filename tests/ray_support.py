"""What the tests that run workers on a simulated Ray cluster share (tests/cluster, and the notebook's
tests/notebook/test_cluster_kernel.py): the cluster of 2 nodes on this machine's loopback (one, shared
by all of them: tests/conftest.py's `ray_cluster`), the README MLP trained on some devices, a
comparison of two runs, and a look at what of ours is left on the cluster. Importing it skips the test module when Ray isn't installed."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

# Before Ray is imported (ray_constants reads it then), here and in any process started from here (a
# kernel): without it Ray puts its GCS on the machine's interface address, beyond the loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray", reason="Ray isn't installed: pip install 'shapescript[ray]'")

from programs import README  # noqa: E402

import shapescript as ss  # noqa: E402
from shapescript.parallel import cluster as clusters  # noqa: E402
from shapescript.parallel.ray_workers import ACTOR_CLASS, GROUP_PREFIX  # noqa: E402

# A simulated node: on the loopback only, with CPUs of its own.
NODE = {"num_cpus": 2, "node_ip_address": "127.0.0.1", "include_dashboard": False,
        "object_store_memory": 80 * 1024 * 1024}


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
    """The live actors of our workers' class, and the placement groups not removed, as the cluster's
    GCS lists them. (`ray.util.state.list_actors` asks the dashboard, which needs `ray[default]` and
    which the simulated nodes don't start; the actors' table has no other public API, the placement
    groups' has: `ray.util.placement_group_table`.)"""
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

# A lost node (test_failures.py) is taken for dead after 3 failed checks a second apart (Ray's default:
# 5, 3 s apart), so that the tests after it don't wait for the cluster to notice.
HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


class SimulatedCluster:
    """Two nodes of 2 CPUs each, this process connected as the current cluster (ss.cluster), or as a
    plain Ray driver (`current=False`). Ray's
    session folder is a short one of its own in /tmp, not pytest's tmp_path: Ray's Unix sockets live
    in it, and a socket's path may not exceed 107 bytes. `stop` removes it with the cluster."""

    def __init__(self, current: bool = True) -> None:
        from ray.cluster_utils import Cluster
        self.folder = tempfile.mkdtemp(prefix="ssray-", dir="/tmp")
        self._tmpdir_before = os.environ.get("RAY_TMPDIR")
        os.environ["RAY_TMPDIR"] = self.folder
        self.cluster: Any = None
        try:
            self.cluster = Cluster(initialize_head=True, head_node_args={**NODE, "_system_config": HEALTH_CHECKS},
                                   shutdown_at_exit=False)
            self.cluster.add_node(**NODE)
            self.cluster.wait_for_nodes()
            if current:  # ss.cluster(it); else this process is a plain Ray driver connected to it, to look
                clusters.connect(self.cluster)
            else:
                ray.init(address=self.cluster.address)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Everything `__init__` started, ended; safe to call twice."""
        if self.folder is None:
            return
        clusters.disconnect()
        ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
        if self._tmpdir_before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = self._tmpdir_before
        # Now, and again as the test process exits: one of Ray's ending processes recreates its session
        # folder in it seconds after the cluster stops.
        shutil.rmtree(self.folder, ignore_errors=True)
        atexit.register(shutil.rmtree, self.folder, ignore_errors=True)
        self.folder = None
