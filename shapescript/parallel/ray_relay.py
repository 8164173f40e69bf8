"""A worker actor's messages carried by Ray itself, for a controller its workers can't connect to: one
attached through Ray Client (`ss.cluster("ray://head:10001")`), such as a notebook on a laptop that
reaches only the head's client port. Without Ray Client the workers connect straight to the
controller (ray_workers.py), which is faster.

Each side keeps a local pipe whose far end is the connection pool.py or worker.py already uses, so
neither knows the difference:

- controller to worker: a thread takes each message off the controller's pipe and sends it as
  `actor.push.remote(number, data)`; the actor writes the messages to its worker's pipe in their
  numbers' order (a threaded actor may run two pushes at once, in either order);
- worker to controller: a thread asks `actor.pull.remote(wait)` again and again; each answer is every
  message the worker has written since (or none, after `wait` seconds), which the thread writes to
  the controller's pipe, and whether the worker's side has closed.

When the worker closes its side, or its actor dies, the controller's pipe closes: the pool reads
the end of its connection and asks Ray how the worker ended, as with a direct connection.
"""

from __future__ import annotations

import socket
import threading
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import Any

PULL_WAIT = 1.0  # seconds a pull waits for the worker's next message before answering with none
PULL_MOST = 64  # messages at most in one pull's answer


def _wake(conn: Connection) -> None:
    """End both directions of a pipe's socket, waking a thread blocked reading it, without closing
    the descriptor under that thread (which a later open could reuse)."""
    try:
        sock = socket.socket(fileno=conn.fileno())
    except (OSError, ValueError):
        return  # already closed
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()


class Mailbox:
    """The actor's side: `worker_end` is the worker's connection; `push` and `pull` are called by the
    controller's relay threads (the actor's methods of the same names)."""

    def __init__(self) -> None:
        self.worker_end, self._end = Pipe(duplex=True)
        self._order = threading.Lock()
        self._next = 0  # the number of the next message the worker is to read
        self._early: dict[int, bytes] = {}  # messages that came before one numbered lower

    def push(self, number: int, data: bytes) -> None:
        with self._order:
            self._early[number] = data
            while self._next in self._early:
                self._end.send_bytes(self._early.pop(self._next))
                self._next += 1

    def pull(self, wait: float) -> tuple[list[bytes], bool]:
        """(the worker's messages written since the last pull, whether its side has closed)."""
        messages: list[bytes] = []
        try:
            if self._end.poll(wait):
                while len(messages) < PULL_MOST and (not messages or self._end.poll(0)):
                    messages.append(self._end.recv_bytes())
        except (EOFError, OSError):
            return messages, True
        return messages, False


class RelayedConnection:
    """The controller's side for one actor: `conn` is what the pool uses as the worker's connection.
    `close()` ends the relay (the pool closes `conn` as it stops; that ends it too)."""

    def __init__(self, actor: Any, ray: Any, name: str) -> None:
        self.conn, self._ours = Pipe(duplex=True)
        self._actor, self._ray = actor, ray
        self._closed = threading.Event()
        self._running, self._count = 2, threading.Lock()  # the last thread to end closes our pipe
        self._threads = [threading.Thread(target=self._send, name=f"relay to {name}", daemon=True),
                         threading.Thread(target=self._receive, name=f"relay from {name}", daemon=True)]
        for thread in self._threads:
            thread.start()

    def _send(self) -> None:
        number = 0
        try:
            while True:
                data = self._ours.recv_bytes()  # EOFError once the pool closes its connection
                # Not waited for: its order is the number's, and an actor that died is the pool's to see.
                self._actor.push.remote(number, data)
                number += 1
        except (EOFError, OSError):
            pass
        finally:
            self._ended()

    def _receive(self) -> None:
        try:
            while not self._closed.is_set():
                messages, ended = self._ray.get(self._actor.pull.remote(PULL_WAIT))
                for data in messages:
                    self._ours.send_bytes(data)
                if ended:
                    break
        except Exception:
            pass  # the actor died, its node was lost, or Ray was shut down: the pool asks Ray how
        finally:
            self._ended()

    def _ended(self) -> None:
        self.close()
        with self._count:
            self._running -= 1
            last = self._running == 0
        if last:
            self._ours.close()

    def close(self) -> None:
        """End the relay: the pool's connection reads its end, and both threads stop."""
        if not self._closed.is_set():
            self._closed.set()
            _wake(self._ours)
