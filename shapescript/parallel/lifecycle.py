"""A worker pool's life (pool.py's WorkerPool): the state it is in, and starting its workers:
launched as processes of this machine (forked by the fork server, or fresh interpreters) or by a
launcher elsewhere (a Ray cluster), sent their settings, and awaited until each says it is ready.
"""

from __future__ import annotations

import enum
import os
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from shapescript.devices import DeviceSet
from shapescript.errors import WorkerError
from shapescript.parallel import forkserver
from shapescript.parallel.messages import Reply, Status
from shapescript.parallel.pickling import dumps
from shapescript.parallel.processes import (
    WorkerProcess,
    current_collective_timeout,
    loopback,
    ranks_text,
    shutdown,
    sweep_stale_folders,
    torch_settings,
)
from shapescript.runtime import shm_reduce
from shapescript.runtime.leftovers import owner_tag


class PoolState(enum.StrEnum):
    """Where a pool is in its life: made, starting its workers, running calls, or ended (dead: a worker
    failed or was interrupted; stopped: by `stop()`). A StrEnum: it reads and prints as its word."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    DEAD = "dead"
    STOPPED = "stopped"


class Starting:
    """The starting half of WorkerPool (pool.py), which sets these attributes."""

    devices: DeviceSet
    indices: tuple[int, ...]
    world: int
    timeout: float | None
    modules: tuple[str, ...]
    cold_start_s: float | None
    _state: PoolState
    _launcher: Any
    _workers: list[WorkerProcess]
    _launch: tuple[Any, ...] | None
    _launching: threading.RLock
    _folder: str | None
    _shm_path: str | None
    _sums_shared: bool
    _thread: threading.Thread | None
    _start_error: BaseException | None
    _t0: float
    _finalizer: weakref.finalize | None
    _owner: int
    _spin: float
    _die: Callable[[str], None]  # stop every worker, saying why (WorkerPool's method)
    _exclusive: Callable[[], AbstractContextManager[Any]]
    _check_running: Callable[[], None]
    _gather: Callable[[str], tuple[list[Reply | None], list[int], bool]]

    def start(self) -> None:
        """Start the workers and return when every one is ready."""
        with self._exclusive():
            if self._state == PoolState.NEW:
                self._spawn()
                self._await_ready()
            self._join_start()
            self._check_running()

    def start_background(self) -> None:
        """Start the workers without waiting for them; any later call waits."""
        with self._exclusive():
            if self._state != PoolState.NEW:
                return
            self._spawn(background=True)
            self._thread = threading.Thread(target=self._await_ready_in_thread, name="shapescript-workers-start",
                                            daemon=True)
            self._thread.start()

    def _spawn(self, background: bool = False) -> None:
        self._state = PoolState.STARTING
        self._t0 = time.perf_counter()
        self.timeout = self.timeout if self.timeout is not None else current_collective_timeout()
        if self._launcher is not None:  # workers elsewhere: it sets _workers, _shutdown and _finalizer
            self._owner = os.getpid()
            try:
                self._launcher.spawn(self)
            except BaseException as exc:
                self._die(f"the workers couldn't be started: {exc}")
                raise
            return
        sweep_stale_folders()  # the backstop: a killed controller's workers remove its folder as they exit
        self._folder = tempfile.mkdtemp(prefix=f"shapescript-workers-{owner_tag()}-")  # mode 0700: ours alone
        self._owner = os.getpid()  # a forked child neither uses nor stops these workers
        self._finalizer = weakref.finalize(self, shutdown, self._workers, self._folder, 1.0, self._owner)  # also at exit
        sys_path = [p or os.getcwd() for p in sys.path]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys_path))
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = loopback()
        store_path = os.path.join(self._folder, "store")
        server = forkserver.server_for(env, os.getcwd())
        self._launch = (server, env, sys_path, store_path)
        if not (background and server is not None and not server.ready(0.0)):  # else the start's thread does it
            self._launch_workers()

    def _launch_workers(self) -> None:
        """Start the worker processes (forked by the fork server where there is one) and send each its
        settings. In start_background's thread where the fork server is still importing."""
        assert self._launch is not None and self._folder is not None
        (server, env, sys_path, store_path), self._launch = self._launch, None
        if server is not None and not server.ready(forkserver.READY_TIMEOUT):
            server = None  # it couldn't start: fresh interpreters, as without one
        try:
            with self._launching:
                for rank, index in enumerate(self.indices):
                    if self._state != PoolState.STARTING:  # stopped meanwhile (Ctrl-C in the thread that waits)
                        return
                    self._workers.append(forkserver.start_worker(rank, f"{self.devices.kind}:{index}", server, env,
                                                                 sys_path, self._folder))
            if self.devices.kind == "cpu":  # processes of this machine sum through shared memory (shm_reduce.py)
                self._shm_path = shm_reduce.create(self.world)
                self._sums_shared = self._shm_path is not None
            settings = {"world": self.world, "kind": self.devices.kind, "folder": self._folder, "store_path": store_path,
                        "timeout": self.timeout, "shm_reduce": self._shm_path, "sys_path": sys_path,
                        "modules": self.modules, "torch": torch_settings(), "spin": self._spin}
            for w, index in zip(self._workers, self.indices):
                w.conn.send_bytes(dumps({**settings, "rank": w.rank, "index": index, "status_path": w.status_path}))
        except BaseException as exc:
            self._die(f"the workers couldn't be started: {exc}")
            if isinstance(exc, OSError):
                raise WorkerError(f"the workers on {self.devices} couldn't be started: {exc}") from None
            raise

    def _await_ready(self) -> None:
        if self._launch is not None:
            self._launch_workers()
            if self._state != PoolState.STARTING:  # stopped while the fork server was getting ready
                return
        try:
            replies, pending, _ = self._gather("starting")
        except BaseException:
            self._die("interrupted while starting")
            raise
        finally:  # each worker that started has mapped it
            shm_reduce.remove(self._shm_path)
            self._shm_path = None
        for w in self._workers:
            reply = replies[w.rank]
            if reply is not None and reply.status == Status.ERR:
                self._die(f"worker {w.rank} failed to start")
                payload = reply.value
                exc = WorkerError(f"worker {w.rank} ({w.label}) failed to start: {payload['type']}: {payload['message']}")
                exc.add_note(f"worker {w.rank}'s traceback:\n{payload['traceback']}")
                raise exc
        if pending:  # the others were ready long ago
            self._die("a worker didn't start")
            raise WorkerError(f"{ranks_text(pending)} of {self.devices} didn't start within {self.timeout:g} s of the others")
        self.cold_start_s = time.perf_counter() - self._t0
        self._state = PoolState.RUNNING

    def _await_ready_in_thread(self) -> None:
        try:
            self._await_ready()
        except BaseException as exc:  # kept for the caller's next call
            self._start_error = exc

    def _join_start(self) -> None:
        if self._thread is not None:
            try:
                self._thread.join()
            except KeyboardInterrupt:
                self._die("interrupted while starting")
                raise
            self._thread = None
            if self._start_error is not None:
                error, self._start_error = self._start_error, None
                raise error
