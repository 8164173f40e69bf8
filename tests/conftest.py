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
    sweep(tempfile.gettempdir(), SESSION_FOLDER, folders=True)
    folder = tempfile.mkdtemp(prefix=f"shapescript-tests-{owner_tag()}-")
    config.stash[_SESSION] = folder, (os.environ.get("TMPDIR"), tempfile.tempdir)
    os.environ["TMPDIR"] = tempfile.tempdir = folder
    if config.option.basetemp is None:
        config.option.basetemp = os.path.join(folder, PYTEST_FOLDER)


_SESSION = pytest.StashKey[tuple[str, tuple[str | None, str | None]]]()


def pytest_unconfigure(config: pytest.Config) -> None:
    folder, (tmpdir, tempdir) = config.stash[_SESSION]
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
    folder = Path(pytestconfig.stash[_SESSION][0])
    yield folder
    gc.collect()

    def leftovers() -> list[str]:
        return sorted(name for name in os.listdir(folder) if name != PYTEST_FOLDER and not CACHES.fullmatch(name))

    deadline = time.monotonic() + LEFTOVER_GRACE
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = leftovers()
    assert not left, f"the tests left these in the temp folder (/tmp): {', '.join(left)}"


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
