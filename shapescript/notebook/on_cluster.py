"""`%shapescript cluster ...`: the notebook's workers on a Ray cluster (docs/cluster.md), or back here.

    %shapescript cluster ray://head:10001   connect (also `auto`, or the head's GCS address host:port)
    %shapescript cluster                    the current cluster: its nodes, their resources, alive or not
    %shapescript cluster off                back to this machine's worker processes

Connecting or leaving moves the program's running workers as `%shapescript devices` does: they stop,
saying what goes with them, and new ones start in the background where workers now start. Every
mistake a user can make (a misspelt address, nothing answering there, no Ray) is a one-line error,
found before anything stops where it can be: an address with a port is tried with a plain TCP
connection first, since ray.init waits minutes for a GCS that isn't there.
"""

from __future__ import annotations

from typing import Any

from ..api import cluster as use_cluster
from ..errors import ShapeScriptError
from ..parallel import cluster as clusters
from .report import NotebookError, Rich, render_rows
from .session import Discard, Session

FORMS = "`auto`, `ray://host:port` (Ray Client) or `host:port` (the head's GCS address)"
_NOT_RESOURCES = ("node:", "accelerator_type:")  # Ray's bookkeeping entries among a node's resources


class AddressError(ValueError):
    """Not a cluster's address: the magic says it as a usage error."""


def check_address(text: str) -> None:
    """An AddressError unless `text` is `auto`, `host:port` or `ray://host:port`."""
    match = clusters.ADDRESS.fullmatch(text)
    if text != "auto" and (match is None or not 0 < int(match["port"]) < 65536):
        raise AddressError(f"%shapescript cluster: {text!r} isn't a cluster's address; an address is {FORMS}")


def connect(session: Session, address: str, discard: bool = False) -> list[str]:
    """`%shapescript cluster ADDRESS`: connect, then move the running workers there. Raises
    AddressError for a bad spelling, NotebookError when Ray is missing or the cluster can't be
    reached, or (changing nothing) when the workers hold models and `discard` is False; the workers
    stop only once the address is known to answer."""
    check_address(address)
    try:
        clusters.ray_module()  # a RayNotInstalledError says how to install it
    except ShapeScriptError as exc:
        raise NotebookError(str(exc)) from None
    why = clusters.unreachable(address)
    if why is not None:
        raise NotebookError(f"couldn't connect to the Ray cluster at {address}: {why}. Is it running there? "
                            f"(`ray status` on its head says)")
    notes = session.stop_workers(f"the workers move to the Ray cluster at {address}",
                                 Discard(discard, f"`%shapescript cluster {address} --discard`"))
    try:
        use_cluster(address)
    except ShapeScriptError as exc:  # WorkerError: ray.init refused it
        raise NotebookError("\n".join([*notes, str(exc)])) from None
    except OSError as exc:  # anything else of Ray's connection, in the words of its own message
        raise NotebookError("\n".join([*notes, f"couldn't connect to the Ray cluster at {address}: {exc}"])) from None
    nodes = [n for n in _nodes() if n.get("Alive")]
    cpus = sum(n.get("Resources", {}).get("CPU", 0) for n in nodes)
    gpus = sum(n.get("Resources", {}).get("GPU", 0) for n in nodes)
    said = (f"Connected to the Ray cluster at {address} ({len(nodes)} node{'s' * (len(nodes) != 1)} alive, "
            f"{cpus:g} CPUs, {gpus:g} GPUs): the program's workers run there from now on.")
    return [*notes, said, *session.start_workers(session.program)]


def disconnect(session: Session, discard: bool = False) -> list[str]:
    """`%shapescript cluster off`: stop the workers on the cluster, then run them on this machine."""
    on = clusters.current()
    if on is None:
        return ["No cluster: the workers already run on this machine."]
    notes = session.stop_workers("back to this machine's workers", Discard(discard, "`%shapescript cluster off --discard`"))
    use_cluster(None)
    return [*notes, f"Disconnected from {on}: the workers run on this machine again.",
            *session.start_workers(session.program)]


def view() -> Rich:
    """`%shapescript cluster`: the current cluster's nodes, their resources and whether they're alive."""
    on = clusters.current()
    if on is None:
        return render_rows("ShapeScript: no cluster; the workers run on this machine", [], [],
                           [f"%shapescript cluster ADDRESS connects to one: {FORMS}."])
    try:
        nodes = _nodes()
    except Exception as exc:  # Ray's own errors, whichever they are: its GCS gone, for one
        raise NotebookError(f"couldn't ask {on} for its nodes: {exc}") from None
    rows = [[str(n.get("NodeID", "?"))[:8], str(n.get("NodeManagerAddress", "?")),
             "head" if "node:__internal_head__" in n.get("Resources", {}) else "",
             "alive" if n.get("Alive") else "dead", _resources(n.get("Resources", {}))] for n in nodes]
    alive = sum(1 for n in nodes if n.get("Alive"))
    return render_rows(f"ShapeScript's workers run on {on}: {alive} of {len(nodes)} nodes alive",
                       ["node", "address", "", "state", "resources"], rows,
                       ["%shapescript cluster off: back to this machine's workers."])


def _nodes() -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = clusters.ray_module().nodes()
    return nodes


def _resources(resources: dict[str, float]) -> str:
    """`CPU 2, memory 1.5 GiB, object_store_memory 80 MiB`: a node's resources as a person reads them."""
    said = []
    for name, amount in sorted(resources.items(), key=lambda item: (item[0] not in ("CPU", "GPU"), item[0])):
        if name.startswith(_NOT_RESOURCES):
            continue
        said.append(f"{name} {_bytes(amount)}" if "memory" in name else f"{name} {amount:g}")
    return ", ".join(said)


def _bytes(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
