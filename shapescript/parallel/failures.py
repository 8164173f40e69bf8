"""How a pool reports a call that failed on its workers: one died, one raised an error the others
didn't, or the call didn't finish within the collective timeout (the chapter's table of where each
worker was). WorkerPool inherits these; each stops the workers and raises. `_answers` reads one
call's replies into its results, or raises its failure as one device would."""

from __future__ import annotations

import math
import pickle
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from shapescript.errors import ShapeScriptError, WorkerError, note_worker_places
from shapescript.parallel.messages import Reply, Status
from shapescript.parallel.processes import TIMEOUT_ENV, WorkerProcess, ranks_text
from shapescript.parallel.worker import WAITING, describe_status

FAR_LOOKS_PER_TIMEOUT = 10  # a wait's looks at whether workers on other hosts are stopped, per collective timeout


class StoppedLooks:
    """Since when every worker a call still waits for has been stopped (SIGSTOP, Ctrl-Z, a debugger):
    the wait gives such workers the collective timeout. A worker whose status file is this machine's
    (`status_path`) is looked at through /proc, at each of the wait's wakes. A worker on another host
    (an actor of a cluster: ray_workers.ActorWorker, no `status_path`) is looked at by a Ray call to
    its host, so where there is one, the looks are a tenth of the timeout apart, the first a tenth
    in: a call that ends before then asks nothing of the actors (what a worker is doing is asked only
    by a report, or once a worker has failed), and workers all stopped are given up on within 1.1
    timeouts. How the wait sees a worker die costs no look: a pidfd, or Ray's answer of its task."""

    def __init__(self, workers: Sequence[WorkerProcess], timeout: float, now: float) -> None:
        far = any(not w.status_path for w in workers)
        self.every = timeout / FAR_LOOKS_PER_TIMEOUT if far else 0.0
        self.due = now + self.every
        self.since = math.inf  # inf: not all stopped at the last look

    def look(self, pending: Iterable[WorkerProcess], now: float) -> float:
        """`since`, after a look at `pending` if one is due."""
        if now >= self.due:
            self.due = now + self.every
            stopped = all(w.stopped() for w in pending)
            self.since = min(self.since, now) if stopped else math.inf
        return self.since


class FailureReports:
    """The failure half of WorkerPool (pool.py), which sets these attributes."""

    world: int
    timeout: float | None
    _workers: list[WorkerProcess]
    _die: Callable[[str], None]  # stop every worker, saying why (WorkerPool's method)
    _completed: Counter[str]  # calls that ended on every worker, by what ran
    _resync_due: bool  # a call failed on some worker: its counters are set again before the next
    _sums_shared: bool  # the workers sum through shared memory (runtime/shm_reduce.py)

    def _answers(self, replies: list[Reply | None], pending: list[int], released: bool,
                 where: str) -> list[Any]:
        """The workers' results of one call, or its failure raised as one device would raise it."""
        self._completed[where] += 1
        failed = [(rank, r.value) for rank, r in enumerate(replies) if r is not None and r.status == Status.ERR]
        if released:
            self._fail_alone(failed, pending, where)
        if pending or any(payload["collective"] for _, payload in failed):
            self._fail_stuck(replies, pending, where)
        if failed:  # the first worker's error, as one device would raise it
            self._resync_due = self._sums_shared
            rank, payload = failed[0]
            self._raise_error(self._workers[rank], payload, where)
        skipped = [rank for rank, r in enumerate(replies) if r is not None and r.status == Status.SKIPPED]
        if skipped:  # for a failure no worker reported: they no longer know what the others did
            self._die(f"{where} was skipped on some workers")
            raise WorkerError(f"{ranks_text(skipped)} skipped {where}, though no worker reported a failure; the "
                              f"workers were stopped, and what was on the devices is gone")
        # none pending (else _fail_stuck raised): every worker's reply is in
        return [r.value for r in replies if r is not None]

    def _fail_dead(self, w: WorkerProcess, doing: str) -> None:
        status = w.status()
        how = w.how_it_stopped()
        at = f" (it was waiting for the other workers at {status[1]})" if status[0] == WAITING else ""
        others = "The other workers were stopped too" if self.world > 1 else "It"
        self._die(f"worker {w.rank} stopped")
        raise WorkerError(
            f"worker {w.rank} ({w.label}) stopped while {doing}{at}: {how}. {others}, and what was on "
            f"the devices is gone: new models, or a checkpoint, are needed to go on.")

    def _fail_alone(self, failed: list[tuple[int, dict[str, Any]]], pending: list[int], where: str) -> None:
        """A worker raised an error of its own, and the others went on to a collective, where they would
        wait for it until the collective timeout: stop them all now, and raise its error."""
        rank, payload = next((r, p) for r, p in failed if not p["collective"])
        w = self._workers[rank]  # before _die forgets the workers
        places = sorted({self._workers[r].status()[1] for r in pending} - {""})
        self._die(f"worker {rank} raised an error in {where} while the others waited for it")
        self._raise_error(w, payload, where, note=(
            f"Only some workers raised it: {ranks_text(pending)} went on and waited for the others at "
            f"{' and '.join(places) or 'a collective'}, so every worker was stopped at once, and what was on the "
            f"devices is gone: new models, or a checkpoint, are needed to go on."))

    def _fail_stuck(self, replies: list[Reply | None], pending: list[int], where: str) -> None:
        """The chapter's report of a call that didn't finish: where each worker was."""
        lines: list[str] = []
        notes: list[str] = []
        for w in self._workers:
            reply = replies[w.rank]
            who = w.named()
            if reply is None:
                stopped = ", and is stopped (SIGSTOP, Ctrl-Z or a debugger)" if w.stopped() else ""
                lines.append(f"{who}: didn't answer; it was {describe_status(*w.status())}{stopped}")
            elif reply.status == Status.OK:
                lines.append(f"{who}: finished")
            elif reply.status == Status.SKIPPED:
                lines.append(f"{who}: skipped it, as another worker failed")
            else:
                payload = reply.value
                lines.append(f"{who}: was {payload['status']}" if payload["collective"]
                             else f"{who}: raised {payload['type']}: {payload['message']}")
                if payload["traceback"] and not notes:
                    notes.append(f"worker {w.rank}'s traceback:\n{payload['traceback']}")
        failed = any(r is not None and r.status == Status.ERR for r in replies)
        if pending and failed:
            head = f"a worker failed while running {where}, and {ranks_text(pending)} didn't finish:"
        elif len(pending) == self.world:  # none answered: each was stopped for the whole timeout
            head = (f"{ranks_text(pending)} didn't finish {where}: stopped for {self.timeout:g} s (the collective timeout) "
                    f"without answering:")
        elif pending:
            head = f"{ranks_text(pending)} didn't finish {where} within {self.timeout:g} s of the others:"
        else:
            head = f"a worker failed while running {where}, and the workers timed out waiting for each other:"
        self._die(f"{where} didn't finish")
        exc = WorkerError("\n  ".join([head] + lines))
        exc.add_note(f"The workers were stopped, and what was on the devices is gone. The collective timeout is "
                     f"{self.timeout:g} s (${TIMEOUT_ENV}, or shapescript.collective_timeout(seconds)).")
        for note in notes:
            exc.add_note(note)
        raise exc

    def _raise_error(self, w: WorkerProcess, payload: dict[str, Any], where: str, note: str = "") -> None:
        """A handler's exception, raised here: the same class if it's one of ours, else a WorkerError."""
        exc: BaseException | None = None
        if payload["pickled"] is not None:
            try:
                exc = pickle.loads(payload["pickled"])
            except Exception:
                exc = None
        if not isinstance(exc, ShapeScriptError):
            exc = WorkerError(f"worker {w.rank} ({w.label}) raised {payload['type']} while running {where}: "
                              f"{payload['message']}")
        if note:
            exc.add_note(note)
        if payload["traceback"]:
            exc.add_note(f"worker {w.rank}'s traceback ({w.label}):\n{payload['traceback']}")
        note_worker_places(exc, payload.get("places", []))
        raise exc
