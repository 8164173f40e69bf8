"""What the controller and a worker say to each other over the worker's socket, pickled (worker.py's
`dumps`): the controller sends a Call, a Verdict or Stop; a worker answers each call with a Reply,
and says it is ready with one. Each is a frozen dataclass, and travels as a plain tuple (`wire`):
its kind's word, then its fields, since a plain tuple of strings pickles several times faster than
a class instance or an enum member, and every call's round trip (some 100 µs: parallel/spin.py)
pays for it twice per worker."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Call:
    """Run handlers.HANDLERS[handler](state, *args); `where` names it in errors and the timeline.
    `chained`: sent before the answer to the call before it was read (parallel/pipeline.py), so it
    is skipped if that one failed or was skipped, and it waits for a Verdict before it changes
    anything."""

    handler: str
    where: str
    args: tuple[Any, ...]
    chained: bool = False


@dataclass(frozen=True, slots=True)
class Verdict:
    """The controller's word on the call before a chained one: whether it went through (its answers
    read and its record written). WorkerState.take_verdict waits for it; one nothing waits for is
    dropped."""

    ok: bool


@dataclass(frozen=True, slots=True)
class Stop:
    """End: the worker leaves its loop and exits."""


Message = Call | Verdict | Stop


class Status(enum.StrEnum):
    """What a reply says: the call's result (OK), its error (ERR), that it was skipped (SKIPPED:
    a chained call after a failed one, or a step whose verdict said no), or that the worker started
    (READY, with its pid and device)."""

    OK = "ok"
    ERR = "err"
    SKIPPED = "skipped"
    READY = "ready"


@dataclass(frozen=True, slots=True)
class Reply:
    """A worker's answer: a Status and its value (the result; for ERR, worker.error_payload's dict;
    for READY, {"pid", "device"}; None when skipped)."""

    status: Status
    value: Any = None


_WORDS: dict[type[Message], str] = {Call: "call", Verdict: "verdict", Stop: "stop"}
_KINDS: dict[str, type[Message]] = {word: kind for kind, word in _WORDS.items()}
_FIELDS = {kind: tuple(f.name for f in dataclasses.fields(kind)) for kind in _WORDS}  # in order
_STATUSES = {status.value: status for status in Status}


def wire(message: Message | Reply) -> tuple[Any, ...]:
    """The plain tuple `message` travels as (pickled by worker.py's `dumps`)."""
    if isinstance(message, Reply):
        return (message.status.value, message.value)
    kind = type(message)
    return (_WORDS[kind], *(getattr(message, name) for name in _FIELDS[kind]))


def message_from(wired: tuple[Any, ...]) -> Message:
    """The controller's message that `wire` made `wired` of."""
    return _KINDS[wired[0]](*wired[1:])


def reply_from(wired: tuple[Any, ...]) -> Reply:
    """The worker's reply that `wire` made `wired` of."""
    return Reply(_STATUSES[wired[0]], wired[1])
