"""No one else's files can stop a run: entries another local user plants under the
names our leftovers have, in the temp folder, /dev/shm and a save's folder, are never read as ours.

Every sweep runs on a private folder of the test's (the sweeps' folders are patched), with entries
owned by `nobody` (the tests run as root: made, then chowned), entries of ours whose names no process
of ours could have made, and symlinks."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from shapescript.api import parse_devices
from shapescript.parallel import shared
from shapescript.parallel.pool import WorkerPool
from shapescript.parallel.processes import sweep_stale_folders
from shapescript.runtime import checkpoint, shm_reduce
from shapescript.runtime.model import Model, ModelSpec, ParamSpec

PAST_PID_T = 2**31  # no process has it, and os.kill(PAST_PID_T, 0) raises OverflowError
SMALL = ModelSpec("Small", (ParamSpec("w", "param", (2, 3), torch.float32, "zeros", (), "s.ss:2:5"),), "s.ss:1:1")


def nobody() -> int | None:
    """The uid of `nobody`, whose files this test may plant where it runs as root; else None, and
    only this user's own strange entries are planted."""
    try:
        return pwd.getpwnam("nobody").pw_uid if os.geteuid() == 0 else None
    except KeyError:
        return None


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


@dataclass(frozen=True)
class Kind:
    """One sweep: how its leftovers are named, whether they are folders, and a start that sweeps."""

    name: Callable[[str, str], str]  # of the pid's and the start's text
    folders: bool
    start: Callable[[Path], None]


def start_pool_sweep(folder: Path) -> None:
    """What each pool's start sweeps first (the test below starts a whole pool)."""
    sweep_stale_folders()


def start_reduce(folder: Path) -> None:
    path = shm_reduce.create(2)
    assert path is not None and os.path.dirname(path) == str(folder)
    shm_reduce.remove(path)


def start_batches(folder: Path) -> None:
    arena = shared._Arena()
    lease = arena.lease(1024)
    assert lease is not None and os.path.dirname(lease.buffer.path) == str(folder)
    del lease
    shared._remove_all(arena.buffers)


def start_save(folder: Path) -> None:
    checkpoint.save(folder / "c.safetensors", Model.init(SMALL, seed=0))
    (folder / "c.safetensors").unlink()


KINDS = {
    "workers": Kind(lambda pid, start: f"shapescript-workers-{pid}-{start}-abcd_123", True, start_pool_sweep),
    "reduce": Kind(lambda pid, start: f"shapescript-reduce-{pid}-{start}-{'0' * 16}", False, start_reduce),
    "batch": Kind(lambda pid, start: f"shapescript-batch-{pid}-{start}-{'0' * 16}", False, start_batches),
    "checkpoint": Kind(lambda pid, start: f".c.safetensors.{pid}-{start}.0123456789ab.tmp", False, start_save),
}


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private folder that every sweep looks at in place of the temp folder and /dev/shm."""
    where = tmp_path / "shared"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    monkeypatch.setattr(shm_reduce, "FOLDER", str(where))
    monkeypatch.setattr(shared, "FOLDER", str(where))
    yield where


def make(path: Path, folders: bool, owner: int | None = None) -> Path:
    if folders:
        path.mkdir()
        (path / "store").write_bytes(b"x")
    else:
        path.write_bytes(b"x")
    if owner is not None:
        os.chown(path, owner, owner)
    return path


def plant(folder: Path, kind: str, uid: int | None) -> tuple[list[Path], list[Path]]:
    """Entries that must stay (another user's where `uid` is given), and this user's leftover of an
    ended process, which must go."""
    dead, name, folders = str(dead_pid()), KINDS[kind].name, KINDS[kind].folders
    kept = [make(folder / name("9" * 40, "0"), folders),  # ours, but no pid: not a name we make
            make(folder / name(str(PAST_PID_T), "1"), folders),  # ours, a pid past pid_t's: os.kill overflows
            make(folder / name(dead, "9" * 40), folders),  # ours, a start /proc can't give
            make(folder / name("\u0661\u0662", "0"), folders)]  # Arabic-Indic digits, which int() reads
    victim = make(folder / f"victim-{kind}", folders)
    link = folder / name(dead, "2")  # ours, pointing at our own entry: never followed
    link.symlink_to(victim)
    kept += [victim, link]
    if uid is not None:
        kept += [make(folder / name(str(PAST_PID_T), "0"), folders, uid),  # theirs: the overflow
                 make(folder / name(dead, "1"), folders, uid)]  # theirs, its owner gone: still not ours
        their_link = folder / name(dead, "3")
        their_link.symlink_to(victim)
        os.lchown(their_link, uid, uid)
        kept.append(their_link)
    gone = make(folder / name(dead, "4"), folders)
    return kept, [gone]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_sweep_skips_what_another_user_planted_and_never_raises(folder: Path, kind: str) -> None:
    kept, gone = plant(folder, kind, nobody())
    KINDS[kind].start(folder)
    assert not any(os.path.lexists(p) for p in gone)  # the sweep still does its work
    assert sorted(os.listdir(folder)) == sorted(p.name for p in kept)
    victim = folder / f"victim-{kind}"
    assert (victim / "store" if KINDS[kind].folders else victim).read_bytes() == b"x"


def test_a_pool_starts_beside_what_another_user_planted(folder: Path) -> None:
    """The start a user sees: `cpu[0 1]` with planted entries in the folders it sweeps (its own
    folders' and its reduce buffers')."""
    planted = [p.name for kind in ("workers", "reduce") for p in plant(folder, kind, nobody())[0]]
    pool = WorkerPool(parse_devices("cpu[0 1]"))
    try:
        pool.start()
        parts = [torch.arange(4.0) * (r + 1) for r in range(pool.world)]
        for total in pool.call("all_reduce_sum", [(p,) for p in parts]):
            assert torch.equal(total, parts[0] + parts[1])
    finally:
        pool.stop()
    assert sorted(os.listdir(folder)) == sorted(planted)
