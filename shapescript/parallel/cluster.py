"""The current cluster: where a program's workers run when it names one (`ss.cluster(...)`).

    ss.cluster("auto")                  # $RAY_ADDRESS, or a Ray cluster running on this machine
    ss.cluster("ray://head:10001")      # a Ray cluster's client address
    ss.cluster(ray.cluster_utils.Cluster(...))   # anything with `.address`: tests' simulated clusters
    ss.cluster(None)                    # back to this machine's own worker processes

While a cluster is current, every pool a program starts runs its workers as Ray actors
(parallel/ray_workers.py), whatever its devices line; without one, a devices line naming several
hosts is a ClusterNeededError. Ray is imported here, lazily, and nowhere at `import shapescript`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from shapescript.errors import WorkerError

INSTALL = "pip install 'shapescript[ray]'"


class RayNotInstalledError(WorkerError):
    """A cluster was asked for, and Ray, which runs the workers on one, isn't installed."""


@dataclass(frozen=True)
class Cluster:
    """The Ray cluster this process is connected to."""

    address: str  # as given: "auto", "ray://head:10001", or a GCS address "127.0.0.1:6379"
    local: bool  # every node is on this machine's loopback (a simulated cluster, or `ray start --node-ip-address 127.0.0.1`)
    we_connected: bool  # whether connect() called ray.init (and so disconnect() calls ray.shutdown)

    def __str__(self) -> str:
        return f"the Ray cluster at {self.address}"


_current: Cluster | None = None
_pools: weakref.WeakSet[Any] = weakref.WeakSet()  # the pools started on it, stopped by disconnect()
_shared_before: bool | None = None  # parallel/shared.py's switch before connect() turned it off


def ray_module() -> Any:
    """`ray`, imported now; a RayNotInstalledError saying how to install it otherwise."""
    try:
        import ray
    except ImportError as exc:
        raise RayNotInstalledError(
            f"running the workers on a cluster needs Ray, which isn't installed ({exc}): {INSTALL}") from None
    return ray


def address_of(target: object) -> str:
    """The address ray.init is given: "auto", "ray://...", "host:port", or an object's `.address`."""
    if isinstance(target, str):
        if not target.strip():
            raise ValueError("a cluster's address is \"auto\", \"ray://host:port\" or \"host:port\", not an empty string")
        return target.strip()
    address = getattr(target, "address", None)
    if isinstance(address, str) and address:
        return address
    raise TypeError(f"a cluster is an address (\"auto\", \"ray://host:port\") or an object with an `.address`, "
                    f"as ray.cluster_utils.Cluster, not {type(target).__name__}")


def connect(target: object) -> Cluster:
    """Make `target` the current cluster (see the module's docstring), connecting this process to it
    unless Ray is connected already (to that cluster). Pools started afterwards run on it."""
    global _current, _shared_before
    address = address_of(target)
    ray = ray_module()
    disconnect()
    we_connected = not ray.is_initialized()
    if we_connected:
        try:
            ray.init(address=address)  # "auto": $RAY_ADDRESS, or the cluster running on this machine
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise WorkerError(f"couldn't connect to the Ray cluster at {address}: {exc}") from None
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    local = bool(nodes) and all(str(n.get("NodeManagerAddress", "")).startswith("127.") for n in nodes)
    from shapescript.parallel import shared
    if _shared_before is None:
        # Batches go through the workers' connections: another host can't map this one's /dev/shm.
        _shared_before, shared.enabled = shared.enabled, False
    _current = Cluster(address, local, we_connected)
    return _current


def current() -> Cluster | None:
    """The current cluster, or None (the workers run on this machine)."""
    return _current


def track(pool: Any) -> None:
    """Remember a pool started on the current cluster, for disconnect() to stop."""
    _pools.add(pool)


def disconnect() -> None:
    """Stop the pools started on the current cluster, and forget it (disconnecting from Ray if
    connect() connected). Nothing happens without one."""
    global _current, _shared_before
    if _current is None:
        return
    for pool in list(_pools):
        pool.stop()
    _pools.clear()
    cluster, _current = _current, None
    from shapescript.parallel import shared
    if _shared_before is not None:
        shared.enabled, _shared_before = _shared_before, None
    if cluster.we_connected:
        ray_module().shutdown()
