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
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shapescript.runtime.leftovers import owner_tag, sweep  # noqa: E402  (this checkout's)

LEFTOVER_GRACE = 5.0  # seconds for workers whose controller (a kernel, a CLI run) just ended to clean up
SESSION_FOLDER = re.compile(r"shapescript-tests-(?P<pid>\d+)-(?P<start>\d+)-[a-z0-9_]+")
# Not leftovers: caches that libraries keep in the temp folder from one run to the next by design
# (torch makes torchinductor_USER whenever something imports torch._dynamo; importing onnxruntime
# writes its session id to .ses).
CACHES = re.compile(r"torchinductor_.*|\.ses")


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


# The tests that run workers on a simulated Ray cluster (tests/ray_support.py): tests/cluster, and the
# notebook's %shapescript cluster (run just before them). They share one cluster of 2 nodes on this
# machine's loopback: a start costs about 15 s of the 2 CPUs. It stops as soon as the last of them has
# run, so that the rest of the suite runs without it: its processes would take the CPUs' time, and
# ss.cluster would send every later program's workers to it.
CLUSTER_FOLDER = Path(__file__).resolve().parent / "cluster"
CLUSTER_KERNEL = Path(__file__).resolve().parent / "notebook" / "test_cluster_kernel.py"
_running: list[Any] = []


def _on_the_cluster(item: pytest.Item) -> bool:
    return item.path == CLUSTER_KERNEL or CLUSTER_FOLDER in item.path.parents


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """The simulated cluster (ray.cluster_utils.Cluster), this process connected to it (ss.cluster).
    Skips the test without Ray (`pip install 'shapescript[ray]'`)."""
    from ray_support import SimulatedCluster
    simulated = SimulatedCluster()
    _running.append(simulated)
    try:
        yield simulated.cluster
    finally:
        simulated.stop()
        if simulated in _running:
            _running.remove(simulated)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The notebook's cluster test runs just before tests/cluster, on the same cluster (which, before
    tests/cluster's lost node, still has its 2 nodes alive)."""
    kernel = [item for item in items if item.path == CLUSTER_KERNEL]
    rest = [item for item in items if item.path != CLUSTER_KERNEL]
    first = next((k for k, item in enumerate(rest) if CLUSTER_FOLDER in item.path.parents), None)
    if kernel and first is not None:
        items[:] = rest[:first] + kernel + rest[first:]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last test on the cluster (a session fixture otherwise lives until the whole suite
    ends), the cluster stops."""
    yield
    if _running and _on_the_cluster(item) and not any(_on_the_cluster(later) for later in _after(item)):
        _running.pop().stop()


def _after(item: pytest.Item) -> list[pytest.Item]:
    items = item.session.items
    return items[items.index(item) + 1:] if item in items else []


# The Binder build (tests/notebook/binder_build.py) starts in the background with the compiler's tests,
# which run in this process alone on one core for about a minute, if its test is among those to run.
BINDER_TEST = Path(__file__).resolve().parent / "notebook" / "test_binder.py"
BINDER_STARTS_WITH = Path(__file__).resolve().parent / "compiler"
_binder: list[Any] = []  # its build, once the binder test is known to be among the session's


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _binder and BINDER_STARTS_WITH in item.path.parents:
        _binder[0].start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _binder:
        _binder.pop().stop()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What is alive once the tests are collected (the modules imported, torch's among them, and the
    tests themselves) stays for the whole session: collected first, then frozen out of the
    collector's way (gc.freeze), so that a full collection later scans only what the tests made
    since. A test that makes many objects late in the suite took 46 s rather than 8 s without it
    (tests/notebook's Ctrl-C at every line of tqdm), and the whole suite 970 s rather than 833 s.
    (Freezing again after each file's tests gained nothing more: 855 s.)"""
    if any(item.path == BINDER_TEST for item in session.items):
        import binder_build  # tests/notebook's, on sys.path once its tests are collected
        _binder.append(binder_build.BUILD)
    gc.collect()
    gc.freeze()
