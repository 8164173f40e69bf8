"""The worker processes as the controller sees them: the collective timeout, each process's
state, how it stopped, and how a pool's processes and private folder are ended and swept away.
`pool.WorkerPool` drives them."""

from __future__ import annotations

import math
import numbers
import os
import pickle
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from shapescript.errors import WorkerError
from shapescript.parallel.messages import Reply, Status, Stop, reply_from, wire
from shapescript.parallel.worker import dumps, read_status
from shapescript.runtime.leftovers import sweep

DEFAULT_TIMEOUT = 600.0
MAX_TIMEOUT = 7 * 24 * 3600.0
TIMEOUT_ENV = "SHAPESCRIPT_COLLECTIVE_TIMEOUT"
_timeout_override: float | None = None


def timeout_seconds(value: object, what: str) -> float:
    """A collective timeout, checked: a positive number of seconds up to MAX_TIMEOUT (beyond, or
    infinite, the process group's timedelta overflows as the workers start)."""
    seconds = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    if not 0 < seconds <= MAX_TIMEOUT:
        raise ValueError(f"{what} must be a positive number of seconds, at most {MAX_TIMEOUT:.0f} (7 days), "
                         f"not {value!r}")
    return seconds


def collective_timeout(seconds: float | None) -> None:
    """Set how long a worker waits for the others at a collective, for pools started afterwards
    (None: back to $SHAPESCRIPT_COLLECTIVE_TIMEOUT, or 600 s)."""
    global _timeout_override
    _timeout_override = None if seconds is None else timeout_seconds(seconds, "the collective timeout")


def current_collective_timeout() -> float:
    """The collective timeout a pool started now gets."""
    if _timeout_override is not None:
        return _timeout_override
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value: object = float(text)
    except ValueError:
        value = text
    return timeout_seconds(value, f"${TIMEOUT_ENV}")


def ranks_text(ranks: Sequence[int]) -> str:
    """"worker 1", "workers 1 and 2", "workers 0, 1 and 2"."""
    if len(ranks) == 1:
        return f"worker {ranks[0]}"
    return "workers " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def loopback() -> str:
    names = [name for _, name in socket.if_nameindex()]
    return "lo0" if "lo0" in names and "lo" not in names else "lo"


def proc_state(pid: int) -> bytes | None:
    """Linux's one-letter state of process `pid` from /proc/PID/stat (R, S, T, Z...); None where it
    is gone or there is no /proc. The name before it is in parentheses and may hold any character."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def is_stopped(pid: int) -> bool:
    """Whether a process is stopped (SIGSTOP, Ctrl-Z, a debugger): its state is T or t."""
    return proc_state(pid) in (b"T", b"t")


def how_it_stopped(returncode: int | None, pid: int | None = None) -> str:
    """"it was killed by SIGKILL (perhaps out of memory)", "it exited with code 3": a worker's end
    from its exit status (negative: the signal). A SIGKILL that the kernel log (if readable) says
    its OOM killer sent to `pid` says so."""
    if returncode is None:
        return "its connection to the controller closed"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if name != "SIGKILL":
            return f"it was killed by {name}"
        if pid is not None and oom_killed(pid):
            return "it was killed by SIGKILL from the kernel's OOM killer: the system ran out of memory"
        return "it was killed by SIGKILL (perhaps out of memory)"
    return f"it exited with code {returncode}"


KERNEL_LOG = "/dev/kmsg"
_MAX_RECORDS = 1 << 20  # a bound on reading the kernel's ring buffer, which holds far fewer


def oom_killed(pid: int, log: str | None = None) -> bool:
    """Whether the kernel log says its OOM killer ended process `pid`: "Out of memory: Killed process
    1234 (python)" or "oom-kill:...,pid=1234,...". False where the log can't be read without
    privileges (kernel.dmesg_restrict) or isn't there. A pid used again since could match an older
    record: the message says so only of a process that did die of SIGKILL. `log`: KERNEL_LOG."""
    log = log if log is not None else KERNEL_LOG
    said = re.compile(rf"(Killed process {pid} \(|[,:]pid={pid}[,\s])".encode())
    try:
        if not stat.S_ISCHR(os.stat(log).st_mode):  # a saved log (a test's): its lines
            with open(log, "rb") as f:
                return any(said.search(line) for line in f)
        fd = os.open(log, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        for _ in range(_MAX_RECORDS):  # /dev/kmsg gives one record per read, then EAGAIN at the end
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                return False
            except BrokenPipeError:  # records overwritten while we read: go on with the next ones
                continue
            except OSError:
                return False
            if said.search(record):
                return True
        return False
    finally:
        os.close(fd)


STOPPED_BY_CONTROLLER = "stopped by the controller"  # a WorkerExit's `how` for a worker that was alive
UNKNOWN_EXIT = -256  # the returncode of a worker whose status was lost with the fork server that forked it


@dataclass(frozen=True)
class WorkerExit:
    """How one worker of a pool ended, for `%shapescript status` once the pool is gone."""

    rank: int
    label: str
    pid: int
    how: str  # how_it_stopped's words, or STOPPED_BY_CONTROLLER


@dataclass(eq=False)
class WorkerProcess:
    rank: int
    label: str  # the device as the devices line names it: cpu:1, cuda:2
    proc: subprocess.Popen[bytes]
    conn: Connection
    pidfd: int | None  # readable once the process ends: its death wakes the controller at once
    status_path: str

    def dead(self) -> bool:
        return self.proc.poll() is not None

    def status(self) -> tuple[str, str]:
        """What the worker is doing, from its status file (worker.read_status); ("", "") if unknown."""
        return read_status(self.status_path)

    def stopped(self) -> bool:
        """Whether its process is stopped (SIGSTOP, Ctrl-Z, a debugger)."""
        return is_stopped(self.proc.pid)

    def named(self) -> str:
        """How a report's table names it: "worker 1" (a worker elsewhere adds where it is)."""
        return f"worker {self.rank}"

    def how_it_stopped(self) -> str:
        try:
            code = self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            code = None
        return how_it_stopped(code if code != UNKNOWN_EXIT else None, self.proc.pid)

    def reply(self, data: bytes) -> Reply:
        """One of its replies, read; one that can't be (a result whose class the controller can't
        import) as its error."""
        try:
            return reply_from(pickle.loads(data))
        except Exception as exc:
            error = WorkerError(f"worker {self.rank} ({self.label})'s answer can't be read: {type(exc).__name__}: {exc}")
            return Reply(Status.ERR, {"type": "WorkerError", "message": str(error), "traceback": "", "status": "",
                                      "collective": False, "pickled": dumps(error)})


def shutdown(workers: list[WorkerProcess], folder: str | None, grace: float, owner: int) -> None:
    """Stop every worker: a stop message and `grace` seconds to exit (none if 0), then SIGTERM, then
    SIGKILL; close everything and remove the private folder. Safe to call twice. Does nothing in a
    process other than `owner`, the one that started them: a forked child inherits this (as a
    finalizer that runs at its exit) with the sockets, but the workers are its parent's."""
    if os.getpid() != owner:
        return
    for w in workers:  # a stopped worker (SIGSTOP, Ctrl-Z) reads no message and heeds no signal but SIGKILL
        w.proc.send_signal(signal.SIGCONT)
    if grace > 0:
        for w in workers:
            try:
                w.conn.send_bytes(dumps(wire(Stop())))
            except (OSError, ValueError):
                pass  # already gone
    for sig_grace, act in ((grace, "terminate"), (1.0, "kill"), (5.0, None)):
        deadline = time.monotonic() + sig_grace
        for w in workers:
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        alive = [w for w in workers if w.proc.poll() is None]
        if not alive or act is None:
            break
        for w in alive:
            getattr(w.proc, act)()
    for w in workers:
        w.conn.close()
        if w.pidfd is not None:
            os.close(w.pidfd)
            w.pidfd = None
    workers.clear()
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


# A pool's private folder, named after its controller: shapescript-workers-<pid>-<start>-<random>.
FOLDER_NAME = re.compile(r"shapescript-workers-(?P<pid>\d+)-(?P<start>\d+)-[a-z0-9_]+")


def sweep_stale_folders() -> list[str]:
    """Remove the private folders of controllers that ended without removing theirs (killed before
    their workers could): this user's folders in the temp folder whose controller is gone. Returns
    the paths removed. Every pool runs it as it starts."""
    return sweep(tempfile.gettempdir(), FOLDER_NAME, folders=True)


def torch_settings() -> dict[str, Any]:
    """The controller's numerical settings, which the workers take so their floats agree with it.
    torch has no getter for flushing denormals: a denormal that a multiplication keeps tells."""
    import torch
    tiny = torch.tensor([1e-40], dtype=torch.float32)
    return {"flush_denormal": bool((tiny * 1.0).item() == 0.0),
            "matmul_precision": torch.get_float32_matmul_precision(),
            "deterministic": torch.are_deterministic_algorithms_enabled()}
