"""The fork server: one process per controller that has imported torch and a worker's modules once,
and forks each worker from there, which makes a cold start fast.

A fresh worker spends about a second importing torch; two of them do it at once on the same cores,
as DDP's spawned ranks do. The server pays that once, alone, and a fork then costs milliseconds, so
the first pool starts sooner and every later one (another devices line, a restart after a failure,
a test suite's hundreds) at once; the forked workers also share torch's pages until they write them.

    server = server_for(env, cwd)          # None: start workers as fresh interpreters
    proc = server.fork(theirs, argv, env, sys_path, cwd, exit_path)   # a Popen-like ForkedWorker

Why forking is safe here: the server runs no torch operation (no thread pool, no CUDA context) and
no thread of its own; it only imports (once idle, also what torch.optim would import in every
worker: `_preload`). A worker forked from it is what `python -c WORKER_MAIN` would
be, with the controller's environment, working folder and sys.path of the moment it was asked for.

Where the controller itself could be that process, the server is a fork of it, and the first pool
starts in a tenth of a second instead of after a second's import (`_may_fork_controller`): its
only thread is the one that asks (plus the threads that importing torch starts, OpenBLAS's, which
the fresh server has too), so no thread pool, lock or CUDA driver of its is caught half-way; its
environment is the one its modules were imported with; and it is small (`FORK_RSS_LIMIT`: the
server and the workers keep the pages they share with it). `ss.load` forks it as it returns a
program on several devices (`fork_ahead`), before a script makes its data with torch; a notebook
kernel (threads of its own) or a process that ran torch's parallel ops (OpenMP's threads) gets a
fresh interpreter as its server. The fork keeps none of the controller's files and sockets
but its output, its garbage is frozen (never collected there: an object that closed its file would
close some other), and its signal handlers, output streams, warning filters and torch's default
dtype are what a fresh interpreter's are.

The server is keyed by the environment it started with: modules read some variables as they import
(SHAPESCRIPT_OVERLAP, OMP_NUM_THREADS in torch's OpenMP), so a controller whose environment has
changed since gets a new server (and the old one ends); variables no import reads
(`NOT_READ_AT_IMPORT`, such as pytest's PYTEST_CURRENT_TEST) are left out of the key. The worker's exit status, which only its
parent can read, the server writes to a file of the pool's private folder as it reaps it.
$SHAPESCRIPT_FORK_SERVER=fresh always starts the server as a fresh interpreter; =off starts every
worker as one, as before there was a server.
"""

from __future__ import annotations

import abc
import atexit
import gc
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any, cast

from shapescript.parallel import spin
from shapescript.parallel.pipeline import PIPELINE_ENV
from shapescript.parallel.processes import TIMEOUT_ENV, UNKNOWN_EXIT, WorkerProcess, proc_state
from shapescript.parallel.timeline import TIMELINE_ENV
from shapescript.runtime import shm_reduce
from shapescript.runtime.leftovers import write_whole

ENV = "SHAPESCRIPT_FORK_SERVER"
# The variables a pool sets for its own workers: not part of what the server's imports saw.
PER_POOL = ("PYTHONPATH", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
# Variables that change while a controller runs and that no module reads as it imports: a server
# started before one changed serves as well, since each worker is given its pool's whole environment
# as it is forked. pytest sets PYTEST_CURRENT_TEST for every test, so under pytest a key holding it
# started a fresh server (an import of torch: seconds of CPU) for each test that made a pool; a shell
# sets PWD, OLDPWD and `_` for each command.
# Our own settings that are read as they are used (a pool's start, a call), not as modules import,
# belong here too: a test that sets one for a pool, or a pipeline off and on, would otherwise start a
# fresh server, whose first pool's workers each import torch._dynamo for themselves (`_preload`).
NOT_READ_AT_IMPORT = ("PYTEST_CURRENT_TEST", "PWD", "OLDPWD", "_", PIPELINE_ENV, TIMELINE_ENV, TIMEOUT_ENV,
                      spin.ENV, shm_reduce.ENV)
READY_TIMEOUT = 300.0  # seconds the server has to import torch before the pool starts workers itself
# Once ready, the server waits this long without a request before importing more (`_preload`): not in
# the way of the first pool's forks, which come at once (the first call after `ss.load`). Not longer:
# a server that forks a pool every few seconds (a test suite, a notebook's restarts) was never idle
# for 3 s, and each of its pools' workers imported torch._dynamo for itself, 1.4 s each at once.
PRELOAD_WHEN_IDLE_S = 0.5
EXIT_GRACE = 1.0  # seconds the server has to report a worker's end, once the process is gone


# A controller larger than this (resident) starts a fresh server instead of forking one: the server
# and its workers would keep every page they share with it, freed by the controller or not.
FORK_RSS_LIMIT = 2 << 30


def _setting() -> str:
    return os.environ.get(ENV, "on").strip().lower()


def enabled() -> bool:
    return _setting() not in ("off", "0", "no", "false")


def _key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if k not in PER_POOL and k not in NOT_READ_AT_IMPORT))


def _tasks() -> int:
    """This process's threads, as the kernel counts them (Python's and those of libraries); 0 if unknown."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _mapped_libraries() -> set[str] | None:
    """The paths of the shared libraries this process has loaded; None if unknown."""
    try:
        with open("/proc/self/maps") as f:
            return {fields[-1] for fields in map(str.split, f) if len(fields) == 6 and ".so" in fields[-1]}
    except OSError:
        return None


def _openblas_threads(libraries: set[str]) -> int | None:
    """The threads that the OpenBLAS among `libraries` (numpy's, which torch imports) started as it
    loaded: its thread count less the caller's; 0 if there is none, None if one can't be asked. It
    stops them around a fork (pthread_atfork), so they are no reason not to fork."""
    import ctypes
    threads = 0
    for path in libraries:
        if "openblas" not in os.path.basename(path).lower():
            continue
        try:
            lib = ctypes.CDLL(path)  # loaded already: this only looks it up
        except OSError:
            return None
        getters = [getattr(lib, name) for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                                                   "scipy_openblas_get_num_threads", "openblas_get_num_threads")
                   if hasattr(lib, name)]
        if not getters:
            return None
        threads += max(0, getters[0]() - 1)
    return threads


# The environment this process had as shapescript imported (its modules read some of it then).
_IMPORTED_WITH = _key(os.environ)
_STARTUP_WARNING_FILTERS = list(warnings.filters)


def _may_fork_controller(env: Mapping[str, str]) -> bool:
    """Whether this controller may fork itself as the server of workers with environment `env`: its
    only threads are this one and OpenBLAS's (no OpenMP pool of torch's: a fork of a process that has
    one hangs in its next parallel region), the environment its modules read at import, no CUDA
    driver loaded, and resident memory under FORK_RSS_LIMIT."""
    if _setting() == "fresh" or threading.active_count() != 1:
        return False
    if _key(env) != _IMPORTED_WITH:  # env is os.environ and the pool's own variables, which the key leaves out
        return False
    libraries = _mapped_libraries()
    # CUDA's driver, once loaded (torch.cuda.device_count() loads it too), doesn't work in a fork
    if libraries is None or any(os.path.basename(path).startswith("libcuda.") for path in libraries):
        return False
    blas = _openblas_threads(libraries)
    if blas is None or _tasks() != 1 + blas:
        return False
    try:
        with open("/proc/self/statm") as f:
            resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return False
    return resident <= FORK_RSS_LIMIT


class _Process(abc.ABC):
    """What is asked of a `subprocess.Popen` (pid, `poll`, `wait`, signals), for a process started by
    a fork: a subclass says how `poll` learns its exit status."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    @abc.abstractmethod
    def poll(self) -> int | None:
        """The exit status once the process has ended (kept in `returncode`), else None."""

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"process {self.pid}", timeout or 0.0)
            time.sleep(0.002)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkedWorker(_Process):
    """A worker the server forked: its exit status comes from the file the server writes."""

    def __init__(self, pid: int, exit_path: str, server: ForkServer) -> None:
        super().__init__(pid)
        self.exit_path = exit_path
        self._server = server
        self._gone_at: float | None = None  # when the process was first seen gone without a status

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                with open(self.exit_path, "rb") as f:
                    self.returncode = int(f.read())
            except (OSError, ValueError):
                if not self._server.alive() and not _exists(self.pid):
                    # its parent is gone: no one can read its status now
                    now = time.monotonic()
                    self._gone_at = self._gone_at or now
                    if now - self._gone_at >= EXIT_GRACE:
                        self.returncode = UNKNOWN_EXIT
        return self.returncode


class ControllerFork(_Process):
    """The server where it is a fork of the controller (`_fork_as_server`): its child, reaped here."""

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by `reap`, or by someone else's waitpid(-1)
                if self.returncode is None:
                    self.returncode = UNKNOWN_EXIT
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def reap(self) -> None:
        """Wait for the server to end, and reap it (ForkServer's reaper thread)."""
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            return
        self.returncode = os.waitstatus_to_exitcode(status)


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _exists(pid: int) -> bool:
    """Whether process `pid` is still running: not a zombie that no one reaps (an orphan of a
    killed server waits for whatever adopts orphans)."""
    return proc_state(pid) not in (None, b"Z", b"X")


class ForkServer:
    """The server process, as the controller sees it: started at once, ready once it has imported."""

    def __init__(self, env: Mapping[str, str], cwd: str) -> None:
        from shapescript.parallel.worker import SERVER_MAIN
        self.key = _key(env)
        self._control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc: subprocess.Popen[bytes] | ControllerFork = (
                _fork_as_server(theirs.fileno(), cwd) if _may_fork_controller(env) else
                subprocess.Popen([sys.executable, "-c", SERVER_MAIN, "--fd", str(theirs.fileno()),
                                  "--parent", str(os.getpid())], pass_fds=(theirs.fileno(),), env=dict(env), cwd=cwd))
        finally:
            theirs.close()
        self._lock = threading.Lock()  # one fork request at a time
        self._ready: bool | None = None  # None until the server says it is ready (or fails)
        # Reaped as soon as it ends, however it ends: a zombie counts as a live child to whoever waits
        # for this process's children, as a Jupyter kernel does when it is shut down (it sends them
        # SIGTERM and waited out its 2.5 s for the server, then was SIGTERMed itself: no atexit ran).
        reap = self.proc.reap if isinstance(self.proc, ControllerFork) else self.proc.wait
        threading.Thread(target=reap, name="shapescript-fork-server-reaper", daemon=True).start()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self, timeout: float) -> bool:
        """Whether the server is ready to fork, waiting up to `timeout` seconds for its imports. A
        server that ends first, or isn't ready after READY_TIMEOUT, is given up (closed)."""
        with self._lock:
            if self._ready is None:
                if select.select([self._control], [], [], timeout)[0]:
                    try:
                        self._ready = self._control.recv(16) == b"ready"
                    except OSError:
                        self._ready = False
                elif timeout >= READY_TIMEOUT:
                    self._ready = False
                if self._ready is False:
                    self.close()
            return bool(self._ready)

    def fork(self, fd: int, env: Mapping[str, str], sys_path: Sequence[str], cwd: str, exit_path: str
             ) -> ForkedWorker:
        """A worker forked with `fd`, its end of the socket pair, as `python -c WORKER_MAIN --fd`
        gets it; OSError if the server can't."""
        stdio = [n for n in (1, 2) if _open(n)]  # where a fresh interpreter's output would go: ours now
        request = pickle.dumps({"env": dict(env), "sys_path": list(sys_path), "cwd": cwd, "exit_path": exit_path,
                                "stdio": stdio})
        with self._lock:
            if not self._ready:
                raise OSError("the fork server isn't running")
            socket.send_fds(self._control, [request], [fd, *stdio])
            reply = self._control.recv(64)
        if not reply.startswith(b"pid "):
            raise OSError(f"the fork server couldn't fork a worker: {reply.decode(errors='replace') or 'it ended'}")
        return ForkedWorker(int(reply[4:]), exit_path, self)

    def close(self) -> None:
        """End the server (its socket closes); the workers it forked go on, each watching its controller."""
        self._ready = False
        self._control.close()
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_server: ForkServer | None = None
_server_pid = 0  # the controller that started it: a forked child of it starts its own
_server_lock = threading.Lock()


def server_for(env: Mapping[str, str], cwd: str) -> ForkServer | None:
    """This controller's fork server for workers with environment `env` (started now if there is none
    for it, or replacing one started with another); None where workers start as fresh interpreters
    ($SHAPESCRIPT_FORK_SERVER=off, or no pidfds: a worker forked by the server watches its
    controller through one)."""
    global _server, _server_pid
    if not enabled() or not _pidfds():
        return None
    with _server_lock:
        if _server is not None and _server_pid == os.getpid():
            if _server.key == _key(env) and _server.alive() and _server._ready is not False:
                return _server
            _server.close()
        try:
            _server, _server_pid = ForkServer(env, cwd), os.getpid()
        except OSError:
            _server = None
        else:  # at exit it would end by itself; closing it then also leaves no socket or child behind
            atexit.unregister(stop_server)  # once, however many servers this controller starts
            atexit.register(stop_server)
        return _server


def fork_ahead(env: Mapping[str, str], cwd: str) -> None:
    """Start the server now if this controller may fork itself as it (`_may_fork_controller`), which it
    may no longer be by its first pool: a script that loads its program and then makes its data with
    torch has started OpenMP's threads by then. `ss.load` calls this for a program on several devices."""
    if enabled() and _pidfds() and _may_fork_controller(env):
        server_for(env, cwd)


def _pidfds() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):  # not Linux >= 5.3
        return False
    return hasattr(socket, "send_fds")


def start_worker(rank: int, label: str, server: ForkServer | None, env: Mapping[str, str], sys_path: Sequence[str],
                 folder: str) -> WorkerProcess:
    """Worker `rank`'s process: forked by `server`, or where there is none (or it can't fork) a fresh
    interpreter running WORKER_MAIN; with its end of a new socket pair and a pidfd of it (None where
    there are none)."""
    from shapescript.parallel.worker import WORKER_MAIN
    started: tuple[Any, socket.socket] | None = None
    if server is not None:
        exit_path = os.path.join(folder, f"exit-{rank}")
        try:
            started = _with_socket(lambda fd: server.fork(fd, env, sys_path, os.getcwd(), exit_path))
        except OSError:  # it ended, or can't fork: closed, so that the next pool starts a new one
            server.close()
    if started is None:  # slower, but the same worker
        started = _with_socket(lambda fd: subprocess.Popen(
            [sys.executable, "-c", WORKER_MAIN, "--fd", str(fd), "--parent", str(os.getpid())],
            pass_fds=(fd,), env=dict(env)))
    proc, ours = started
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None  # not Linux >= 5.3: the wait loop polls the processes instead
    return WorkerProcess(rank, label, proc, Connection(ours.detach()), pidfd, os.path.join(folder, f"status-{rank}"))


def _with_socket(start: Callable[[int], Any]) -> tuple[Any, socket.socket]:
    """A process started by `start` with its end of a new socket pair (closed here once it has it,
    whatever happens), and our end. A new pair each try: a failed try may have handed its end on."""
    ours, theirs = socket.socketpair()
    try:
        return start(theirs.fileno()), ours
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()


def stop_server() -> None:
    """End this controller's fork server, if it has one (at exit, and for tests)."""
    global _server
    with _server_lock:
        if _server is not None and _server_pid == os.getpid():
            _server.close()
        _server = None


# -- the server process ------------------------------------------------------------------------------

def _fork_as_server(fd: int, cwd: str) -> ControllerFork:
    """This controller, forked, as the server on its end `fd` of the control socket; it has no other
    file of the controller's but its output, and is otherwise what a fresh interpreter running
    SERVER_MAIN would be (`_as_fresh_interpreter`)."""
    controller = os.getpid()
    with warnings.catch_warnings():  # Python 3.12's about forking with threads: OpenBLAS's, see above
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        try:
            gc.freeze()  # the controller's objects are never collected here: see the module's docstring
            os.closerange(3, fd)
            os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX"))
            _as_fresh_interpreter()
            os.chdir(cwd)
            import shapescript.parallel.program_handlers
            import shapescript.parallel.worker
            import shapescript.runtime.core  # noqa: F401
            serve(["--fd", str(fd), "--parent", str(controller)])
        finally:
            os._exit(1)
    return ControllerFork(pid)


def _as_fresh_interpreter() -> None:
    """In a fork of the controller: the interpreter's state that the controller may have changed, as a
    fresh one has it, where a worker would see it."""
    global _server, _server_lock
    import faulthandler
    faulthandler.disable()  # its file, if any, is closed here
    for sig in signal.valid_signals():
        if callable(signal.getsignal(sig)):  # Python code of the controller's
            signal.signal(sig, signal.SIG_DFL)
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
    cast(list, warnings.filters)[:] = _STARTUP_WARNING_FILTERS  # in place: the C side holds the list
    getattr(warnings, "_filters_mutated", lambda: None)()
    torch = sys.modules["torch"]
    torch.set_default_dtype(torch.float32)
    _server, _server_lock = None, threading.Lock()  # the controller's, held as it forked


def serve(argv: list[str]) -> None:
    """The server's life (SERVER_MAIN runs it, with torch and the worker's modules imported): fork a
    worker for each request, reap the ones that end, and end when the controller's socket closes."""
    control = socket.socket(fileno=int(argv[argv.index("--fd") + 1]))
    controller = int(argv[argv.index("--parent") + 1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # its byte on the wakeup pipe is what counts
    exits: dict[int, str] = {}  # pid -> where its exit status goes
    # The controller's end of the socket closes when it ends, unless a process it forked holds a copy
    # (a DataLoader's workers, say): its pidfd says so in any case.
    watched = [control.fileno(), wake_read, os.pidfd_open(controller)]
    control.send(b"ready")
    preloaded = False
    while True:
        ready = select.select(watched, [], [], None if preloaded else PRELOAD_WHEN_IDLE_S)[0]
        if not ready:  # idle: what every worker would otherwise import for itself, once here
            preloaded = True
            _preload()
            continue
        if watched[2] in ready:
            os._exit(0)
        if wake_read in ready:
            os.read(wake_read, 4096)
            _reap(exits)
        if control.fileno() in ready:
            try:
                message, fds, _, _ = socket.recv_fds(control, 1 << 20, 3)
            except OSError:
                message, fds = b"", []
            if not message:
                os._exit(0)  # the controller closed its end, or ended
            request: dict[str, Any] = pickle.loads(message)  # from the controller, over its own socket pair
            try:
                pid = os.fork()
            except OSError as exc:
                for fd in fds:
                    os.close(fd)
                control.send(f"error {exc}".encode())
                continue
            if pid == 0:
                _become_worker(request, fds, controller, (control.fileno(), wake_read, wake_write, watched[2]))
            for fd in fds:
                os.close(fd)
            exits[pid] = request["exit_path"]
            control.send(f"pid {pid}".encode())


def _preload() -> None:
    """Import torch._dynamo, which torch.optim imports as it makes its first optimizer (its methods
    are marked not to be compiled): about 1.4 s a process, that is, a worker's first `ss.adamw`.
    Workers forked after this get it for nothing. Importing starts no thread, so forking stays safe."""
    try:
        import torch._dynamo  # noqa: F401
    except Exception:
        pass


def _reap(exits: dict[int, str]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        path = exits.pop(pid, None)
        if path is not None:
            try:  # written whole, then renamed: the controller never reads half of it
                write_whole(path, str(os.waitstatus_to_exitcode(status)).encode())
            except OSError:
                pass  # its pool's folder is gone: the pool has stopped


def _become_worker(request: dict[str, Any], fds: list[int], controller: int, server_fds: tuple[int, ...]) -> None:
    """In the forked child: drop the server's state, take the controller's (its output included),
    and run the worker on `fds[0]`."""
    try:
        signal.set_wakeup_fd(-1)
        for fd_of_server in server_fds:
            os.close(fd_of_server)
        for target, given in zip(request["stdio"], fds[1:]):
            os.dup2(given, target)
            os.close(given)
        fd = fds[0]
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["sys_path"]
        sys.argv = ["-c"]
        from shapescript.parallel.worker import main
        main(["--fd", str(fd), "--parent", str(controller), "--forked"])
    finally:
        os._exit(1)
