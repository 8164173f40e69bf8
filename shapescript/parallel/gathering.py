"""Reading a call's replies from every worker (pool.py's WorkerPool): as they come, while looking
at the workers that haven't answered, and giving up on those a failure has left waiting.
"""

from __future__ import annotations

import select
import subprocess
import time
from collections.abc import Callable
from multiprocessing.connection import wait

from shapescript.parallel import spin
from shapescript.parallel.failures import StoppedLooks
from shapescript.parallel.lifecycle import PoolState
from shapescript.parallel.messages import Reply, Status
from shapescript.parallel.processes import WorkerProcess
from shapescript.parallel.worker import WAITING

COLLECTIVE_GRACE = 2.0  # after one worker's collective failed, how long the others have to report theirs
ERROR_GRACE = 1.0  # after one worker raised an error of its own, how long the others have to raise theirs
LOOK_EVERY = 0.25  # seconds between looks at the workers' processes and statuses while a call waits


class Gathering:
    """The reading half of WorkerPool (pool.py), which sets these attributes."""

    world: int
    timeout: float | None
    _state: PoolState
    _workers: list[WorkerProcess]
    _spin: float
    _fail_dead: Callable[[WorkerProcess, str], None]  # raise that a worker died (FailureReports)

    def _gather(self, doing: str) -> tuple[list[Reply | None], list[int], bool]:
        """Every worker's reply, in rank order, the ranks that didn't answer in time, and whether those
        were given up on because a worker raised an error of its own while they wait for it at a
        collective. Raises at once if a worker dies. Without a failure this waits as long as the
        workers work; once one worker has answered, the others have the collective timeout and a grace
        to follow; once one has failed in a collective, `COLLECTIVE_GRACE` to report their own failure
        (cut short when none of them is waiting at a collective); once one has raised an error of its
        own, `ERROR_GRACE` to raise theirs, after which any found waiting at a collective on two looks
        are given up on. Workers that are all stopped (SIGSTOP) get the collective timeout (StoppedLooks)."""
        assert self.timeout is not None
        replies: list[Reply | None] = [None] * self.world
        pending = {w.rank: w for w in self._workers}
        never = float("inf")
        answer_deadline = collective_deadline = error_deadline = never
        stopped = StoppedLooks(self._workers, self.timeout, time.monotonic())  # since when all pending stopped
        waiting_before: set[int] = set()  # the pending workers waiting at a collective at the last look
        released = False
        poller = select.poll()  # cheaper than multiprocessing's wait(), which builds a selector each time
        for w in self._workers:
            for fd in (w.conn.fileno(), w.pidfd):
                if fd is not None:
                    poller.register(fd, select.POLLIN)
        while pending:
            deadline = min(answer_deadline, collective_deadline)
            timeout = min(LOOK_EVERY, max(0.0, deadline - time.monotonic()))  # also wake to look at the workers
            found = spin.poll_briefly(poller, self._spin) if self._spin else []
            ready = {fd for fd, _ in found or poller.poll(timeout * 1000)}
            for rank, w in list(pending.items()):
                if w.conn.fileno() not in ready:
                    continue
                try:
                    reply = w.reply(w.conn.recv_bytes())
                except (EOFError, OSError):
                    self._fail_dead(w, doing)
                replies[rank] = reply
                del pending[rank]
                for fd in (w.conn.fileno(), w.pidfd):  # a worker that answered may exit: not this call's business
                    if fd is not None:
                        poller.unregister(fd)
                if answer_deadline == never:
                    answer_deadline = time.monotonic() + self.timeout + min(30.0, max(2.0, self.timeout))
                if reply.status == Status.ERR:
                    if self._state == PoolState.STARTING:
                        return replies, sorted(pending), False
                    if reply.value["collective"]:
                        collective_deadline = min(collective_deadline, time.monotonic() + COLLECTIVE_GRACE)
                    else:
                        error_deadline = min(error_deadline, time.monotonic() + ERROR_GRACE)
            for w in pending.values():
                if (w.pidfd in ready) if w.pidfd is not None else w.dead():
                    self._fail_dead(w, doing)
            now = time.monotonic()
            if pending and not ready:  # nothing happened: a look at the processes and their statuses
                stopped.look(pending.values(), now)
                if now >= error_deadline:  # a collective that the failed worker won't join never ends
                    waiting = {r for r, w in pending.items() if w.status()[0] == WAITING}
                    released = released or bool(waiting & waiting_before)
                    waiting_before = waiting
            out_of_time = now >= min(answer_deadline, collective_deadline, stopped.since + self.timeout)
            gave_up = out_of_time or released or (collective_deadline < never and not self._any_waiting(pending))
            if pending and gave_up and not wait([w.conn for w in pending.values()], 0):  # a last look for replies
                break
        for w in pending.values():  # a worker that died just now: its peers' collectives failed first
            try:
                w.proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                continue
            self._fail_dead(w, doing)
        return replies, sorted(pending), released and bool(pending)

    def _any_waiting(self, pending: dict[int, WorkerProcess]) -> bool:
        return any(w.status()[0] == WAITING for w in pending.values())
