"""The current cluster: where a program's workers run when it names one (`ss.cluster(...)`).

    ss.cluster("auto")                  # $RAY_ADDRESS, or a Ray cluster running on this machine
    ss.cluster("ray://head:10001")      # a Ray cluster's client address
    ss.cluster(ray.cluster_utils.Cluster(...))   # anything with `.address`: tests' simulated clusters
    ss.cluster("auto", runtime_env={"py_modules": ["my_externs.py"]})   # modules the hosts lack
    ss.cluster(None)                    # back to this machine's own worker processes

While a cluster is current, every pool a program starts runs its workers as Ray actors
(parallel/ray_workers.py), whatever its devices line; without one, a devices line naming several
hosts is a ClusterNeededError. Pools already running stay as they are, shared-memory batches
included: each pool says whether it shares memory (WorkerPool.shares_memory), not this module.
Ray is imported here, lazily, and nowhere at `import shapescript`.
"""

from __future__ import annotations

import os
import re
import socket
import weakref
from dataclasses import dataclass
from typing import Any

from shapescript.errors import WorkerError

INSTALL = "pip install 'shapescript[ray]'"
# host:port, or ray://host:port; a host is a name, an IPv4 address or a bracketed IPv6 one.
ADDRESS = re.compile(r"(?P<client>ray://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})")
PROBE_TIMEOUT = 5.0  # seconds for a cluster's port to accept a connection


class RayNotInstalledError(WorkerError):
    """A cluster was asked for, and Ray, which runs the workers on one, isn't installed."""


@dataclass(frozen=True)
class Cluster:
    """The Ray cluster this process is connected to."""

    address: str  # as given: "auto", "ray://head:10001", or a GCS address "127.0.0.1:6379"
    local: bool  # every node is on this machine's loopback (a simulated cluster, or `ray start --node-ip-address 127.0.0.1`)
    we_connected: bool  # whether connect() called ray.init (and so disconnect() calls ray.shutdown)
    # Connected through Ray Client (ray://): this process may be beyond the workers' reach (a laptop),
    # so their messages go through Ray itself (parallel/ray_relay.py) rather than a socket to it.
    relayed: bool = False

    def __str__(self) -> str:
        return f"the Ray cluster at {self.address}"


_current: Cluster | None = None
_pools: weakref.WeakSet[Any] = weakref.WeakSet()  # the pools started on it, stopped by disconnect()


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


def unreachable(address: str) -> str | None:
    """Why nothing answers at `address`'s port (for `auto`, $RAY_ADDRESS's), or None if something does
    (or there is no port to try: `auto` finds a cluster of this machine itself, at once). Tried with
    a plain TCP connection before ray.init, which waits minutes for a cluster that isn't there."""
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "").strip()
    match = ADDRESS.fullmatch(address)
    if match is None:
        return None
    host, port = match["host"].strip("[]"), int(match["port"])
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT):
            return None
    except OSError as exc:
        return f"nothing answers at {host}:{port} ({exc.strerror or exc or 'no answer'})"


def connect(target: object, runtime_env: dict[str, Any] | None = None) -> Cluster:
    """Make `target` the current cluster (see the module's docstring), connecting this process to it
    unless Ray is connected already (to that cluster). Pools started afterwards run on it.

    `runtime_env` is Ray's (https://docs.ray.io/en/latest/ray-core/handling-dependencies.html), for
    the job this process becomes: `{"py_modules": [...]}` ships the controller's own modules (extern
    fns' modules, datasets' classes) to every host. Ray takes it only as this process connects: with
    Ray connected by someone else (a `ray.init` of the user's), it is a ValueError; a cluster that
    connect() connected is disconnected first, and connected again with it."""
    global _current
    address = address_of(target)
    ray = ray_module()
    ours = _current is not None and _current.we_connected  # disconnect() below ends Ray's connection
    if runtime_env is not None and ray.is_initialized() and not ours:
        raise ValueError(
            "Ray is connected already, and takes a runtime_env only as a process connects: give it to "
            "ss.cluster(address, runtime_env=...) before anything calls ray.init, or to that ray.init")
    disconnect()
    we_connected = not ray.is_initialized()
    if we_connected:
        why = unreachable(address)
        if why is not None:
            raise WorkerError(f"couldn't connect to the Ray cluster at {address}: {why}")
        try:
            # "auto": $RAY_ADDRESS, or the cluster running on this machine
            ray.init(address=address, **({"runtime_env": runtime_env} if runtime_env is not None else {}))
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise WorkerError(f"couldn't connect to the Ray cluster at {address}: {exc}") from None
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    local = bool(nodes) and all(str(n.get("NodeManagerAddress", "")).startswith("127.") for n in nodes)
    _current = Cluster(address, local, we_connected, relayed=ray.util.client.ray.is_connected())
    return _current


def missing_module_help(module: str, worker: str) -> str:
    """What a worker on a cluster says of a module it can't import (an extern fn's): the workers
    import the controller's modules on their own hosts, so the module must be shipped or installed."""
    top = module.split(".")[0]
    return (f"the module `{module}` can't be imported on {worker}: a worker on a cluster imports the "
            f"controller's modules on its own host. Ship them with the connection to the cluster, "
            f"`ss.cluster(address, runtime_env={{\"py_modules\": [\"path/to/{top}\"]}})` (a package's folder, "
            f"or a module's .py file; given before Ray connects), or install `{top}` on every host")


def current() -> Cluster | None:
    """The current cluster, or None (the workers run on this machine)."""
    return _current


def track(pool: Any) -> None:
    """Remember a pool started on the current cluster, for disconnect() to stop."""
    _pools.add(pool)


def disconnect() -> None:
    """Stop the pools started on the current cluster, and forget it (disconnecting from Ray if
    connect() connected). Nothing happens without one."""
    global _current
    if _current is None:
        return
    for pool in list(_pools):
        pool.stop()
    _pools.clear()
    cluster, _current = _current, None
    if cluster.we_connected:
        ray_module().shutdown()
