"""The cluster tests: a Ray cluster of 2 simulated nodes on this machine's loopback, started once for
all of tests/cluster (a start costs seconds of the 2 CPUs) and stopped as soon as the last of them has
run, so the rest of the suite runs without it. Skipped when Ray (`pip install 'shapescript[ray]'`)
isn't installed."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from ray_support import SimulatedCluster  # skips tests/cluster without Ray

HERE = Path(__file__).resolve().parent
_running: list[SimulatedCluster] = []


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """The simulated cluster (ray.cluster_utils.Cluster), shared by every test of tests/cluster."""
    simulated = SimulatedCluster()
    _running.append(simulated)
    try:
        yield simulated.cluster
    finally:
        simulated.stop()
        if simulated in _running:
            _running.remove(simulated)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """After the last test of this folder (a session fixture otherwise lives until the whole suite
    ends), the cluster stops: its processes would take the CPUs' time, and ss.cluster would send
    every later program's workers to it."""
    yield
    if _running and not any(HERE in later.path.parents for later in _after(item)):
        _running.pop().stop()


def _after(item: pytest.Item) -> list[pytest.Item]:
    items = item.session.items
    return items[items.index(item) + 1:] if item in items else []
