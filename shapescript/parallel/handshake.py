"""Telling a pool's workers from anything else that connects to the controller's port.

Each worker connects and first sends the random token only it was given (ray_workers.py). The
controller serves every connection at once, from one selector loop: a connection that sends nothing,
sends too little, or sends a token that isn't one we are waiting for is closed at its own deadline
(TOKEN_TIMEOUT after it was accepted) or at once, and never delays the others. A real worker is
answered as soon as its token arrives, whatever else is open. Nothing here knows of Ray: the caller
says how to look at its workers meanwhile (`look`, called every `look_every` seconds, raises to stop).
"""

from __future__ import annotations

import hmac
import selectors
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

TOKEN_TIMEOUT = 5.0  # seconds a connection has, from its accept, to send its whole token
MAX_PENDING = 64  # connections waiting for their token at once; the oldest goes to make room


class NotConnected(Exception):
    """The deadline passed before these ranks' workers connected."""

    def __init__(self, ranks: list[int]) -> None:
        super().__init__(f"workers {ranks} didn't connect")
        self.ranks = ranks


@dataclass(eq=False)
class _Pending:
    """A connection accepted but not yet known: what it has sent so far, and when it must be done."""

    sock: socket.socket
    deadline: float
    received: bytearray = field(default_factory=bytearray)


class _Handshakes:
    """The selector loop's state: the listener, the connections waiting for their tokens, the workers'
    connections found so far (by rank)."""

    def __init__(self, listener: socket.socket, tokens: Sequence[bytes], token_timeout: float) -> None:
        self.listener, self.tokens, self.token_timeout = listener, list(tokens), token_timeout
        self.size = len(tokens[0]) if tokens else 0
        self.found: list[Connection | None] = [None] * len(tokens)
        self.pending: dict[socket.socket, _Pending] = {}
        self.selector = selectors.DefaultSelector()
        listener.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ)

    def missing(self) -> list[int]:
        return [rank for rank, conn in enumerate(self.found) if conn is None]

    def wait(self, timeout: float) -> None:
        """Serve whatever is ready within `timeout` seconds, then drop the connections out of time."""
        for key, _ in self.selector.select(max(0.0, timeout)):
            sock = key.fileobj
            if sock is self.listener:
                self._accept()
            else:
                assert isinstance(sock, socket.socket)
                self._read(self.pending[sock])
        now = time.monotonic()
        for waiting in [p for p in self.pending.values() if p.deadline <= now]:
            self._drop(waiting)

    def next_deadline(self) -> float:
        return min((p.deadline for p in self.pending.values()), default=float("inf"))

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return  # another wake-up took it
        except OSError:
            return  # out of file descriptors, or the peer gone already: the next one may do
        if len(self.pending) >= MAX_PENDING:
            self._drop(min(self.pending.values(), key=lambda p: p.deadline))
        sock.setblocking(False)
        self.pending[sock] = _Pending(sock, time.monotonic() + self.token_timeout)
        self.selector.register(sock, selectors.EVENT_READ)

    def _read(self, waiting: _Pending) -> None:
        try:
            chunk = waiting.sock.recv(self.size - len(waiting.received))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # closed (or reset) before its whole token
            self._drop(waiting)
            return
        waiting.received += chunk
        if len(waiting.received) < self.size:
            return
        owner = next((rank for rank, token in enumerate(self.tokens)
                      if self.found[rank] is None and hmac.compare_digest(token, bytes(waiting.received))), None)
        if owner is None:  # not one of our workers, or a token already used
            self._drop(waiting)
            return
        self._forget(waiting)
        sock = waiting.sock
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.found[owner] = Connection(sock.detach())

    def _forget(self, waiting: _Pending) -> None:
        self.selector.unregister(waiting.sock)
        del self.pending[waiting.sock]

    def _drop(self, waiting: _Pending) -> None:
        self._forget(waiting)
        waiting.sock.close()

    def close(self, found_too: bool) -> None:
        """Close what is still pending (and the workers' connections too, where we fail)."""
        for waiting in list(self.pending.values()):
            self._drop(waiting)
        self.selector.close()
        if found_too:
            for conn in self.found:
                if conn is not None:
                    conn.close()


def accept_workers(listener: socket.socket, tokens: Sequence[bytes], until: float, look: Callable[[], None],
                   look_every: float, token_timeout: float = TOKEN_TIMEOUT) -> list[Connection]:
    """Each worker's connection, in rank order (the rank of its token), once every one has connected.
    Raises NotConnected at `until` (time.monotonic()) with the ranks still missing, and whatever `look`
    raises; either way every connection is closed. Anything that isn't a worker is closed on the way."""
    handshakes = _Handshakes(listener, tokens, token_timeout)
    ok = False
    try:
        looked = float("-inf")
        while handshakes.missing():
            now = time.monotonic()
            if now >= until:
                raise NotConnected(handshakes.missing())
            if now - looked >= look_every:
                look()
                looked = now
            handshakes.wait(min(until, looked + look_every, handshakes.next_deadline()) - now)
        ok = True
        return [conn for conn in handshakes.found if conn is not None]
    finally:
        handshakes.close(found_too=not ok)
