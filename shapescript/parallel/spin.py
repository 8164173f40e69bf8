"""Waiting for a message by polling for a moment before sleeping.

A process asleep in poll() or recv() takes tens of µs to be woken when its message arrives (more on
a virtual machine), and a call's round trip holds such a wait in the controller and one in each
worker. Polling the socket without sleeping for a short budget first takes the wake-ups off the path
of any call that ends within it. Between polls the process yields its core (sched_yield), so that a
thread with work to do there runs first: where the processes outnumber the cores (cpu[0 1] on 2 cores,
a controller and two workers), the one polling doesn't hold up the one it waits for.

Measured on 2 cores (docs/benchmarks.md): a bare `ping` on cpu[0 1] 126–164 µs sleeping,
about 62 µs polling first; `prog.ident` 0.69–0.71 of commit ef5b030's, 0.49–0.51 polling; a
README step at batch 64 or 6144 neither faster nor slower. Polling without yielding made the same
`ping` twice as slow on those 2 cores. The budget bounds what a wait costs: a long step spends one
budget polling, then sleeps as before.

`SHAPESCRIPT_SPIN_US` in the controller's environment sets the budget in µs for the pools it starts
on this machine ("0": never poll). Workers on a cluster (Ray) don't poll: their messages come through
a relay whose own waits dominate.
"""

from __future__ import annotations

import os
import select
import time

ENV = "SHAPESCRIPT_SPIN_US"
BUDGET = 200e-6  # seconds: a bare call's round trip while polling is well inside it


def budget() -> float:
    """How long the controller and its workers poll for a message before sleeping, in seconds."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return BUDGET
    try:
        micros = float(text)
    except ValueError:
        raise ValueError(f"{ENV} must be a number of microseconds, not {text!r}") from None
    if not 0 <= micros <= 1e6:  # also NaN
        raise ValueError(f"{ENV} must be between 0 and 1000000 microseconds, not {text!r}")
    return micros * 1e-6


def poll_briefly(poller: select.poll, seconds: float) -> list[tuple[int, int]]:
    """What `poller` has ready within `seconds`, found by polling without sleeping ([] if nothing),
    the core yielded between polls."""
    end = time.perf_counter() + seconds
    while True:
        ready = poller.poll(0)
        if ready or time.perf_counter() >= end:
            return ready
        os.sched_yield()
