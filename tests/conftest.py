"""The tests run against this checkout's package, and leave nothing in the temp folder."""

from __future__ import annotations

import gc
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shapescript.runtime.leftovers import owner_tag, sweep  # noqa: E402  (this checkout's)


LEFTOVER_GRACE = 5.0  # seconds for workers whose controller (a kernel, a CLI run) just ended to clean up
SESSION_FOLDER = re.compile(r"shapescript-tests-(?P<pid>\d+)-(?P<start>\d+)-[a-z0-9_]+")
# Not leftovers: caches that libraries keep in the temp folder from one run to the next by design
# (torch makes torchinductor_USER whenever something imports torch._dynamo).
CACHES = re.compile(r"torchinductor_.*")


PYTEST_FOLDER = "pytest"  # pytest's own tmp_path folders, inside the session's folder


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Before anything makes a temporary file (pytest's tmp_path folders included), the session gets
    a folder of its own and TMPDIR, inherited by subprocesses, points there. A killed session's
    folder is swept by the next session."""
    if _hands_tests_to_xdist(config):
        config.stash[_SESSION] = None  # each xdist worker is a session of its own, with its own folder
        return
    sweep(tempfile.gettempdir(), SESSION_FOLDER, folders=True)
    folder = tempfile.mkdtemp(prefix=f"shapescript-tests-{owner_tag()}-")
    config.stash[_SESSION] = folder, (os.environ.get("TMPDIR"), tempfile.tempdir)
    os.environ["TMPDIR"] = tempfile.tempdir = folder
    if config.option.basetemp is None:
        config.option.basetemp = os.path.join(folder, PYTEST_FOLDER)


_SESSION = pytest.StashKey[tuple[str, tuple[str | None, str | None]] | None]()


def _hands_tests_to_xdist(config: pytest.Config) -> bool:
    """Whether this process is pytest-xdist's controller (`-n N`): it runs no test itself."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_SESSION, None)
    if session is None:
        return
    folder, (tmpdir, tempdir) = session
    if tmpdir is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = tmpdir
    tempfile.tempdir = tempdir
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def nothing_left_in_the_temp_folder(pytestconfig: pytest.Config) -> Iterator[Path]:
    """The session's folder (see pytest_configure) must hold nothing but pytest's own when the session
    ends: what a test, a worker pool or a controller it ran leaves there would be left in /tmp. Pools
    no one holds any more are collected first, so their finalizers run; a pool still held (a module's
    program never stopped) is a leftover. The folder goes when pytest ends, and so /tmp is as the
    session found it."""
    session = pytestconfig.stash[_SESSION]
    assert session is not None, "tests run in a process that made no session folder"
    folder = Path(session[0])
    yield folder
    gc.collect()

    def leftovers() -> list[str]:
        return sorted(name for name in os.listdir(folder) if name != PYTEST_FOLDER and not CACHES.fullmatch(name))

    deadline = time.monotonic() + LEFTOVER_GRACE
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = leftovers()
    assert not left, f"the tests left these in the temp folder (/tmp): {', '.join(left)}"


# Under pytest-xdist (`make test`: `-n 2 --dist loadgroup`) the tests of one file run in one worker,
# so a module's fixture (a worker pool) is made once; the files that share the simulated Ray cluster
# (a session fixture that costs seconds of both CPUs) run in one worker together, one cluster at a time.
RAY_CLUSTER_USERS = ("cluster/", "notebook/test_cluster_kernel.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).resolve().parent
    for item in items:
        where = item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else str(item.path)
        group = "ray-cluster" if where.startswith(RAY_CLUSTER_USERS) else where
        item.add_marker(pytest.mark.xdist_group(group))


class StrayInterrupt(Exception):
    """A Ctrl-C that came while no call ran: the test's own handler, so that pytest isn't stopped."""


@pytest.fixture
def no_stray_interrupts() -> Iterator[None]:
    def stray(signum: int, frame: object) -> None:
        raise StrayInterrupt
    previous = signal.signal(signal.SIGINT, stray)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
