"""Nothing left behind: however a controller ends, no worker and no private folder outlive it, and
a save killed midway leaves no temporary file and a whole checkpoint.

Each case runs a controller of its own in a subprocess whose TMPDIR is a folder of tmp_path, so the
checks see only its files: whatever it leaves in "/tmp" is left there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import torch
from programs import LINEAR
from safetensors.torch import load_file
from support import ROOT

import shapescript as ss
from shapescript.parallel.processes import sweep_stale_folders
from shapescript.parallel.worker import WAITING, read_status
from shapescript.runtime.leftovers import TEMP_NAME, owner_tag

# Starts the workers of a small program, says where they are, then waits (or keeps them busy: worker 0
# blocked in a Gloo all-reduce that worker 1, asleep, never joins) until it is killed.
CONTROLLER = """
import signal, sys, time
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal's process has it, even where pytest runs under nohup
import shapescript as ss
prog = ss.load(sys.argv[1])
m = prog.Lin.init(seed=0)  # starts the workers
pool = prog.pool
print(pool.folder, *pool.pids, flush=True)
if sys.argv[2] == "busy":
    pool.call("hang_before_collective", (1, "fit.ss:17:9"))
time.sleep(600)
"""

# Saves a 32 MiB model again and again, one whose values are all 1 and one whose values are all 2 in
# turn, so that the loop's time is the saves' and a file is whole if all its values are the same.
SAVER = """
import sys, torch
import shapescript as ss
prog = ss.load("model Big:\\n    param w: [2048 4096] = zeros()\\n", name="big.ss")
models = [prog.Big.init(seed=0), prog.Big.init(seed=0)]
for value, m in enumerate(models, 1):
    m.load_state_dict({"w": torch.full((2048, 4096), float(value))})
for n in range(10_000):
    ss.save(sys.argv[1], models[n % 2])
    print(n, flush=True)
"""


def run(tmp_path: Path, script: str, *args: str, **popen: object) -> tuple[subprocess.Popen[str], Path]:
    """`script` in a process of its own, with its own empty temp folder."""
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    env = dict(os.environ, TMPDIR=str(temp), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True, env=env,
                            cwd=tmp_path, **popen)  # type: ignore[call-overload]
    return proc, temp


def ours(temp: Path) -> list[str]:
    """What is in a temp folder, but for torch's cache (torchinductor_USER, made by importing
    torch._dynamo and kept by design)."""
    return sorted(name for name in os.listdir(temp) if not name.startswith("torchinductor_"))


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def within(seconds: float, done: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stale_folder(temp: Path) -> Path:
    """The folder a killed controller left, whose workers died with it before removing it."""
    folder = temp / f"shapescript-workers-{dead_pid()}-1234-abcd_123"
    folder.mkdir()
    (folder / "store").write_bytes(b"")
    return folder


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


@pytest.mark.slow
@pytest.mark.parametrize("how,group,busy", [
    ("SIGTERM", False, False),  # `kill PID`: Python's default for it skips atexit and every finalizer
    ("SIGTERM", True, True),    # to its process group (Jupyter's restart, systemd), the workers busy
    ("SIGHUP", True, False),    # its terminal closed: the whole process group gets it
    ("SIGKILL", False, False),  # the workers, idle, see the socket close
    ("SIGKILL", False, True),   # the workers, busy (one in a collective, one asleep), never read the socket
])
def test_a_killed_controller_leaves_no_worker_and_no_folder(tmp_path: Path, how: str, group: bool,
                                                            busy: bool) -> None:
    program = tmp_path / "fit.ss"
    program.write_text("devices cpu[0 1]\n" + LINEAR)
    proc, temp = run(tmp_path, CONTROLLER, str(program), "busy" if busy else "idle", start_new_session=True)
    stale = stale_folder(temp)
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        folder, *pid_texts = proc.stdout.readline().split()
        pids = [int(p) for p in pid_texts]
        assert len(pids) == 2 and Path(folder).parent == temp and Path(folder).is_dir()
        assert not stale.exists()  # swept as the pool started: its controller is gone
        if busy:
            assert within(60, lambda: read_status(f"{folder}/status-0")[0] == WAITING)
        if group:
            os.killpg(proc.pid, getattr(signal, how))
        else:
            proc.send_signal(getattr(signal, how))
        # Bounds on a hang, not on speed
        assert proc.wait(timeout=60) == -getattr(signal, how)
        assert within(30, lambda: not any(running(pid) for pid in pids)), "a worker outlived its controller"
        assert within(30, lambda: not ours(temp)), f"left behind: {ours(temp)}"
    finally:
        proc.kill()
        proc.wait()
        for pid in pids:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_sweep_removes_only_the_folders_of_ended_controllers(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    dead = stale_folder(tmp_path)
    reused = tmp_path / f"shapescript-workers-{os.getpid()}-1-reused01"  # an earlier process with our pid
    reused.mkdir()
    kept = [tmp_path / f"shapescript-workers-{owner_tag()}-live0001",  # a live controller's: ours
            tmp_path / "shapescript-workers-abcdefgh",  # no owner in its name: can't tell whose
            tmp_path / f"shapescript-workers-{dead_pid()}-1-afile001",  # not a folder
            tmp_path / f"shapescript-workers-{dead_pid()}-1-alink001"]  # a symlink, not followed
    kept[0].mkdir()
    kept[1].mkdir()
    kept[2].write_text("")
    kept[3].symlink_to(kept[0])
    assert sorted(sweep_stale_folders()) == sorted([str(dead), str(reused)])
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in kept)


@pytest.mark.slow
def test_a_save_killed_midway_leaves_no_temporary_file_and_a_whole_checkpoint(tmp_path: Path) -> None:
    target = tmp_path / "out" / "big.safetensors"
    target.parent.mkdir()
    proc, temp = run(tmp_path, SAVER, str(target))
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "0"
        # Killed as soon as a file other than the target shows (a temporary file of a save under way,
        # which should never have a name), else after a second and a half of saves.
        within(1.5, lambda: os.listdir(target.parent) != ["big.safetensors"])
        proc.kill()
    finally:
        proc.kill()
        proc.wait()
    # A save's file has a name only between its link and its rename onto the target: a kill in that
    # moment leaves it, named for the killed process, and the next save into the folder removes it.
    left = sorted(os.listdir(target.parent))
    others = [name for name in left if name != "big.safetensors"]
    assert "big.safetensors" in left and len(others) <= 1, left
    assert all(TEMP_NAME.fullmatch(name) and f".{proc.pid}-" in name for name in others), others
    assert ours(temp) == []
    w = load_file(target)["model.w"]
    assert w.shape == (2048, 4096) and w[0, 0].item() in (1, 2) and torch.equal(w, torch.full_like(w, w[0, 0]))
    small = ss.load("model Small:\n    param w: [2] = zeros()\n", name="small.ss").Small.init(seed=0)
    ss.save(str(target.parent / "small.safetensors"), small)
    assert sorted(os.listdir(target.parent)) == ["big.safetensors", "small.safetensors"]
