"""How often a pool's wait looks at whether the workers it waits for are stopped (failures.StoppedLooks):
at each wake for workers whose status this machine reads through /proc, but only a tenth of the
collective timeout apart where a look is a Ray call to another host (an actor's worker without a
status file here), so that a call that ends normally asks the actors nothing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from shapescript.parallel.failures import FAR_LOOKS_PER_TIMEOUT, StoppedLooks

TIMEOUT = 60.0


@dataclass
class Looked:
    """A worker as StoppedLooks sees it, counting the looks at it."""

    status_path: str
    is_stopped: bool = False
    looks: int = 0

    def stopped(self) -> bool:
        self.looks += 1
        return self.is_stopped


def wakes(looks: StoppedLooks, workers: list[Looked], seconds: float, every: float = 0.25,
          start: float = 0.0) -> list[float]:
    """The wait's wakes from `start` for `seconds`: `since` after each."""
    return [looks.look(workers, start + i * every) for i in range(int(seconds / every) + 1)]


def test_workers_read_through_proc_are_looked_at_each_wake() -> None:
    workers = [Looked("/proc/1/fd/3"), Looked("/proc/2/fd/3")]
    looks = StoppedLooks(workers, TIMEOUT, 0.0)
    assert wakes(looks, workers, 2.0) == [float("inf")] * 9
    assert workers[0].looks == 9  # `all` stops at the first one running
    workers[0].is_stopped = workers[1].is_stopped = True
    assert looks.look(workers, 3.0) == 3.0 and looks.look(workers, 3.25) == 3.0  # since when: the first look


def test_workers_on_another_host_are_not_looked_at_during_a_call_that_ends_normally() -> None:
    workers = [Looked("/proc/1/fd/3"), Looked("")]  # one of them on another host: a look is a Ray call
    looks = StoppedLooks(workers, TIMEOUT, 100.0)
    every = TIMEOUT / FAR_LOOKS_PER_TIMEOUT
    assert wakes(looks, workers, every - 0.25, start=100.0) == [float("inf")] * int(every / 0.25)
    assert [w.looks for w in workers] == [0, 0]  # a call of up to a tenth of the timeout: no look at all


@pytest.mark.parametrize("stopped_at", [1.0, 30.0])
def test_workers_on_another_host_all_stopped_are_given_up_on_within_a_tenth_more_of_the_timeout(
        stopped_at: float) -> None:
    workers = [Looked(""), Looked("")]
    looks = StoppedLooks(workers, TIMEOUT, 0.0)
    since = float("inf")
    t = 0.0
    while since + TIMEOUT > t:  # as the wait's give-up: all stopped for the collective timeout
        for w in workers:
            w.is_stopped = t >= stopped_at
        since = looks.look(workers, t)
        t += 0.25
        assert t < 3 * TIMEOUT, "never given up on"
    assert stopped_at + TIMEOUT <= t <= stopped_at + TIMEOUT * (1 + 1 / FAR_LOOKS_PER_TIMEOUT) + 0.25
    assert sum(w.looks for w in workers) <= 2 * (t / (TIMEOUT / FAR_LOOKS_PER_TIMEOUT) + 1)
