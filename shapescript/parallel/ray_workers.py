"""A pool's workers as Ray actors, one per device, on the current cluster (parallel/cluster.py).

The controller talks to each actor exactly as to a local worker process: over a socket, with the
messages of pool.py and worker.py. Only how the socket is made differs:

1. One placement group per pool reserves the devices: a bundle per host, {"CPU": n} (or {"GPU": n,
   "CPU": n}) for the n devices each host runs, STRICT_PACK for a one-host line, STRICT_SPREAD for
   `H x ...` (its H bundles on H distinct nodes). Each actor takes one CPU (or one GPU) of its host's
   bundle: worker `rank` on host `DeviceSet.place(rank)[0]`, so ranks go host by host.
2. The controller listens on one TCP socket, bound to 127.0.0.1 when every node of the cluster is on
   this machine's loopback, else to its own address on the cluster's network as Ray reports it
   (never all interfaces), and closes it once every worker has connected. Each actor connects and
   first sends a random token that only it was given (in its arguments), so a connection from
   anything else is refused; the controller serves every connection at once, each with a deadline
   of its own (parallel/handshake.py), so idle or bogus ones can't hold the workers up. A controller attached through Ray Client (`ray://`) may be beyond the
   workers' reach, so it listens on nothing: each worker's messages go through Ray instead
   (`serve_relayed`, parallel/ray_relay.py).
3. The workers' process group meets at a TCPStore on worker 0's node address (a socket bound there
   by worker 0 itself, handed to the store), and Gloo / NCCL use the interface of each worker's node
   address.

What the controller knows of a worker it can't see as a process stands in for WorkerProcess's
`proc` (`_ActorProcess`): it waits on the actor's `serve` task, and a dead actor's end is Ray's
death cause. A worker's status file (what it runs, where it waits) is a nameless file of its own
process: a controller that sees the worker's /proc (process_space: a cluster on this machine's
loopback) reads it there, and whether the process is stopped, as for a local worker; for a worker on
another host (or in a container) an actor on its host reads both (`look`, on the actor's second
thread while `serve` runs in the first): its own, or a peer's, since a stopped process can't answer
for itself; no answer reads as unknown. Batches go through the connections, never through shared
memory (a pool with a launcher doesn't share: WorkerPool.shares_memory).

Cleanup: stop() and a failure end the actors and remove the placement group (_stop_actors); when the
controller's process ends, however it ends, Ray removes its job's actors and placement groups (none
is detached), which tests/cluster/test_failures.py checks.
"""

from __future__ import annotations

import fcntl
import functools
import os
import pickle
import secrets
import socket
import struct
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, cast

from shapescript.errors import WorkerError
from shapescript.parallel.cluster import Cluster, missing_module_help, ray_module, track
from shapescript.parallel.handshake import NotConnected, accept_workers
from shapescript.parallel.pickling import dumps
from shapescript.parallel.processes import WorkerProcess, is_stopped, shutdown, torch_settings
from shapescript.parallel.ray_relay import Mailbox, RelayedConnection
from shapescript.parallel.worker import UNKNOWN, read_status

if TYPE_CHECKING:
    from shapescript.parallel.pool import WorkerPool

TOKEN_BYTES = 32
PLACE_TIMEOUT = 120.0  # seconds for the cluster to find room for the pool's devices
CONNECT_TIMEOUT = 180.0  # seconds for every actor to start (importing torch) and connect
LOOK_EVERY = 0.5  # seconds between asking Ray whether an actor has died, while a call waits
LOOK_TIMEOUT = 2.0  # seconds for an actor to answer a look at a worker's status, else it is unknown
LOOK_FRESH = 0.2  # seconds a look stays true: a report asks for the status and the stop of each worker
RELAYED_THREADS = 6  # an actor's threads when relayed: serve, look, pull, and pushes that wait for the worker
ACTOR_CLASS = "ShapeScriptWorker"  # as Ray's lists of actors name it
GROUP_PREFIX = "shapescript workers on "  # a pool's placement group's name: this and its devices


# -- the actor (runs on the cluster's hosts) -----------------------------------------------------------

def interface_of(address: str) -> str:
    """The name of this host's network interface that has IPv4 `address` (Gloo's and NCCL's
    SOCKET_IFNAME); "lo" for a loopback address no interface lists."""
    SIOCGIFADDR = 0x8915  # Linux
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    if address.startswith("127."):
        return "lo"
    raise WorkerError(f"no network interface of this host has the address {address}")


def node_address() -> str:
    """This process's node's address as the cluster knows it (its raylet's, `ray start
    --node-ip-address`), which may differ from the address Ray would guess for the host."""
    import ray
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id and node.get("NodeManagerAddress"):
            return str(node["NodeManagerAddress"])
    return str(ray.util.get_node_ip_address())


def process_space() -> str:
    """Which /proc this process sees: its machine's boot id and its pid namespace. Another process
    that sees the same reads this one's /proc/PID entries (the status file, whether it is stopped)
    as its own; "" where there is no /proc."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f"{f.read().strip()} {os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


Place = tuple[str, int, str, int, str]  # ShapeScriptWorker.where


class ShapeScriptWorker:
    """One worker, as a Ray actor (made one by `ray.remote` in the controller, so that this module
    imports without Ray). `serve` is the worker's whole life, as worker.main is a local one's."""

    def __init__(self) -> None:
        self._store: socket.socket | None = None
        # The worker's status file (worker.WorkerState) has no name: it goes with the process, however
        # it ends, and a controller on the same host reads it as /proc/PID/fd/N.
        self._status = tempfile.TemporaryFile(prefix="shapescript-status-")
        self._mailbox = Mailbox()  # a relayed worker's connection (serve_relayed)

    def where(self) -> Place:
        """(this node's address, this process's pid, this node's Ray ID, the status file's fd, the
        process_space it sees /proc in)."""
        import ray
        return (node_address(), os.getpid(), ray.get_runtime_context().get_node_id(), self._status.fileno(),
                process_space())

    def open_store(self) -> int:
        """Worker 0: bind the process group's meeting point on this node's address; its port."""
        self._store = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._store.bind((node_address(), 0))
        self._store.listen(128)
        return int(self._store.getsockname()[1])

    def look(self, pid: int, status_fd: int) -> tuple[str, str, bool]:
        """A worker on this host as the controller would see it on its own machine: its status file
        (worker.read_status) and whether its process is stopped. Answered by a thread of its own
        (the actor's second), while `serve` runs."""
        return (*read_status(f"/proc/{pid}/fd/{status_fd}"), is_stopped(pid))

    def serve(self, controller: tuple[str, int], token: bytes) -> str:
        """Connect to the controller, then `serve_on` that connection."""
        sock = socket.create_connection(controller, timeout=CONNECT_TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(token)
        sock.settimeout(None)
        return self.serve_on(Connection(sock.detach()))

    def serve_relayed(self) -> str:
        """`serve_on` the mailbox's connection: the controller's messages come through `push` and
        `pull` (parallel/ray_relay.py), for a controller that the workers can't connect to."""
        return self.serve_on(self._mailbox.worker_end)

    def push(self, number: int, data: bytes) -> None:
        self._mailbox.push(number, data)

    def pull(self, wait: float) -> tuple[list[bytes], bool]:
        return self._mailbox.pull(wait)

    def serve_on(self, conn: Connection) -> str:
        """Take the settings, join the process group and answer calls until told to stop; "stopped",
        or "disconnected" if the controller's side closed first."""
        import torch.distributed as dist

        from shapescript.parallel import worker
        from shapescript.runtime import calls, collectives
        try:
            config = pickle.loads(conn.recv_bytes())
            interface = interface_of(node_address())
            os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = interface
            config["status_path"] = f"/proc/self/fd/{self._status.fileno()}"
            config["sys_path"] = config["sys_path"] + [p for p in sys.path if p not in config["sys_path"]]
            # An extern fn's module this host lacks: an error that says where, and how to ship it.
            calls.missing_module_help = functools.partial(missing_module_help, worker=(
                f"worker {config['rank']} ({config['kind']}:{config['index']} at {node_address()})"))
            if config["kind"] == "cuda":
                config["index"] = 0  # Ray shows an actor only the GPU it gave it
            if self._store is not None:  # the store's server takes it over, and closes it
                config["store_listen_fd"], self._store = self._store.detach(), None
            served = worker.work(conn, config)
            if served is None:
                return "failed to start"
            collectives.set_world(None)
            dist.destroy_process_group()
            return "stopped" if served else "disconnected"
        finally:
            conn.close()


# -- the controller's side -----------------------------------------------------------------------------

_ACTOR_FIELDS = ("class_name:", "actor_id:", "pid:", "name:", "namespace:", "ip:")  # ActorDiedError's lines of ids


def death_cause(error: BaseException) -> str:
    """Ray's words for why an actor ended (as "The actor is dead because its worker process has died.
    Worker exit type: ..."), without the actor's ids, and cut short."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    words = " ".join(line for line in lines if not line.startswith(_ACTOR_FIELDS))
    return (words[:500] + "..." if len(words) > 500 else words) or type(error).__name__


class _ActorProcess:
    """What pool.py and processes.shutdown ask of a worker's `subprocess.Popen`, for an actor: its
    pid, `poll`/`wait` on its `serve` task, signals as Ray's kill (an actor on another host can't be
    signalled, and a stopped one can't be continued)."""

    def __init__(self, actor: Any, serving: Any, pid: int, node_id: str, status_fd: int) -> None:
        self.actor, self.serving, self.pid, self.node_id, self.status_fd = actor, serving, pid, node_id, status_fd
        self._ended: str | None = None  # how it ended, once known
        self._looked = 0.0
        # The actors that can read its status on its host: its own, and a peer on the same node if
        # there is one (RayLauncher sets it), since a stopped process can't answer for itself.
        self.lookers: list[Any] = [actor]
        self._seen: tuple[float, tuple[str, str, bool]] | None = None  # (when, look())

    def look(self) -> tuple[str, str, bool]:
        """(status kind, text, whether stopped) as a process on its host reads them (ShapeScriptWorker.
        look); (UNKNOWN, "", False) if no actor there answers within LOOK_TIMEOUT. Kept LOOK_FRESH
        seconds: a report asks for both halves of each worker's, one after the other."""
        now = time.monotonic()
        if self._seen is None or now - self._seen[0] > LOOK_FRESH:
            self._seen = (now, self._ask_lookers())
        return self._seen[1]

    def _ask_lookers(self) -> tuple[str, str, bool]:
        """Every looker asked at once, the first answer taken: a stopped worker's own actor never
        answers, and a stopped peer must not hold up the look at a worker that can answer."""
        ray = ray_module()
        if not ray.is_initialized():
            return UNKNOWN, "", False
        asked = [looker.look.remote(self.pid, self.status_fd) for looker in self.lookers]
        deadline = time.monotonic() + LOOK_TIMEOUT
        while asked:
            answered, asked = ray.wait(asked, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not answered:
                break
            try:
                kind, text, stopped = ray.get(answered[0])
                return str(kind), str(text), bool(stopped)
            except Exception:  # that actor is dead, or its node lost: another's answer
                continue
        return UNKNOWN, "", False

    def ended(self, timeout: float = 0.0) -> str | None:
        """None while `serve` runs; once it has ended, how: its answer, or Ray's death cause."""
        if self._ended is None:
            ray = ray_module()
            if not ray.is_initialized():  # at exit, after Ray's own shutdown, which ended the actors
                self._ended = "Ray was shut down in the controller"
                return self._ended
            done, _ = ray.wait([self.serving], timeout=timeout)
            if done:
                try:
                    self._ended = f"it ended its work ({ray.get(self.serving)})"
                except Exception as exc:  # RayActorError, ActorDiedError, a lost node...
                    self._ended = f"its Ray actor died: {death_cause(exc)}"
        return self._ended

    def poll(self) -> int | None:
        return None if self.ended() is None else 0

    def wait(self, timeout: float | None = None) -> int:
        if self.ended(timeout if timeout is not None else 1e9) is None:
            raise subprocess.TimeoutExpired(f"Ray actor {self.pid}", timeout or 0.0)
        return 0

    def send_signal(self, sig: int) -> None:
        pass  # SIGCONT for a stopped worker: none on a cluster is stopped by us

    def terminate(self) -> None:
        self.kill()

    def kill(self) -> None:
        try:
            ray_module().kill(self.actor, no_restart=True)
        except Exception:
            pass  # already gone


class ActorWorker(WorkerProcess):
    """A worker that is a Ray actor, as the pool sees it (no pidfd: `dead()` asks Ray whether its
    `serve` task has ended, `ray.wait` on its result, at most every LOOK_EVERY seconds,
    since the pool asks on every wake-up while a call waits). Its status and whether it is stopped:
    read through /proc where its host is this machine (`status_path` set), else by an actor on its
    host (_ActorProcess.look), a Ray call that a pool's wait makes only for a report, once a worker
    has failed, or a tenth of the collective timeout apart (failures.StoppedLooks)."""

    def status(self) -> tuple[str, str]:
        if self.status_path:
            return super().status()
        kind, text, _ = cast(_ActorProcess, self.proc).look()
        return kind, text

    def stopped(self) -> bool:
        if self.status_path:
            return super().stopped()
        return cast(_ActorProcess, self.proc).look()[2]

    def named(self) -> str:
        return f"worker {self.rank} ({self.label})"  # its host, where the devices line can't say it

    def dead(self) -> bool:
        proc = cast(_ActorProcess, self.proc)
        now = time.monotonic()
        if proc._ended is None and now - proc._looked < LOOK_EVERY:
            return False
        proc._looked = now
        return proc.ended() is not None

    def how_it_stopped(self) -> str:
        return cast(_ActorProcess, self.proc).ended(5.0) or "its connection to the controller closed"


def _stop_actors(actors: list[Any], group: Any, workers: list[WorkerProcess], folder: str | None,
                 grace: float, owner: int) -> None:
    """processes.shutdown for actors (a stop message, a grace, then Ray's kill), then every actor
    killed (a worker that ended its work is still an actor) and the placement group removed."""
    if os.getpid() != owner:
        return
    shutdown(workers, folder, grace, owner)
    ray = ray_module()
    if not ray.is_initialized():
        return  # Ray's own shutdown took the actors and the group with it
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:
            pass
    actors.clear()
    try:
        ray.util.remove_placement_group(group)
    except Exception:
        pass  # already removed


class RayLauncher:
    """Starts a pool's workers as actors on `cluster` (WorkerPool's `launcher`)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def labels(self, devices: Any) -> list[str]:
        """How messages name each worker before it is placed: its device, and host if several."""
        return [label_of(devices, rank) for rank in range(devices.count)]

    def spawn(self, pool: WorkerPool) -> None:
        """Reserve the devices, start the actors, and give each its connection and settings; the
        pool then waits for their "ready" as for local workers."""
        ray = ray_module()
        from ray.util.placement_group import placement_group
        devices = pool.devices
        bundle = {"CPU": devices.per_host, **({"GPU": devices.per_host} if devices.kind == "cuda" else {})}
        group = placement_group([dict(bundle) for _ in range(devices.hosts)],
                                strategy="STRICT_SPREAD" if devices.several_hosts else "STRICT_PACK",
                                name=f"{GROUP_PREFIX}{devices} ({secrets.token_hex(4)})")  # names are unique on a cluster
        actors: list[Any] = []
        pool._shutdown = lambda workers, folder, grace, owner: _stop_actors(actors, group, workers, folder, grace, owner)
        pool._finalizer = weakref.finalize(pool, _stop_actors, actors, group, pool._workers, None, 1.0, pool._owner)
        track(pool)
        try:
            ray.get(group.ready(), timeout=PLACE_TIMEOUT)
        except ray.exceptions.GetTimeoutError:
            raise WorkerError(
                f"{self.cluster} has no room for `devices {devices}` within {PLACE_TIMEOUT:g} s: it needs "
                f"{devices.hosts} node(s) with {bundle} free each, and has {ray.available_resources()} free "
                f"in all") from None
        try:
            conns, serving, places, store_port = self._start_actors(ray, actors, group, devices)
        except ray.exceptions.RayError as exc:  # an actor that couldn't start (its imports, its node)
            raise WorkerError(f"the workers on {devices} couldn't start on {self.cluster}: {death_cause(exc)}") from None
        settings = {"world": pool.world, "kind": devices.kind, "folder": None, "store_path": None,
                    "store_address": (places[0][0], store_port), "timeout": pool.timeout,
                    "sys_path": [p or os.getcwd() for p in sys.path], "modules": pool.modules,
                    "torch": torch_settings()}
        procs = [_ActorProcess(actor, ref, pid, node_id, status_fd)
                 for actor, ref, (_, pid, node_id, status_fd, _) in zip(actors, serving, places)]
        for proc in procs:
            proc.lookers = [proc.actor] + [p.actor for p in procs if p.node_id == proc.node_id and p is not proc][:1]
        here = process_space()
        for rank, (proc, conn, (node, pid, _, status_fd, space)) in enumerate(zip(procs, conns, places)):
            # A worker's status, where it is a process of this machine (a cluster on the loopback, not
            # in a container): its file, read through /proc; elsewhere, ActorWorker asks its host.
            status = f"/proc/{pid}/fd/{status_fd}" if here and space == here else ""
            worker = ActorWorker(rank, f"{label_of(devices, rank)} at {node}", cast(subprocess.Popen, proc), conn,
                                 None, status)
            pool._workers.append(worker)
            conn.send_bytes(dumps({**settings, "rank": rank, "index": devices.place(rank)[1], "status_path": ""}))

    def _start_actors(self, ray: Any, actors: list[Any], group: Any,
                      devices: Any) -> tuple[list[Connection], list[Any], list[Place], int]:
        """Start one actor per worker into `actors`; their connections, their `serve` tasks, where
        each runs (ShapeScriptWorker.where), and the port of worker 0's store."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        remote = ray.remote(ShapeScriptWorker)
        for rank in range(devices.count):
            host, _ = devices.place(rank)
            actors.append(remote.options(
                num_cpus=1, num_gpus=1 if devices.kind == "cuda" else 0, max_restarts=0,
                # `serve` in one thread; `look`, and a relayed worker's `pull` and `push`, in others
                max_concurrency=RELAYED_THREADS if self.cluster.relayed else 2,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=host),
            ).remote())
        store_port = ray.get(actors[0].open_store.remote(), timeout=CONNECT_TIMEOUT)
        places = ray.get([a.where.remote() for a in actors], timeout=CONNECT_TIMEOUT)
        if self.cluster.relayed:  # no socket to this process: the messages go through Ray
            serving = [a.serve_relayed.remote() for a in actors]
            relays = [RelayedConnection(a, ray, label_of(devices, rank)) for rank, a in enumerate(actors)]
            return [r.conn for r in relays], serving, places, store_port
        with _listener(self.controller_address()) as listener:
            tokens = [secrets.token_bytes(TOKEN_BYTES) for _ in actors]
            serving = [a.serve.remote(listener.getsockname(), t) for a, t in zip(actors, tokens)]
            conns = _accept(listener, tokens, serving, devices)
        return conns, serving, places, store_port

    def controller_address(self) -> str:
        """Where the workers reach the controller: loopback on a cluster of this machine's loopback,
        else this process's address on the cluster's network, as Ray knows it."""
        return "127.0.0.1" if self.cluster.local else node_address()


def label_of(devices: Any, rank: int) -> str:
    host, index = devices.place(rank)
    device = f"{devices.kind}:{index}"
    return f"{device} on host {host}" if devices.several_hosts else device


class _listener:
    """A listening TCP socket on `address` (an ephemeral port), closed when the block ends."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((address, 0))
        self.sock.listen(128)

    def __enter__(self) -> socket.socket:
        return self.sock

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def _accept(listener: socket.socket, tokens: Sequence[bytes], serving: Sequence[Any], devices: Any) -> list[Connection]:
    """Each worker's connection, in rank order: each one known by its token (handshake.py: all
    connections served at once, anything else closed at its own deadline). An actor that fails before
    connecting raises its error."""
    ray = ray_module()

    def look() -> None:  # an actor that ended before connecting won't: say why now
        ended, _ = ray.wait(list(serving), timeout=0)
        for ref in ended:
            rank = list(serving).index(ref)
            try:
                answer = ray.get(ref)
            except Exception as exc:
                raise WorkerError(f"worker {rank} ({label_of(devices, rank)}) failed to start on the "
                                  f"cluster: {death_cause(exc)}") from None
            raise WorkerError(f"worker {rank} ({label_of(devices, rank)}) ended before connecting: {answer}")

    try:
        return accept_workers(listener, tokens, time.monotonic() + CONNECT_TIMEOUT, look, LOOK_EVERY)
    except NotConnected as exc:
        raise WorkerError(f"workers {exc.ranks} on {devices} didn't connect to the controller within "
                          f"{CONNECT_TIMEOUT:g} s") from None
