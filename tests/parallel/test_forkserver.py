"""The fork server (parallel/forkserver.py): workers forked from one process that imported torch once
compute what fresh interpreters compute, see the controller's environment, folder and sys.path of the
moment they start, report how they ended, and the server ends with its controller."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
import torch
from support import importable

import shapescript as ss
from shapescript.api import parse_devices
from shapescript.errors import WorkerError
from shapescript.parallel import forkserver
from shapescript.parallel.pool import WorkerPool
from shapescript.parallel.processes import proc_state

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = """\
dim D = 3

data Row:
    x: [D]

fn centered(batch: [b] Row) -> [b D] = batch.x - mean(batch.x, over=b)

fn env_value(x: [n]) -> [n] = x * probe_value(x)

extern fn probe_value(x: [n]) -> [] = "ss_fork_probe.value"
"""
PROBE = textwrap.dedent("""\
    import os
    import torch

    def value(x):
        # what the worker sees: its variable, and its working folder's marker file
        marker = open("marker.txt").read() if os.path.exists("marker.txt") else "0"
        return torch.tensor(float(os.environ.get("SS_FORK_PROBE", "0")) + float(marker))
    """)


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def parent_of(pid: int) -> int:
    return psutil.Process(pid).ppid()


@pytest.fixture
def probe(tmp_path: Path) -> Iterator[Path]:
    with importable(tmp_path, "ss_fork_probe", PROBE) as folder:
        yield folder


def load(devices: str) -> ss.Program:
    return ss.load(PROGRAM, devices=devices, name="fork.ss")


@pytest.mark.slow
def test_forked_workers_compute_what_fresh_ones_do(monkeypatch: pytest.MonkeyPatch, probe: Path) -> None:
    batch = {"x": torch.randn(7, 3, generator=torch.Generator().manual_seed(0))}
    answers = {}
    for how in ("on", "off"):
        monkeypatch.setenv(forkserver.ENV, how)
        prog = load("cpu[0 1]")
        try:
            prog.centered(batch)  # starts the workers
            parents = {parent_of(pid) for pid in prog.pool.pids}
            server = forkserver._server
            if how == "on":
                assert server is not None and parents == {server.proc.pid}
            else:
                assert parents == {os.getpid()}
            answers[how] = prog.centered(batch)
        finally:
            prog.stop()
    expected = batch["x"] - batch["x"].mean(0)
    torch.testing.assert_close(answers["on"], expected)
    torch.testing.assert_close(answers["off"], expected)


@pytest.mark.slow
def test_a_second_pool_forks_at_once_with_the_moments_folder_and_sys_path(tmp_path: Path, probe: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(forkserver.ENV, "on")
    first = load("cpu[0 1]")
    try:
        first.centered({"x": torch.zeros(2, 3)})
        server = forkserver._server
        assert server is not None
    finally:
        first.stop()
    # The probe's module is importable only through this test's sys.path entry, added after the
    # server may have started; the working folder is another one, with its own marker.
    work = tmp_path / "work"
    work.mkdir()
    (work / "marker.txt").write_text("0.5")
    monkeypatch.chdir(work)
    second = load("cpu[0 1 2]")
    try:
        x = torch.ones(3)
        assert second.env_value(x).tolist() == [0.5] * 3
        # forked by the same server: no interpreter imported torch again
        assert forkserver._server is server and {parent_of(p) for p in second.pool.pids} == {server.proc.pid}
    finally:
        second.stop()


@pytest.mark.slow
def test_a_changed_environment_gets_a_new_server(probe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(forkserver.ENV, "on")
    values = []
    servers = []
    for value in ("1", "2"):
        monkeypatch.setenv("SS_FORK_PROBE", value)
        prog = load("cpu[0 1]")
        try:
            values.append(prog.env_value(torch.ones(2)).tolist())
            servers.append(forkserver._server)
        finally:
            prog.stop()
    assert values == [[1.0, 1.0], [2.0, 2.0]]
    old, new = servers
    assert old is not new and new is not None and old is not None
    assert old.proc.poll() is not None  # the one started with the old environment has ended


def test_a_variable_no_import_reads_keeps_the_server_and_reaches_the_workers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest sets PYTEST_CURRENT_TEST for each test: a new value starts no new server (an import of
    torch each time), and the workers see the value of the moment all the same."""
    monkeypatch.setenv(forkserver.ENV, "on")
    source = PROGRAM.replace('"ss_fork_probe.value"', '"ss_fork_current.value"')
    seen, servers = [], []
    with importable(tmp_path, "ss_fork_current", """\
            import os
            import torch

            def value(x):
                return torch.tensor(float(os.environ["PYTEST_CURRENT_TEST"].split()[0]))
            """):
        for value in ("1", "2"):
            monkeypatch.setenv("PYTEST_CURRENT_TEST", f"{value} (call)")
            prog = ss.load(source, devices="cpu[0 1]", name="fork.ss")
            try:
                seen.append(prog.env_value(torch.ones(2)).tolist())
                servers.append(forkserver._server)
            finally:
                prog.stop()
    assert seen == [[1.0, 1.0], [2.0, 2.0]]
    assert servers[0] is not None and servers[0] is servers[1] and servers[0].alive()


@pytest.mark.slow
def test_a_forked_worker_that_exits_is_reported_with_its_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(forkserver.ENV, "on")
    source = textwrap.dedent("""\
        import os
        from shapescript.parallel.handlers import handler

        @handler("exit_with")
        def exit_with(state, code):
            if state.rank == 1:
                os._exit(code)
            return code
        """)
    with importable(tmp_path, "ss_fork_exit", source):
        pool = WorkerPool(parse_devices("cpu[0 1]"), modules=["ss_fork_exit"])
        try:
            pool.start()
            with pytest.raises(WorkerError, match=r"worker 1 \(cpu:1\) stopped .*it exited with code 7"):
                pool.call("exit_with", (7,), where="exiting")
        finally:
            pool.stop()
    assert [e.how for e in pool.exits] == ["stopped by the controller", "it exited with code 7"]


CONTROLLER = """
import os, sys, time
import shapescript as ss
from shapescript.parallel import forkserver
prog = ss.load(sys.argv[1], devices="cpu[0 1]", name="fork.ss")
prog.centered({"x": __import__("torch").zeros(2, 3)})
print(forkserver._server.proc.pid, *prog.pool.pids, flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_the_server_and_its_workers_end_with_a_killed_controller(tmp_path: Path) -> None:
    program = tmp_path / "fork.ss"
    program.write_text(PROGRAM.replace('extern fn probe_value(x: [n]) -> [] = "ss_fork_probe.value"\n', "")
                       .replace("fn env_value(x: [n]) -> [n] = x * probe_value(x)\n", ""))
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{forkserver.ENV: "on"})
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(program)], stdout=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path)
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 3
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while any(running(p) for p in pids):
            assert time.monotonic() < deadline, "the fork server or a worker outlived its controller"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass



@contextmanager
def output_to(path: Path) -> Iterator[None]:
    """This process's fds 1 and 2 on `path` (appended), as a terminal or a notebook's pipe would be."""
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


@pytest.mark.slow
def test_a_forked_worker_prints_where_the_controller_prints_now(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """As a fresh interpreter would, though the server started with other output."""
    monkeypatch.setenv(forkserver.ENV, "on")
    source = textwrap.dedent("""\
        import os
        from shapescript.parallel.handlers import handler

        @handler("say")
        def say(state, word):  # one write each: the two workers write at once
            os.write(1, f"{word} from worker {state.rank}\\n".encode())
            os.write(2, f"{word} on stderr\\n".encode())
        """)
    then, now = tmp_path / "then.txt", tmp_path / "now.txt"
    forkserver.stop_server()  # the next pool starts one, with `then` as its output
    with importable(tmp_path, "ss_fork_say", source):
        for word, output in (("first", then), ("second", now)):
            with output_to(output):
                pool = WorkerPool(parse_devices("cpu[0 1]"), modules=["ss_fork_say"])
                try:
                    pool.start()
                    pool.call("say", (word,))
                    server = forkserver._server
                finally:
                    pool.stop()
    assert server is not None and server.alive()  # the second pool's workers came from the first's server
    for word, output in (("first", then), ("second", now)):
        lines = output.read_text().splitlines()
        assert sorted(line for line in lines if word in line) == [
            f"{word} from worker 0", f"{word} from worker 1", f"{word} on stderr", f"{word} on stderr"]
    assert "second" not in then.read_text()


@pytest.mark.slow
def test_a_killed_server_leaves_its_workers_working_and_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(forkserver.ENV, "on")
    pool = WorkerPool(parse_devices("cpu[0 1]"))
    try:
        pool.start()
        server = forkserver._server
        assert server is not None
        server.proc.kill()
        server.proc.wait()
        assert [answer["rank"] for answer in pool.call("ping", ())] == [0, 1]  # they watch the controller
        os.kill(pool.pids[1], signal.SIGKILL)
        # Its exit status went with the server (to whoever reaps orphans): the message says what is known.
        with pytest.raises(WorkerError, match=r"worker 1 \(cpu:1\) stopped while .*: its connection to the "
                                              r"controller closed"):
            pool.call("ping", ())
    finally:
        pool.stop()
    again = WorkerPool(parse_devices("cpu[0 1]"))
    try:
        again.start()
        assert forkserver._server is not server and forkserver._server is not None
        assert {parent_of(pid) for pid in again.pids} == {forkserver._server.proc.pid}
        assert len(again.call("ping", ())) == 2
    finally:
        again.stop()


@pytest.mark.slow
def test_a_server_that_cannot_fork_leaves_fresh_interpreters_to_start_the_workers(monkeypatch: pytest.MonkeyPatch
                                                                                  ) -> None:
    monkeypatch.setenv(forkserver.ENV, "on")
    forkserver.stop_server()
    tries: list[int] = []

    def refuse(server: forkserver.ForkServer, fd: int, *args: object) -> None:
        if server._ready:  # as the real one: a closed server is refused before it is asked
            tries.append(fd)
        raise OSError("the fork server couldn't fork a worker: [Errno 11] Resource temporarily unavailable")

    monkeypatch.setattr(forkserver.ForkServer, "fork", refuse)
    pool = WorkerPool(parse_devices("cpu[0 1]"))
    try:
        pool.start()
        server = forkserver._server
        assert len(tries) == 1 and server is not None and not server.alive()  # given up at the first refusal
        assert {parent_of(pid) for pid in pool.pids} == {os.getpid()}
        assert [answer["rank"] for answer in pool.call("ping", ())] == [0, 1]
    finally:
        pool.stop()
    monkeypatch.undo()
    monkeypatch.setenv(forkserver.ENV, "on")
    again = WorkerPool(parse_devices("cpu[0 1]"))
    try:
        again.start()  # a new server, which forks
        assert forkserver._server is not server and forkserver._server is not None
        assert {parent_of(pid) for pid in again.pids} == {forkserver._server.proc.pid}
    finally:
        again.stop()


PRELOAD_PROBE = """\
    import sys
    import torch

    def loaded(x):
        return torch.tensor(float("torch._dynamo" in sys.modules))
    """
PRELOAD_PROGRAM = """\
fn dynamo_loaded(x: [n]) -> [] = loaded(x)

extern fn loaded(x: [n]) -> [] = "ss_preload_probe.loaded"
"""


@pytest.mark.slow
def test_workers_forked_after_the_server_idled_have_what_torch_optim_imports(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.optim imports torch._dynamo as it makes the first optimizer of a process (1.4 s): the
    server imports it once it has been idle, not in the way of the first pool, whose workers import
    it themselves, and every later pool's workers have it from the fork."""
    monkeypatch.setenv(forkserver.ENV, "fresh")  # not a fork of this process, which has imported it
    forkserver.stop_server()  # a fresh server, which forks its first workers as soon as it is ready
    x = torch.zeros(2)
    with importable(tmp_path, "ss_preload_probe", PRELOAD_PROBE):
        for expected in (0.0, 1.0):
            if expected:  # idle: the server imports it; a request that comes meanwhile waits for the import
                time.sleep(forkserver.PRELOAD_WHEN_IDLE_S + 2.0)
            prog = ss.load(PRELOAD_PROGRAM, devices="cpu[0 1]", name="preload.ss")
            try:
                assert float(prog.dynamo_loaded(x)) == expected
                assert prog.pool.pids and {parent_of(p) for p in prog.pool.pids} == {forkserver._server.proc.pid}
            finally:
                prog.stop()


def test_a_server_that_ends_is_reaped_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Jupyter kernel being shut down sends its children SIGTERM and waits for them to be gone: a
    fork server left a zombie made it wait out its 2.5 s and then be SIGTERMed itself (no atexit ran).
    The controller reaps its server as soon as it ends, however it ends."""
    monkeypatch.setenv(forkserver.ENV, "on")
    forkserver.stop_server()
    pool = WorkerPool(parse_devices("cpu[0 1]"))
    try:
        pool.start()
        server = forkserver._server
        assert server is not None and server.alive()
        os.kill(server.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while proc_state(server.proc.pid) is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc_state(server.proc.pid) is None  # gone, not a zombie waiting for a waitpid
        assert server.proc.pid not in [c.pid for c in psutil.Process().children()]
        assert [answer["rank"] for answer in pool.call("ping", ())] == [0, 1]  # the workers go on
    finally:
        pool.stop()
