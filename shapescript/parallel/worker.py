"""A worker process: one per device, started by `pool.WorkerPool` as

    python -c WORKER_MAIN --fd N --parent PID

a fresh interpreter, so the user's main script is never imported (see WORKER_MAIN). It reads its
settings from the socket it inherited as fd N, joins the process group, says it is ready, then
answers one message at a time (parallel/messages.py): a Call runs `handlers.HANDLERS[handler](state,
*args)`; a chained Call does too, unless the call before it failed or was skipped, when it is
skipped (a pipelined step sent before the answer to the one before it was read:
parallel/pipeline.py); a Verdict is the controller's word on the step before a chained call, which
that call waits for before it changes anything (`WorkerState.take_verdict`; a verdict nothing waits
for is dropped); Stop ends. If the controller (PID) dies instead,
however it dies and whatever this worker is doing, the worker removes the pool's private folder,
which no one else would, and exits (see `_Controller`).

Each worker keeps a status (idle, running `fn`, waiting for the other workers at train.ss:30:12) in a
small memory-mapped file that the controller reads when a worker is stuck and cannot answer.
"""

from __future__ import annotations

import importlib
import mmap
import os
import pickle
import select
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from shapescript.errors import ShapeScriptError, WorkerError
from shapescript.parallel.handlers import HANDLERS
from shapescript.parallel.memory import Meter, measured
from shapescript.parallel.messages import Message, Reply, Status, Stop, Verdict, message_from, wire
from shapescript.parallel.pickling import dumps
from shapescript.parallel.spin import poll_briefly
from shapescript.parallel.timeline import StepClock
from shapescript.runtime import collectives
from shapescript.runtime.leftovers import ending
from shapescript.runtime.shm_reduce import SharedMemoryAllReduce
from shapescript.runtime.steps import StepSkipped

STATUS_SIZE = 512  # bytes per status file: a kind byte, a 2-byte length, the text
IDLE, RUNNING, WAITING = "I", "R", "W"
UNKNOWN = "?"  # no file's: a status that couldn't be read (a worker on another host that didn't answer)


def describe_status(kind: str, text: str) -> str:
    """The status as the error messages say it: "idle", "running `fn`", "waiting for ... at X"."""
    if kind == RUNNING:
        return f"running {text}"
    if kind == WAITING:
        return f"waiting for the other workers at {text}"
    if kind == UNKNOWN:
        return "in a state unknown to the controller (nothing on its host answered a look)"
    return "idle"


def read_status(path: str) -> tuple[str, str]:
    """(kind, text) of a worker's status file; ("", "") if it can't be read. Read until two reads
    agree, since the worker may be rewriting it."""
    last = b""
    for _ in range(5):
        try:
            with open(path, "rb") as f:
                raw = f.read(STATUS_SIZE)
        except OSError:
            return "", ""
        if raw == last:
            break
        last = raw
    if len(last) < 3 or last[0:1] not in (b"I", b"R", b"W"):
        return "", ""
    n = int.from_bytes(last[1:3], "little")
    return last[0:1].decode(), last[3:3 + n].decode("utf-8", "replace")


class _Restore:
    """Returned by `WorkerState.waiting_at`: as a context manager, puts back the status it replaced
    when the block ends without an exception (on an exception the status stays, so the error reply
    says where the worker was waiting), and times the block for the timeline."""

    def __init__(self, state: WorkerState, kind: str, text: str, where: str) -> None:
        self._state, self._kind, self._text, self._where = state, kind, text, where

    def __enter__(self) -> None:
        self._state.clock.begin(self._where)

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self._state.clock.end()
        if exc_type is None:
            self._state._set(self._kind, self._text)


@dataclass(eq=False)
class WorkerState:
    """What a handler gets as its first argument."""

    rank: int
    world: int
    device: torch.device
    status_path: str
    objects: dict[int, Any] = field(default_factory=dict)  # handles kept between calls, by id
    group_ready: bool = False  # the default torch.distributed process group is initialized
    kind: str = IDLE
    text: str = ""
    meter: Meter = field(init=False)  # the memory of the calls that run the program's code
    clock: StepClock = field(init=False)  # their time, by part (parallel/timeline.py)
    conn: Connection | None = None  # the controller's socket, once the worker serves it
    verdict_due: bool = False  # a chained call runs whose step before has no verdict read yet
    next_message: Message | None = None  # read by take_verdict where a verdict was expected

    def __post_init__(self) -> None:
        self.meter = Meter(self.device)
        self.clock = StepClock(self.device)
        with open(self.status_path, "wb") as f:
            f.write(b"\0" * STATUS_SIZE)
        with open(self.status_path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), STATUS_SIZE)  # writes are memory stores: free on the hot path
        self.idle()

    def _set(self, kind: str, text: str) -> None:
        self.kind, self.text = kind, text
        data = text.encode()[:STATUS_SIZE - 3]
        self._map[0:3 + len(data)] = kind.encode() + len(data).to_bytes(2, "little") + data

    def idle(self) -> None:
        self._set(IDLE, "")

    def running(self, what: str) -> None:
        """`what` as the messages show it, e.g. "`train_step` (train.ss:32:4)"."""
        self._set(RUNNING, what)

    def waiting_at(self, where: str) -> _Restore:
        """Call before a collective, with its .ss location; `with state.waiting_at(where): ...` also
        restores the previous status after it."""
        restore = _Restore(self, self.kind, self.text, where)
        self._set(WAITING, where)
        return restore

    def describe(self) -> str:
        return describe_status(self.kind, self.text)

    def before_update(self, overflow: bool) -> bool:
        """Before an optimizer step changes a model (runtime/optim.py's hook): the controller's word
        on the step before, in a chained call; then every worker's word that none has raised an
        error of its own in this step (collectives.agree_to_update: one int64 summed), which would
        otherwise leave the others updating without it (runtime/ledger.py). Answers whether any
        worker's gradients overflowed (`overflow`: this one's; `precision mixed f16`)."""
        self.take_verdict()
        return collectives.agree_to_update(self.device, overflow=overflow)

    def take_verdict(self) -> None:
        """In a chained call (a step sent before the controller had the answer to the one before it),
        before the call changes anything (runtime/optim.py's `before_update`, and at its end): wait for
        the controller's word that the step before went through, its record written. Raises
        StepSkipped if it didn't, so that every worker leaves this step undone, as one device, which
        stopped at the failed write, never ran it. Once per call; nothing to do in other calls."""
        if not self.verdict_due:
            return
        self.verdict_due = False
        assert self.conn is not None
        message = message_from(pickle.loads(self.conn.recv_bytes()))
        if not isinstance(message, Verdict):  # not expected; served next, as if it had come after this call
            self.next_message = message
            raise StepSkipped("the controller sent another message before its word on the step before")
        if not message.ok:
            raise StepSkipped("the step sent before it failed in the controller")


# -- the process ---------------------------------------------------------------------------------

class _Controller:
    """The process that started this worker, watched by a thread of its own. A controller that dies
    without stopping its workers (SIGKILL, or SIGTERM and SIGHUP, which skip Python's cleanup) can't
    remove its private folder: the watching thread of every worker removes it and ends the process,
    even while the main thread is busy in a step or blocked at a collective (torch releases the GIL
    there), where it would never see the socket close. (PR_SET_PDEATHSIG would kill a busy worker
    too, but with SIGKILL, leaving the folder, and only when started from the controller's main
    thread.) The thread also takes SIGTERM, which ends the worker at once as before, but when the
    controller is being killed with it (its whole process group was sent SIGTERM: Jupyter's restart,
    systemd, `kill -TERM -PGID`), after removing the folder."""

    def __init__(self, pid: int, forked: bool = False) -> None:
        """`forked`: by the fork server, whose pidfd watch is the only one (the server is the parent)."""
        self.pid = pid
        self.folder: str | None = None  # the pool's private folder, once the settings arrive
        try:
            self._pidfd: int | None = os.pidfd_open(pid)  # readable once it has ended
        except (AttributeError, OSError):
            self._pidfd = None  # not Linux >= 5.3: its end shows as this process getting another parent
        if self.gone(0.0) if forked else os.getppid() != pid:  # it ended before it could be watched
            os._exit(1)

    def gone(self, timeout: float | None) -> bool:
        """Whether the controller has ended, waiting for it up to `timeout` seconds (None: forever)."""
        if self._pidfd is not None:
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
            return bool(poller.poll(None if timeout is None else timeout * 1000))
        deadline = None if timeout is None else time.monotonic() + timeout
        while os.getppid() == self.pid:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.25)
        return True

    def watch(self) -> None:
        """Start the watching thread. From the main thread, before anything else handles SIGTERM."""
        signals, wakeup = os.pipe()
        os.set_blocking(wakeup, False)
        # Python runs a handler only in the main thread, which may be stuck in a collective; the byte
        # that its C-level handler writes to the wakeup fd reaches the watching thread at once.
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        signal.set_wakeup_fd(wakeup, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(signals,), name="shapescript-controller-watch",
                         daemon=True).start()

    def _watch(self, signals: int) -> None:
        poller = select.poll()
        for fd in (signals, self._pidfd):
            if fd is not None:
                poller.register(fd, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll(None if self._pidfd is not None else 250)}
            if signals in ready and signal.SIGTERM in os.read(signals, 256):  # each signal caught, as a byte
                if ending(self.pid):
                    self._remove_folder()
                _die_of(signal.SIGTERM)
            if self._pidfd in ready or (self._pidfd is None and os.getppid() != self.pid):
                self.leave_nothing_behind()

    def _remove_folder(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)  # the other workers may be removing it too

    def leave_nothing_behind(self) -> NoReturn:
        self._remove_folder()
        os._exit(1)


def _die_of(signum: int) -> NoReturn:
    """End this process by `signum`, as its default action would (the controller reports how a worker
    stopped), from any thread: Python sets a signal's handler only from the main thread."""
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal(signum, None)  # SIG_DFL
        os.kill(os.getpid(), signum)
        time.sleep(1.0)
    finally:
        os._exit(128 + signum)


def _from_a_collective(exc: BaseException) -> bool:
    """Raised by torch.distributed itself (Gloo's timeout, NCCL's, a peer that went away), rather
    than by the code around a collective, which may run while the status still says waiting."""
    if isinstance(exc, dist.DistError):
        return True
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and isinstance(exc, RuntimeError) and \
        os.path.join("torch", "distributed") in tb.tb_frame.f_code.co_filename


def program_places(exc: BaseException) -> list[tuple[str, int, int]]:
    """The program's functions an error came through on this worker, outermost first, each as its
    name and the .ss line and column its generated frame was at (the module's SS_LINES): so that
    the notebook can point at the call that failed, not at the function called from Python."""
    found = []
    tb = exc.__traceback__
    while tb is not None:
        lines = tb.tb_frame.f_globals.get("SS_LINES")
        if isinstance(lines, dict) and tb.tb_lineno in lines:
            line, col = lines[tb.tb_lineno]
            found.append((tb.tb_frame.f_code.co_name, line, col))
        tb = tb.tb_next
    return found


def error_payload(exc: BaseException, state: WorkerState | None) -> dict[str, Any]:
    """An exception as a reply: its class name, text, traceback, where the worker was, whether it
    failed in a collective, and the exception itself when it's ours and can be pickled."""
    pickled = None
    if isinstance(exc, ShapeScriptError):
        try:
            pickled = dumps(exc)
        except Exception:  # an unpicklable attribute: the controller rebuilds it from the text
            pickled = None
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
        "status": state.describe() if state is not None else "starting",
        "collective": state is not None and state.kind == WAITING and _from_a_collective(exc),
        "pickled": pickled,
        "places": program_places(exc),
    }


def _send(conn: Connection, message: Reply, what: str = "the reply") -> None:
    try:
        data = dumps(wire(message))
    except Exception as exc:  # a result that can't be pickled is the handler's error
        data = dumps(wire(Reply(Status.ERR, error_payload(
            WorkerError(f"{what} can't be sent to the controller: {type(exc).__name__}: {exc}"), None))))
    conn.send_bytes(data)


def _boot(config: dict[str, Any]) -> WorkerState:
    """Join the process group and import what the handlers need, before saying ready, so that
    nothing is imported or initialized lazily on the first call."""
    sys.path[:] = config["sys_path"]

    rank, world, kind = config["rank"], config["world"], config["kind"]
    if kind == "cuda":
        device = torch.device("cuda", config["index"])
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:  # the workers share the CPUs: don't oversubscribe them
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world))
    torch.set_flush_denormal(config["torch"]["flush_denormal"])  # the controller's numerics
    torch.set_float32_matmul_precision(config["torch"]["matmul_precision"])
    if torch.are_deterministic_algorithms_enabled() != config["torch"]["deterministic"]:  # setting it at all
        torch.use_deterministic_algorithms(config["torch"]["deterministic"])  # makes /tmp/torchinductor_USER
    state = WorkerState(rank, world, device, config["status_path"])
    for name in config["modules"]:
        importlib.import_module(name)
    if config.get("store_address"):  # workers on a cluster meet at worker 0's node (parallel/ray_workers.py)
        host, port = config["store_address"]
        store: dist.Store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timedelta(seconds=config["timeout"]),
                                          wait_for_workers=False, master_listen_fd=config.get("store_listen_fd"))
    else:
        store = dist.FileStore(config["store_path"], world)
    dist.init_process_group("nccl" if kind == "cuda" else "gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=config["timeout"]),
                            device_id=device if kind == "cuda" else None)
    collectives.set_world(world)
    with state.waiting_at("start"):
        warm = torch.ones(1, device=device)
        dist.all_reduce(warm)  # connects every pair now, and proves the group works
        if config.get("shm_reduce"):  # peers on this machine: all-reduces through shared memory
            collectives.shm = SharedMemoryAllReduce(config["shm_reduce"], rank, world, config["timeout"])
            collectives.shm.all_reduce(warm)  # proves it works, before the controller removes its file
    state.group_ready = True
    state.idle()
    return state


def _serve(conn: Connection, state: WorkerState, spin_s: float = 0.0) -> bool:
    """Answer the controller's messages until it says stop (True) or its socket closes (False),
    polling for each for `spin_s` seconds before sleeping in recv (parallel/spin.py)."""
    # The program's code runs without autograd's graph, as torch.no_grad() would have it around each
    # call (value_and_grad turns it on where it differentiates): set once for this thread, since a
    # context a call costs several µs of each round trip.
    torch._C._set_grad_enabled(False)
    failed = False  # whether the last message's handler raised, or skipped its call
    state.conn = conn
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    while True:
        if state.next_message is not None:
            message, state.next_message = state.next_message, None
        else:
            if spin_s:
                poll_briefly(poller, spin_s)  # recv_bytes then reads at once, or sleeps as without polling
            try:
                data = conn.recv_bytes()
            except (EOFError, OSError):
                return False
            try:
                message = message_from(pickle.loads(data))
            except Exception as exc:  # e.g. an object of a class defined in the controller's main script
                _send(conn, Reply(Status.ERR, error_payload(WorkerError(
                    f"the workers can't read the arguments: {type(exc).__name__}: {exc} (the workers never import "
                    f"the controller's main script, so its classes can't be sent to them)"), None)))
                continue
        if isinstance(message, Stop):
            return True
        if isinstance(message, Verdict):  # on a step whose chained call this worker skipped, or never waited for
            continue
        name, where, args, chained = message.handler, message.where, message.args, message.chained
        if chained and failed:  # the step before it failed: this one never happened
            _send(conn, Reply(Status.SKIPPED))
            continue
        state.verdict_due = chained
        state.running(where)
        try:
            fn = HANDLERS.get(name)
            if fn is None:
                raise WorkerError(f"the workers have no handler named {name!r}; they have {', '.join(sorted(HANDLERS))}")
            with measured(state, name):
                result = fn(state, *args)
            reply = Reply(Status.OK, result)
        except StepSkipped:
            reply = Reply(Status.SKIPPED)
        except Exception as exc:
            reply = Reply(Status.ERR, error_payload(exc, state))
            # Peers waiting for this worker's part of a sum give up, where it couldn't join the rest of
            # the call's collectives (runtime/ledger.py); where it did, they have given the step up
            # already, and the mark is cleared by the controller's "resync_sums" before the next call.
            if collectives.shm is not None:
                collectives.shm.fail()
        failed = reply.status != Status.OK
        state.verdict_due = False  # one the call didn't wait for is dropped when it comes
        _send(conn, reply, f"the result of {where} on worker {state.rank}")
        state.idle()  # after sending: the controller takes a worker that's no longer waiting to be stuck
        state.meter.settle()  # the call's memory peak, read once the reply is on its way (memory.py)


def work(conn: Connection, config: dict[str, Any]) -> bool | None:
    """A worker's life once it has its settings, wherever it runs (main here, a Ray actor's `serve` in
    ray_workers.py): start, say ready, answer calls. _serve's answer; None if it failed to start (its
    error sent to the controller, which raises it as "worker r failed to start") or the controller
    went away before it was ready."""
    try:
        state = _boot(config)
    except BaseException as exc:
        try:
            _send(conn, Reply(Status.ERR, error_payload(exc, None)))
        except OSError:
            pass
        return None
    try:
        _send(conn, Reply(Status.READY, {"pid": os.getpid(), "device": str(state.device)}))
    except OSError:
        return None
    return _serve(conn, state, config.get("spin", 0.0))


# The program of a worker's `python -c`: this module imported by name, never the controller's __main__
# (as `-m` would, but without runpy's warning when the package imports it). It enters the packages
# `shapescript` and `shapescript.parallel` without running their __init__, which import the compiler
# (sympy: more time than all of a worker's own imports after torch) that a worker never runs; a package
# runs its __init__ when a name that it defines is first asked for (by the module of an extern fn that
# uses `ss.load`, say), and its submodules import as usual.
WORKER_PRELUDE = """\
import importlib.util, sys, types

class Package(types.ModuleType):
    def __getattr__(self, name):
        if importlib.util.find_spec(f"{self.__name__}.{name}") is not None:
            raise AttributeError(name)  # a submodule: `from package import submodule` imports it
        self.__class__ = types.ModuleType
        self.__spec__.loader.exec_module(self)
        return getattr(self, name)

for name in ("shapescript", "shapescript.parallel"):
    package = importlib.util.module_from_spec(importlib.util.find_spec(name))
    package.__class__ = Package
    sys.modules[name] = package
sys.modules["shapescript"].parallel = sys.modules["shapescript.parallel"]
"""
WORKER_MAIN = WORKER_PRELUDE + "from shapescript.parallel.worker import main\nmain(sys.argv[1:])\n"
# The fork server's program (parallel/forkserver.py): a worker's imports, then forks of it on request.
SERVER_MAIN = WORKER_PRELUDE + """\
import shapescript.parallel.worker, shapescript.parallel.program_handlers, shapescript.runtime.core
from shapescript.parallel.forkserver import serve
serve(sys.argv[1:])
"""


def main(argv: list[str]) -> None:
    """`argv`: --fd N (this worker's end of the socket pair), --parent PID (the controller), and
    --forked where the fork server forked it (parallel/forkserver.py)."""
    controller = _Controller(int(argv[argv.index("--parent") + 1]), "--forked" in argv)
    controller.watch()
    # Ctrl-C, and the hangup of a closed terminal, are the controller's to handle: it stops us, or if
    # it dies of them, the watch sees it and removes the folder.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    fd = int(argv[argv.index("--fd") + 1])
    os.set_inheritable(fd, False)
    conn = Connection(fd)
    try:
        config = pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        os._exit(1)  # the controller went away while we started
    controller.folder = config["folder"]
    served = work(conn, config)
    if served is None:
        os._exit(1)
    if not served and controller.gone(2.0):  # its end closed the socket: see _Controller
        controller.leave_nothing_behind()
    try:
        collectives.set_world(None)
        dist.destroy_process_group()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # skip the interpreter's slow teardown of torch; nothing is left to write


if __name__ == "__main__":
    # Run the module under its own name, so handlers see the same WorkerState class as they import.
    from shapescript.parallel import worker as _worker
    _worker.main(sys.argv[1:])
