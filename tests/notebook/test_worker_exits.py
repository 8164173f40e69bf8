"""How the notebook says a worker stopped: `%shapescript status` after a worker of a cpu[0 1] program
is killed (a Session without a kernel, as test_session.py), and processes.py's wording of an exit
status and of the kernel log's OOM killer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from shapescript.errors import WorkerError
from shapescript.notebook.cells import Cell
from shapescript.notebook.session import Session
from shapescript.parallel.processes import STOPPED_BY_CONTROLLER, how_it_stopped, oom_killed

PROGRAM = "%%shapescript\ndevices cpu[0 1]\nfn double(x: [4]) -> [4] = x * 2.0\n"


def _ended(code: str) -> int:
    """The exit status of a Python process running `code`, as Popen reports it."""
    return subprocess.run([sys.executable, "-c", code], check=False).returncode


def _wait_dead(pid: int) -> None:
    """Until the worker `pid` has ended (a zombie, or reaped by the fork server that forked it); not
    reaped here, so that whoever started it reads its status."""
    deadline = time.monotonic() + 10
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        assert time.monotonic() < deadline, f"worker {pid} still runs"
        time.sleep(0.01)


def test_a_killed_worker_is_named_with_its_signal_in_status() -> None:
    ns: dict[str, Any] = {}
    session = Session(ns)
    try:
        session.run_cell(Cell("cell [1]", PROGRAM, first_line=2))
        assert ns["double"](torch.ones(4)).tolist() == [2.0] * 4  # the workers run
        pool = session.program.pool
        assert pool is not None and "running" in session.status().text
        killed, other = pool.pids[1], pool.pids[0]
        os.kill(killed, signal.SIGKILL)
        _wait_dead(killed)

        for _ in range(2):  # the status that finds the worker gone, and every one after it
            status = session.status().text
            assert "workers on cpu[0 1]: stopped" in status, status
            by_rank = {line.split()[0]: line for line in status.splitlines()[2:4]}
            assert str(killed) in by_rank["1"] and "killed by SIGKILL" in by_rank["1"], status
            assert str(other) in by_rank["0"] and STOPPED_BY_CONTROLLER in by_rank["0"], status
            assert "Worker 1 (cpu:1) stopped: it was killed by SIGKILL" in status

        # The next call starts new workers, and status shows them running.
        assert ns["double"](torch.ones(4)).tolist() == [2.0] * 4
        status = session.status().text
        assert "workers on cpu[0 1]: running" in status and "SIGKILL" not in status
    finally:
        session.shutdown()


def test_a_worker_killed_during_a_call_raises_with_its_signal() -> None:
    ns: dict[str, Any] = {}
    session = Session(ns)
    try:
        session.run_cell(Cell("cell [1]", PROGRAM, first_line=2))
        ns["double"](torch.ones(4))
        pool = session.program.pool
        assert pool is not None
        os.kill(pool.pids[0], signal.SIGTERM)  # its watching thread ends it (worker.py), a moment later
        _wait_dead(pool.pids[0])
        with pytest.raises(WorkerError, match="worker 0 .*it was killed by SIGTERM"):
            ns["double"](torch.ones(4))
        assert "it was killed by SIGTERM" in session.status().text
    finally:
        session.shutdown()


def test_an_exit_status_is_worded_from_what_popen_reports() -> None:
    assert how_it_stopped(_ended("import sys; sys.exit(3)")) == "it exited with code 3"
    assert how_it_stopped(_ended("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")) == \
        "it was killed by SIGTERM"
    sigkill = _ended("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert sigkill == -signal.SIGKILL
    assert how_it_stopped(sigkill) == "it was killed by SIGKILL (perhaps out of memory)"
    assert how_it_stopped(None) == "its connection to the controller closed"


def test_the_oom_killer_is_named_when_the_kernel_log_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "kmsg"
    log.write_bytes(b"6,1021,5321000,-;Out of memory: Killed process 4242 (python3) total-vm:9000kB\n"
                    b"6,1022,5321100,-;oom-kill:constraint=CONSTRAINT_MEMCG,task=python3,pid=777,uid=0\n")
    assert oom_killed(4242, str(log)) and oom_killed(777, str(log))
    assert not oom_killed(424, str(log)) and not oom_killed(42, str(log))  # no prefix of a pid
    assert not oom_killed(4242, str(tmp_path / "absent"))
    monkeypatch.setattr("shapescript.parallel.processes.KERNEL_LOG", str(log))
    assert how_it_stopped(-signal.SIGKILL, 4242) == \
        "it was killed by SIGKILL from the kernel's OOM killer: the system ran out of memory"
    assert how_it_stopped(-signal.SIGKILL, 4243) == "it was killed by SIGKILL (perhaps out of memory)"
