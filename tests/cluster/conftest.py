"""The cluster tests: a Ray cluster of 2 simulated nodes on this machine's loopback, started once per
module. Skipped when Ray (`pip install 'shapescript[ray]'`) isn't installed."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

# Before Ray is imported (ray_constants reads it then): without it Ray puts its GCS on the machine's
# interface address, beyond the loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray", reason="Ray isn't installed: pip install 'shapescript[ray]'")

from shapescript.parallel import cluster as clusters  # noqa: E402

NODE = {"num_cpus": 2, "node_ip_address": "127.0.0.1", "include_dashboard": False,
        "object_store_memory": 80 * 1024 * 1024}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """Two nodes of 2 CPUs each, this process connected as the current cluster (ss.cluster). Ray's
    session folder is a short one of its own in /tmp, not pytest's tmp_path: Ray's Unix sockets live
    in it, and a socket's path may not exceed 107 bytes. Removed, with the cluster, afterwards."""
    from ray.cluster_utils import Cluster
    folder = tempfile.mkdtemp(prefix="ssray-", dir="/tmp")
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = folder
    cluster = Cluster(initialize_head=True, head_node_args=dict(NODE), shutdown_at_exit=False)
    try:
        cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        clusters.connect(cluster)
        yield cluster
    finally:
        clusters.disconnect()
        ray.shutdown()
        cluster.shutdown()
        if before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = before
        shutil.rmtree(folder, ignore_errors=True)
