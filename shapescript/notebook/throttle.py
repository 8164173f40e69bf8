"""Redrawing a widget at most a few times a second, however often what it shows changes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Throttle:
    """Calls `draw` at most once every `interval` seconds however often it is poked: a poke within
    the interval is drawn when the interval ends, from a timer's thread (never dropped). With
    `inline`, a poke after the interval draws at once in the poking thread (the live chart's first
    record shows without waiting); otherwise every draw is the timer's (the timeline's, whose pokes
    come from a call that shouldn't wait for a redraw)."""

    def __init__(self, draw: Callable[[], None], interval: float, inline: bool = False) -> None:
        self.draw, self.interval, self.inline = draw, interval, inline
        self.drawn_at = 0.0  # time.monotonic() of the last draw
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    @property
    def pending(self) -> bool:
        """Whether a timer will draw."""
        return self._timer is not None

    def poke(self) -> None:
        with self._lock:
            if self._timer is not None:  # a draw is due: it will draw what is there then
                return
            wait = max(0.0, self.drawn_at + self.interval - time.monotonic())
            if not (self.inline and wait == 0.0):
                self._timer = threading.Timer(wait, self._fire)
                self._timer.daemon = True
                self._timer.start()
                return
        self.now()

    def now(self) -> None:
        """Draw now (and note when)."""
        self.drawn_at = time.monotonic()
        self.draw()

    def cancel(self) -> None:
        """Forget a draw that is due."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _fire(self) -> None:
        with self._lock:
            self._timer = None
        self.now()
