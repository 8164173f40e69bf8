"""The controller's side: a pool of worker processes, one per device.

    pool = WorkerPool(parse_devices("cpu[0 1]"))
    pool.start()                                     # or start_background() in a notebook
    pool.call("ping", ())                            # [worker 0's answer, worker 1's answer]
    pool.call("all_reduce_sum", [(t0,), (t1,)])      # one tuple of arguments per worker
    pool.stop()

Each worker runs `shapescript.parallel.worker.main`, never the user's main script, forked by the
fork server (forkserver.py) or a fresh interpreter, with the controller's sys.path. Messages travel
over socket pairs the controller made, never over a port; the process group meets through a
FileStore in a private folder, and Gloo / NCCL use the loopback interface: nothing listens beyond.

Failures are WorkerErrors: a worker that dies is reported at once (its rank, device, how it stopped
and what it was running) and the others are stopped; a collective that times out is reported with
where each worker was. A handler's own ShapeScriptError raises in the controller as the same class.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self

from shapescript.devices import DeviceSet
from shapescript.errors import ClusterNeededError, WorkerError
from shapescript.parallel import shared, spin
from shapescript.parallel.failures import FailureReports
from shapescript.parallel.gathering import Gathering
from shapescript.parallel.interrupts import held_step, step_interrupt
from shapescript.parallel.lifecycle import PoolState, Starting
from shapescript.parallel.messages import Call, Status, Verdict, wire
from shapescript.parallel.pickling import dumps
from shapescript.parallel.pipeline import InFlight

# collective_timeout, current_collective_timeout, MAX_TIMEOUT and TIMEOUT_ENV are this module's API too
from shapescript.parallel.processes import (  # noqa: F401
    MAX_TIMEOUT,
    STOPPED_BY_CONTROLLER,
    TIMEOUT_ENV,
    WorkerExit,
    WorkerProcess,
    collective_timeout,
    current_collective_timeout,
    shutdown,
    timeout_seconds,
)
from shapescript.parallel.timeline import Timeline
from shapescript.runtime import shm_reduce
from shapescript.runtime.model import require_visible
from shapescript.runtime.steps import between_steps

STOP_GRACE = 3.0  # seconds a worker has to exit after a stop message, and after SIGTERM
PARALLEL_SEND_BYTES = 1 << 20  # messages bigger than this go to the workers at once, from threads


class WorkerPool(Starting, Gathering, FailureReports):
    """One worker process per device of `devices`, in one process group. `timeout` is the collective
    timeout in seconds (default: `current_collective_timeout()` when the pool starts); `modules` are
    imported by every worker as it starts, e.g. to register more handlers. Calls from several threads
    run one at a time, each getting its own answers. A process forked from the one that started the
    workers can't call them, and its exit or `stop()` leaves them running for their owner."""

    def __init__(self, devices: DeviceSet, timeout: float | None = None, modules: Sequence[str] = (),
                 launcher: Any = None) -> None:
        """`launcher`: who starts the workers elsewhere (parallel/ray_workers.py's RayLauncher, on a
        cluster); None for processes on this machine."""
        if devices.kind not in ("cpu", "cuda"):
            raise ValueError(f"devices must be cpu[...] or cuda[...], not {devices}")
        if devices.several_hosts and launcher is None:
            raise ClusterNeededError.of(str(devices), devices.hosts, devices.count)
        if timeout is not None:
            timeout = timeout_seconds(timeout, "the collective timeout")
        if devices.kind == "cuda" and launcher is None:  # before any worker starts, rather than as each one fails
            require_visible(devices.indices or (0,), str(devices), "the workers")
        self.devices = devices
        self.indices: tuple[int, ...] = devices.indices if devices.indices is not None else (0,)
        self.world = devices.count
        self._launcher = launcher
        self._shutdown: Callable[[list[WorkerProcess], str | None, float, int], None] = shutdown  # the launcher's own
        self.timeout = timeout
        self.modules = tuple(modules)
        self.cold_start_s: float | None = None  # seconds from start() until every worker was ready
        self._workers: list[WorkerProcess] = []
        self._launch: tuple[Any, ...] | None = None  # what _launch_workers needs, until it has run
        self._launching = threading.RLock()  # held while workers are started, and while they are stopped
        self._folder: str | None = None
        self._shm_path: str | None = None  # the shared all-reduce buffer's file, until every worker has mapped it
        self._sums_shared = False  # the workers sum through that buffer (runtime/shm_reduce.py)
        self._resync_due = False  # a call failed on some worker: its counters are set again before the next
        self._state = PoolState.NEW
        self._dead_reason = ""
        self._thread: threading.Thread | None = None
        self._start_error: BaseException | None = None
        self._t0 = 0.0
        self._finalizer: weakref.finalize | None = None
        self._senders: ThreadPoolExecutor | None = None  # for big messages, see _send
        self._first: tuple[str, tuple[Any, ...], str] | None = None  # see first()
        self._lock = threading.RLock()  # one call at a time; re-entrant for the `first` call inside a call
        self._owner = os.getpid()  # the process that started the workers (set again when it does)
        self._released: list[int] = []  # handles whose last holder in the controller is gone; see release()
        self._completed: Counter[str] = Counter()  # calls that ended on every worker, by what ran
        self._in_flight: deque[InFlight] = deque()  # calls sent without waiting for their answers: see submit
        self.answered_at = 0.0  # perf_counter() when the last call's answers were read
        # seconds to poll for replies before sleeping (parallel/spin.py); never for workers on a cluster
        self._spin = spin.budget() if launcher is None else 0.0
        self.exits: tuple[WorkerExit, ...] = ()  # how each worker ended, once the pool has stopped
        labels = launcher.labels(devices) if launcher is not None else [f"{devices.kind}:{i}" for i in self.indices]
        self.timeline = Timeline(str(devices), labels)  # RemoteFunction's calls

    # -- state -------------------------------------------------------------------------------------

    def _foreign(self) -> bool:
        """Whether this process was forked from the one that started the workers (and so holds copies
        of their sockets, which it must neither use nor close)."""
        return os.getpid() != self._owner

    def _exclusive(self) -> threading.RLock:
        """The lock that a call or a start holds throughout. In a forked child this raises at once
        instead: the workers aren't its own, and a thread of the parent may have held the lock."""
        if self._state != PoolState.NEW and self._foreign():
            self._check_running()
        return self._lock

    def _check_running(self) -> None:
        if self._state != PoolState.NEW and self._foreign():
            raise WorkerError(f"the workers on {self.devices} belong to process {self._owner}, from which this "
                              f"process ({os.getpid()}) was forked; it can't use them: start new ones here")
        if self._state != PoolState.RUNNING:
            how = f"stopped after an error ({self._dead_reason})" if self._state == PoolState.DEAD else "stopped"
            raise WorkerError(f"the workers on {self.devices} were {how}; start new ones")

    @property
    def alive(self) -> bool:
        """Started (or starting) by this process, and not stopped or failed."""
        return self._state in (PoolState.STARTING, PoolState.RUNNING) and not self._foreign()

    @property
    def state(self) -> PoolState:
        return self._state

    @property
    def shares_memory(self) -> bool:
        """Whether big batches reach these workers through this machine's shared memory (shared.py):
        processes of this machine, yes (unless $SHAPESCRIPT_SHARED_BATCHES=0); actors on a cluster, no."""
        return self._launcher is None and shared.enabled

    @property
    def settled(self) -> bool:
        """Running, with no `first` call pending: the next call goes straight to the workers."""
        return self._state == PoolState.RUNNING and self._first is None

    def first(self, handler: str, args: tuple[Any, ...], where: str) -> None:
        """Run `handler` on every worker just before the next call (as loading a program into
        workers still starting), so that no one waits for it now. Replaces one not yet run."""
        self._first = (handler, args, where)

    @property
    def folder(self) -> str | None:
        """The private folder (mode 0700) of the rendezvous store and the status files, while running."""
        return self._folder if self._workers else None

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def __repr__(self) -> str:
        return f"<WorkerPool on {self.devices}: {self._state}>"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop the workers gracefully (a stop message, then SIGTERM and SIGKILL after a grace), once a
        call in progress in another thread has finished. In a forked child this only forgets them."""
        if self._foreign():
            self._release(0.0)  # never the lock: a thread of the parent may have held it at the fork
        else:
            with self._lock:
                try:
                    self._join_start()
                except BaseException:
                    pass  # a failed start already stopped them
                self._release(STOP_GRACE)
        if self._state != PoolState.DEAD:
            self._state = PoolState.STOPPED

    def _die(self, reason: str) -> None:
        """Stop every worker at once: after a failure or an interrupt, the devices' state is gone."""
        if self._state != PoolState.DEAD:
            self._state, self._dead_reason = PoolState.DEAD, reason
        self._release(0.0)

    def _release(self, grace: float) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._foreign():
            return  # the workers, their sockets and folder are the parent's, which goes on using them
        ended = [(w, w.dead()) for w in self._workers]  # the ones that stopped before we stopped them
        shm_reduce.remove(self._shm_path)  # stopped while starting
        self._shm_path = None
        with self._launching:
            self._shutdown(self._workers, self._folder, grace, self._owner)
        if self._launcher is None:  # the batches' shared buffers (a call still holding one: when it lets go)
            shared.close_idle()
        self.exits = self.exits or tuple(
            WorkerExit(w.rank, w.label, w.proc.pid, w.how_it_stopped() if by_itself else STOPPED_BY_CONTROLLER)
            for w, by_itself in ended)
        if self._senders is not None:  # its threads end once the pipes close
            self._senders.shutdown(wait=False)

    # -- calls -------------------------------------------------------------------------------------

    def call(self, handler: str, args: tuple[Any, ...] | list[tuple[Any, ...]], where: str = "") -> list[Any]:
        """Run `handlers.HANDLERS[handler](state, *args)` on every worker and return their results in
        rank order. `args` is one tuple for all, or a list of one tuple per worker. `where` says what
        runs, for error messages (default: the handler's name)."""
        # Between two steps of a background run (runtime/steps.py), then the whole call, its `first`
        # included: another thread's call waits for it.
        with between_steps(), self._exclusive():
            self._free_released()
            return self._call(handler, args, where)

    def release(self, handle: int) -> None:
        """Forget the workers' object `handle` with the next call: its last holder in the controller
        is gone. Called by finalizers, at any time and from any thread, so it only takes note (a
        list's append is atomic); the workers hear of it before the next message."""
        if self._state not in (PoolState.DEAD, PoolState.STOPPED):
            self._released.append(handle)

    def _free_released(self) -> None:
        if not self._released or self._state not in (PoolState.RUNNING, PoolState.STARTING):
            return
        handles, self._released = self._released, []
        self._call("free", (handles,), "freeing what no handle holds any more")

    @property
    def released_pending(self) -> int:
        """How many released handles the workers haven't heard of yet."""
        return len(self._released)

    def _ready_for_a_call(self, waited: bool = True) -> None:
        if self._state == PoolState.NEW:
            self.start()
        self._join_start()
        self._check_running()
        if waited:  # the answers to calls sent without waiting come first, in order
            self._settle_all()
        if self._resync_due and not self._in_flight:
            self._resync_due = False
            self._call("resync_sums", (), "setting the shared sums' counters again after a failed call")
        if self._first is not None:
            first, self._first = self._first, None
            try:
                self.call(*first)
            except BaseException:
                self._first = first  # not done: the next call tries again, and says so again
                raise

    def _call(self, handler: str, args: tuple[Any, ...] | list[tuple[Any, ...]], where: str) -> list[Any]:
        self._ready_for_a_call()
        where = where or f"`{handler}`"
        payloads = self._encode(handler, args, where)
        with self._held(where) as interrupts:  # the first Ctrl-C waits for the step to end
            self._send(payloads, where)
            replies, pending, released = self._gather(f"running {where}")
        results = self._answers(replies, pending, released, where)
        self.answered_at = time.perf_counter()
        if interrupts.first is not None:  # Ctrl-C during the step, which has ended on every worker
            raise step_interrupt(where, self.devices, self._completed[where])
        return results

    def _held(self, where: str) -> held_step:
        """Around sending a call and waiting for its answers: Ctrl-C held (until_the_step_ends); a
        second one, or a failure of our own, stops the workers, whose state is then unknown."""
        return held_step(self._die, where, self.devices)

    def submit(self, handler: str, args: tuple[Any, ...] | list[tuple[Any, ...]], where: str,
               answered: Callable[[list[Any] | None], None]) -> None:
        """Send a call as `call` does, without waiting for its answers: the workers have it queued
        while they finish the one before, whose answers are read now (parallel/pipeline.py). Its own
        are read by the next call, submitted or not, or by `settle()`, which give them to `answered`
        (None: it failed or never ran, and the error is raised there)."""
        with between_steps(), self._exclusive():
            if self._in_flight and self._in_flight[-1].interrupted is not None:
                self._settle_all()  # Ctrl-C came: nothing more is sent, and StepInterrupt is raised
            self._free_released()
            self._ready_for_a_call(waited=False)
            payloads = self._encode(handler, args, where, chained=bool(self._in_flight))
            with self._held(where) as interrupts:
                self._send(payloads, where)
            self._in_flight.append(InFlight(where, answered, interrupts.first, args))
            while len(self._in_flight) > 1:
                self._settle_first()

    def settle(self) -> None:
        """Read the answers to every call sent without waiting (submit), raising the first error."""
        if self._in_flight:
            with self._exclusive():
                self._settle_all()

    def _settle_all(self) -> None:
        while self._in_flight:
            self._settle_first()

    def _settle_first(self) -> None:
        flight = self._in_flight[0]
        told = False  # whether `answered` was given the results
        try:
            with self._held(flight.where) as interrupts:
                interrupts.first = interrupts.first or flight.interrupted
                replies, pending, released = self._gather(f"running {flight.where}")
            self._in_flight.popleft()
            results = self._answers(replies, pending, released, flight.where)
            told = True
            flight.answered(results)  # its record written: a sink that raises fails the call sent after it
        except BaseException:
            if self._in_flight and self._in_flight[0] is flight:
                self._in_flight.popleft()
            if not told:
                flight.answered(None)
            self._forget_in_flight()
            raise
        if self._in_flight:  # the call sent after it waits for this word before it changes anything
            self._send_verdict(True)
        self.answered_at = time.perf_counter()
        if interrupts.first is None:
            return
        # Ctrl-C: raised once the last step sent has ended and its result is the caller's (whose loop
        # writes it to its sink first): at that step's settling, by the next submit or by settle().
        if self._in_flight:
            self._in_flight[-1].interrupted = self._in_flight[-1].interrupted or interrupts.first
            return
        raise step_interrupt(flight.where, self.devices, self._completed[flight.where])

    def _send_verdict(self, ok: bool) -> None:
        """Tell every worker whether the call before the chained one they run went through: its
        answers read and its record written (WorkerState.take_verdict)."""
        message = dumps(wire(Verdict(ok)))
        for w in self._workers:
            try:
                w.conn.send_bytes(message)
            except OSError:  # it stopped: the gather that follows says so
                pass

    def _forget_in_flight(self) -> None:
        """After a call failed (on the workers, or in the controller as its record was written):
        the ones sent after it are skipped by the workers (a chained call after a failed one),
        or skip themselves before they change anything, told so by the verdict. If some worker ran
        one anyway (a handler other than a program's call, which takes no verdict), the workers no
        longer agree, and are stopped."""
        flights, self._in_flight = list(self._in_flight), deque()
        if flights and self._state == PoolState.RUNNING:
            self._send_verdict(False)
            self._resync_due = self._sums_shared  # one may have raised an error of its own
        ran = False
        for flight in flights:
            if self._state == PoolState.RUNNING:
                replies, pending, _ = self._gather(f"skipping {flight.where}")
                ran = ran or bool(pending) or any(r is not None and r.status == Status.OK for r in replies)
            flight.answered(None)
        if ran and self._state == PoolState.RUNNING:
            self._die(f"the workers disagree after a failed call ({flights[0].where} ran on some only)")

    def _send(self, payloads: list[bytes], where: str) -> None:
        """Each worker its message. Big ones (a batch from Python) go at once, from threads, so the
        last worker doesn't wait for the first to read all of its part before its own starts."""
        def send(w: WorkerProcess, payload: bytes) -> bool:
            try:
                w.conn.send_bytes(payload)
                return True
            except OSError:  # it stopped since the last call
                return False

        pairs = list(zip(self._workers, payloads))
        if len(pairs) > 1 and max(len(p) for p in payloads) > PARALLEL_SEND_BYTES:
            if self._senders is None:
                self._senders = ThreadPoolExecutor(self.world - 1, thread_name_prefix="shapescript-send")
            others = [self._senders.submit(send, w, p) for w, p in pairs[1:]]
            sent = [send(*pairs[0])] + [f.result() for f in others]
        else:
            sent = [send(w, p) for w, p in pairs]
        for (w, _), ok in zip(pairs, sent):
            if not ok:
                self._fail_dead(w, f"idle, before {where}")

    def _encode(self, handler: str, args: tuple[Any, ...] | list[tuple[Any, ...]], where: str,
                chained: bool = False) -> list[bytes]:
        """The calls for each worker, pickled: once when every worker gets the same."""
        if isinstance(args, list) and len(args) != self.world:
            raise ValueError(f"`{handler}` was given {len(args)} tuples of arguments for {self.world} workers")
        try:
            if isinstance(args, list):
                return [dumps(wire(Call(handler, where, tuple(a), chained))) for a in args]
            return [dumps(wire(Call(handler, where, tuple(args), chained)))] * self.world
        except Exception as exc:
            raise WorkerError(f"the arguments of {where} can't be sent to the workers: "
                              f"{type(exc).__name__}: {exc}") from None
