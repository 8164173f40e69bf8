"""What a worker that raised an error of its own in a call does, so that the others never wait for it
and no worker updates a model.

The workers of several devices run the same code in step: every collective a call starts, every
worker starts too, in the same order. One worker whose own code raises (an extern fn that refuses
its rows, a ShapeError or DomainError that only its part of the batch meets) would leave the others
waiting in the next collective, in Gloo until the collective timeout. So each worker keeps a ledger:
for each kind of call (its fn, the shapes and dtypes of its arguments, the layout of its batch
part), the collectives its last successful call started, in order (runtime/collectives.py's
`Issued`: operation, values sent, dtype, shared memory or Gloo). A ShapeScript fn on the devices has
no branch on values, so these are a function of that kind alone; a call whose collectives differ
from the last ones of its kind marks the kind as not known (then see below).

A worker that raises then *finishes* the call (`Ledger.call`): if the collectives it started so far
are the first ones of its kind's ledger, it starts the rest, sending zeros, up to the first flag,
`collectives.agree_to_update`, where it sends 1. Every worker sums the flags before each update, so
every worker learns there that one failed and raises
StepSkipped before it changes anything: the models and the optimizer states stay as before the
step, on every worker, and the controller raises the failed worker's own error. The zeros go into
sums whose results no worker keeps.

Where the ledger doesn't know the call's collectives (the first call of its kind, the smaller last
batch of an epoch, or a kind whose collectives changed), the call is *careful*: every worker sums the
failure flags before each collective and once more at the call's end (`collectives.sum_flags`, not
noted among the call's collectives). A worker that raises then joins the next of those sums with 1:
its peers are waiting there, or will be, since whatever they do next is a collective or the call's
end; every worker raises StepSkipped there, before its next collective and before any update. The
cost, one int64 summed per collective, is paid once per kind of call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from contextlib import suppress
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from shapescript.runtime import collectives
from shapescript.runtime.collectives import CallCollectives, Issued, Op
from shapescript.runtime.data import Batch, batch_fields
from shapescript.runtime.model import Model
from shapescript.runtime.modes import Mode
from shapescript.runtime.optim import Optimizer
from shapescript.runtime.steps import StepSkipped

KINDS_KEPT = 64  # kinds of call a worker keeps the collectives of, the least recently called forgotten
CAREFUL_WHERE = "the workers' word before a collective"


class _Changed:
    """A kind whose collectives differed from one call to the next: its calls stay careful."""


_CHANGED = _Changed()


def shape_of(value: Any) -> Hashable:
    """What of an argument can choose a call's collectives: a tensor's shape and dtype (not its
    values), a batch's fields' and lengths' shapes, a model's, an optimizer's and a mode's kind, a
    number that may give a size (an int, a bool, a str); a float's type alone."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), value.dtype
    if isinstance(value, Batch):
        return (value.spec.name, tuple(shape_of(t) for t in batch_fields(value).values()),
                tuple((name, shape_of(t)) for name, t in sorted(value.lengths.items())))
    if isinstance(value, Model):
        return "model", value.spec.name
    if isinstance(value, Optimizer):
        return value.kind, value.model.spec.name
    if isinstance(value, Mode):
        return "mode", value.training
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, tuple):
        return tuple(shape_of(v) for v in value)
    return type(value).__name__


def kind_of(name: str, values: Sequence[Any], part: tuple[int, int] | None) -> Hashable:
    """A call's kind: its fn, its arguments' shapes, and where its part lies in the whole batch."""
    return name, tuple(shape_of(v) for v in values), part


class Ledger:
    """A worker's collectives of each kind of call, as its last successful call of that kind
    started them."""

    def __init__(self) -> None:
        self._known: OrderedDict[Hashable, tuple[Issued, ...] | _Changed] = OrderedDict()

    def clear(self) -> None:
        """A new program: its fns are others."""
        self._known.clear()

    def known(self, kind: Hashable) -> tuple[Issued, ...] | None:
        """The collectives of `kind` (none, for a call that starts none), or None where they aren't known."""
        entries = self._known.get(kind)
        return entries if isinstance(entries, tuple) else None

    def call(self, kind: Hashable, device: torch.device, before_flag: Callable[[], None]) -> _LedgerCall:
        """Around a call of the program on several workers: its collectives are noted; if it raises
        an error of this worker's own, the rest of its collectives are joined (`_finish`). A call
        that makes no update sums no flag at its end: it changes no model, its peers end it as usual
        and the controller raises the failed worker's error; a call may also run on one worker
        alone (`WorkerPool.first`, benchmarks/round_trip_parts.py), where a flag would wait forever.
        `before_flag`: what the worker does before each flag (the controller's word on a step sent
        ahead, WorkerState.take_verdict), which a finishing worker does too."""
        return _LedgerCall(self, kind, device, before_flag)

    def _keep(self, kind: Hashable, entries: tuple[Issued, ...]) -> None:
        before = self._known.get(kind, entries)
        self._known[kind] = entries if before == entries else _CHANGED
        self._known.move_to_end(kind)
        if len(self._known) > KINDS_KEPT:
            self._known.popitem(last=False)

    def _finish(self, kind: Hashable, done: list[Issued], device: torch.device,
                before_flag: Callable[[], None]) -> bool:
        """Join the collectives of `kind` after the ones `done`, with zeros, up to its first flag,
        with 1; True if it got there (every worker then skips the step), False where the ledger
        doesn't know the rest or a collective failed (the pool then finds the peers waiting)."""
        known = self.known(kind)
        if known is None or tuple(done) != known[:len(done)]:
            return False
        try:
            for entry in known[len(done):]:
                if entry.op is not Op.FLAG:
                    collectives.join_with_zeros(entry, device)
                    continue
                before_flag()
                collectives.agree_to_update(device, failed=True)  # raises StepSkipped: the sum is > 0
        except StepSkipped:  # the flag's sum: every worker skips the step
            return True
        except Exception:
            return False
        # No flag after the error: it came after the call's last update, which every worker made (as
        # one device, which updated before raising); the peers end the call as it was.
        return False


def _careful_flags(device: torch.device, before_flag: Callable[[], None], failed: bool) -> None:
    """One of a careful call's sums of failure flags: after the controller's word on a step sent
    ahead, as before an update, so that every worker, failed or not, makes the same choice there."""
    before_flag()
    collectives.sum_flags(device, failed, CAREFUL_WHERE)


def _join_careful(flags: Callable[[bool], None]) -> None:
    """A careful call's worker that raised an error of its own: its 1 in the next sum of flags makes
    every worker skip the call there (or the controller's word on the step before does)."""
    with suppress(Exception):  # StepSkipped, as meant; or a peer gone, a timeout: the pool reports the call
        flags(True)


class _LedgerCall:
    """Ledger.call's context. A class, not a generator: it runs around every call on the workers."""

    __slots__ = ("ledger", "kind", "device", "before_flag", "flags", "noted", "was", "on")

    def __init__(self, ledger: Ledger, kind: Hashable, device: torch.device, before_flag: Callable[[], None]) -> None:
        self.ledger, self.kind, self.device, self.before_flag = ledger, kind, device, before_flag
        self.flags: Callable[[bool], None] | None = None  # a careful call's sums of failure flags
        self.noted: CallCollectives | None = None
        self.was: CallCollectives | None = None
        self.on = False

    def __enter__(self) -> None:
        if collectives.world() == 1:
            return
        self.on = True
        if self.ledger.known(self.kind) is None:
            self.flags = partial(_careful_flags, self.device, self.before_flag)
        self.noted = CallCollectives(partial(self.flags, False) if self.flags is not None else None)
        self.was, collectives.issued = collectives.issued, self.noted

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if not self.on:
            return
        try:
            if exc is None and self.flags is not None:  # peers of a worker that raised in the call may be waiting here
                try:
                    self.flags(False)
                except StepSkipped:
                    raise
                except Exception as raised:
                    self._failed(raised)
                    raise
            if exc is None:
                assert self.noted is not None
                self.ledger._keep(self.kind, tuple(self.noted.entries))
            elif isinstance(exc, Exception) and not isinstance(exc, StepSkipped):
                self._failed(exc)  # the exception then goes on: the worker answers its error
        finally:
            collectives.issued = self.was

    def _failed(self, exc: Exception) -> None:
        """An error in the call: one of this worker's own (not a collective's) joins the rest of the
        call's collectives, so that no peer waits (and the shared sums are marked failed: harmless once joined)."""
        collectives.issued = self.was
        assert self.noted is not None
        if self.noted.open == 0 and not isinstance(exc, dist.DistError):  # its own, not a collective's
            if self.flags is not None:
                _join_careful(self.flags)
            else:
                self.ledger._finish(self.kind, self.noted.entries, self.device, self.before_flag)
