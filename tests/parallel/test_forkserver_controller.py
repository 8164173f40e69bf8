"""The fork server as a fork of the controller (parallel/forkserver.py `_may_fork_controller`): a
small, single-threaded controller forks itself as the server, so its first pool starts without a
second import of torch; the server keeps none of its files, and the workers see a fresh interpreter's
signal handlers, output, warning filters and default dtype and compute what one device does. A controller that
has run torch's parallel ops (OpenMP's threads: a fork of it would hang in its next parallel region)
or started a thread gets a fresh interpreter as its server.

Each case runs its own controller, a fresh interpreter: the test process has run torch's ops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from test_forkserver import PROGRAM as ROWS  # its `centered`; the probe is this file's own

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROWS.split("fn env_value")[0] + """\
fn fresh(x: [n]) -> [n] = x * looks_fresh(x)

extern fn looks_fresh(x: [n]) -> [] = "ss_fresh_probe.looks_fresh"
"""
PROBE = """\
import signal
import sys
import warnings

import torch

def looks_fresh(x):
    # 1 where the worker has what a fresh interpreter has: no Python handler of the controller's
    # for SIGUSR1, output on the interpreter's own streams, no "error" warning filter, float32
    fresh = (signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL and sys.stdout is sys.__stdout__
             and not any(f[0] == "error" for f in warnings.filters) and torch.get_default_dtype() == torch.float32)
    return torch.tensor(float(fresh))
"""
CONTROLLER = """\
import io, json, os, signal, sys, threading, time, warnings
import torch
import shapescript as ss
from shapescript.parallel import forkserver

before = sys.argv[2]
held = open("held.txt", "w")  # a file of the controller's, open as it forks
if before == "matmul":  # torch's OpenMP threads start
    torch.set_num_threads(2)
    torch.randn(300, 300) @ torch.randn(300, 300)
elif before == "thread":
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
signal.signal(signal.SIGUSR1, lambda *_: None)
warnings.simplefilter("error")
sys.stdout = io.StringIO()  # a harness capturing the controller's output
x = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
torch.set_default_dtype(torch.float64)
prog = ss.load(sys.argv[1], devices="cpu[0 1]", name="fork.ss")
if before == "matmul after loading":  # the script makes its data before the first call starts the workers
    torch.set_num_threads(2)
    torch.randn(300, 300) @ torch.randn(300, 300)
several = prog.centered({"x": x})
torch.set_default_dtype(torch.float32)
one = ss.load(sys.argv[1], devices="cpu", name="fork.ss").centered({"x": x})
server = forkserver._server
report = {"forked": isinstance(server.proc, forkserver.ControllerFork), "server": server.proc.pid,
          "workers": list(prog.pool.pids), "fresh": prog.fresh(torch.ones(2)).tolist(),
          "difference": float((several - one).abs().max())}
prog.stop()
sys.__stdout__.write(json.dumps(report) + "\\n")
"""


def controller(tmp_path: Path, before: str) -> dict:
    (tmp_path / "fork.ss").write_text(PROGRAM)
    (tmp_path / "ss_fresh_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "SHAPESCRIPT_FORK_SERVER"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(tmp_path)])
    done = subprocess.run([sys.executable, "-c", CONTROLLER, str(tmp_path / "fork.ss"), before], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("before", ["nothing", "matmul after loading"])
def test_a_quiet_controller_forks_itself_as_the_server_and_its_workers_look_fresh(tmp_path: Path, before: str) -> None:
    """Forked as `ss.load` returns: torch's threads started after it don't matter."""
    report = controller(tmp_path, before)
    assert report["forked"]
    assert report["fresh"] == [1.0, 1.0]
    assert report["difference"] < 1e-6  # what one device computes


@pytest.mark.slow
@pytest.mark.parametrize("before", ["matmul", "thread"])
def test_a_controller_with_threads_gets_a_fresh_server(tmp_path: Path, before: str) -> None:
    report = controller(tmp_path, before)
    assert not report["forked"]
    assert report["fresh"] == [1.0, 1.0]
    assert report["difference"] < 1e-6


def test_the_forked_server_keeps_none_of_the_controllers_files(tmp_path: Path) -> None:
    """Checked while the server runs: a controller that stays alive and prints its server's pid."""
    script = textwrap.dedent("""\
        import sys, time
        import torch
        import shapescript as ss
        from shapescript.parallel import forkserver
        held = open("held.txt", "w")
        prog = ss.load(sys.argv[1], devices="cpu[0 1]", name="fork.ss")
        prog.centered({"x": torch.zeros(2, 3)})
        print(isinstance(forkserver._server.proc, forkserver.ControllerFork), forkserver._server.proc.pid, flush=True)
        sys.stdin.read()
        """)
    (tmp_path / "fork.ss").write_text(PROGRAM.split("\nfn fresh")[0] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "SHAPESCRIPT_FORK_SERVER"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "fork.ss")], cwd=tmp_path, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        forked, pid = proc.stdout.readline().split()
        assert forked == "True"
        server = psutil.Process(int(pid))
        assert server.ppid() == proc.pid
        files = [f.path for f in server.open_files()]
        assert not any(path.endswith("held.txt") for path in files), files
        controllers = {f.path for f in psutil.Process(proc.pid).open_files()}
        assert any(path.endswith("held.txt") for path in controllers)  # the check could see it
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        server.wait(timeout=10)  # the server ends with its controller
    finally:
        proc.kill()
        proc.wait()
