"""Ctrl-C held back while a step must not be cut short.

An optimizer step (runtime/optim.py) and a wait for the workers' step (parallel/interrupts.py) take
Ctrl-C when the step ends, not in the middle of it. Rather than install a SIGINT handler and put the
old one back around every step (two `signal.signal` calls a step), a handler of ours, a router,
is installed the first time a step holds Ctrl-C and stays: while a holder is set it gets the signal,
otherwise the handler the router replaced does, as if the router weren't there. If someone installs
another handler later, the next hold puts the router in front of that one.

Only the main thread gets signals and may set their handlers, so a hold from another thread does
nothing. Nor does one where SIGINT is ignored or left to the OS (SIG_IGN, SIG_DFL): there is no
Python handler to defer to.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # typeshed has no _signal; its getsignal is signal's without the enum
    from signal import getsignal as _current_handler
else:
    # The C module's getsignal: `signal.getsignal` converts what it returns to an enum where it can, which
    # costs ~20 µs for Python's own handler (a failed Enum lookup, an exception) on every step.
    from _signal import getsignal as _current_handler

SigintHandler = Callable[[int, FrameType | None], Any]

_ctrl_c_holder: SigintHandler | None = None  # who gets SIGINT now, instead of the handler the router replaced
_ctrl_c_main = threading.main_thread()


class _Router:
    """The handler of ours: each install is a new one holding what it replaced, so that code which
    saved a router and puts it back later gets the handler that router stood in front of."""

    def __init__(self, replaced: SigintHandler) -> None:
        self.replaced = replaced

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        holder = _ctrl_c_holder
        (holder if holder is not None else self.replaced)(signum, frame)


def _router_in_place() -> bool:
    """Put a router in front of the current SIGINT handler if there isn't one; False where it can't be."""
    current = _current_handler(signal.SIGINT)
    if type(current) is _Router:
        return True
    if not callable(current):
        return False
    signal.signal(signal.SIGINT, _Router(current))
    return True


def hold_ctrl_c(holder: SigintHandler) -> SigintHandler | None | Literal[False]:
    """Give SIGINT to `holder` until `release_ctrl_c(token)` with the token this returns (holds nest)."""
    global _ctrl_c_holder
    if threading.current_thread() is not _ctrl_c_main or not _router_in_place():
        return False  # nothing held: the token says so to release
    token, _ctrl_c_holder = _ctrl_c_holder, holder
    return token


def release_ctrl_c(token: SigintHandler | None | Literal[False]) -> None:
    """End the hold that returned `token`: the holder before it (or none) gets SIGINT again."""
    global _ctrl_c_holder
    if token is not False:
        _ctrl_c_holder = token


def deliver_ctrl_c(frame: FrameType | None) -> None:
    """Pass on a held Ctrl-C, now, to the handler the router stands in front of: Python's own
    raises KeyboardInterrupt here."""
    current = _current_handler(signal.SIGINT)
    handler = current.replaced if type(current) is _Router else current
    if callable(handler):
        handler(signal.SIGINT, frame)


class Presses:
    """A holder that counts the Ctrl-Cs it gets, to pass them on later (`deliver`)."""

    __slots__ = ("count", "frame")

    def __init__(self) -> None:
        self.count = 0
        self.frame: FrameType | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        self.frame = frame

    def deliver(self) -> None:
        """Pass each Ctrl-C noted on, now, to whoever gets SIGINT now (Python's own handler raises
        KeyboardInterrupt at the first)."""
        count, self.count = self.count, 0
        for _ in range(count):
            handler = _current_handler(signal.SIGINT)
            if callable(handler):
                handler(signal.SIGINT, self.frame)


class held_back:
    """Ctrl-C held back for a block that must not be cut short: code that takes a lock and gives it
    back (tqdm's, a widget library's) would leave it taken if KeyboardInterrupt came between the two,
    and every later user of the lock would wait forever. A Ctrl-C that comes meanwhile is passed on
    as the block ends, as if it came then. Costs two global assignments where nothing comes."""

    __slots__ = ("_presses", "_token")

    def __enter__(self) -> None:
        self._presses = Presses()
        self._token = hold_ctrl_c(self._presses)

    def __exit__(self, *exc: object) -> None:
        release_ctrl_c(self._token)
        self._presses.deliver()
