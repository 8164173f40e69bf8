"""The controller's port while Ray workers connect (parallel/handshake.py): every
connection is served at once, each with a deadline of its own, so connections that send nothing, too
little or a wrong token are closed without holding up the real workers. In process, on the loopback:
the "workers" are sockets of this test that send their tokens, as ShapeScriptWorker.serve does."""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from shapescript.errors import WorkerError
from shapescript.parallel import handshake, ray_workers
from shapescript.parallel.handshake import NotConnected, accept_workers

TOKEN = ray_workers.TOKEN_BYTES
IDLE = 8  # idle connections opened before the workers': one after another at 5 s each, 40 s


def listener() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def connect(port: int, sends: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(sends)
    return sock


def closed_by_the_controller(sock: socket.socket) -> bool:
    """Whether the other side closed `sock` (it reads EOF), waiting up to 30 s for it to."""
    sock.settimeout(30)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def still_open(sock: socket.socket) -> bool:
    """Whether `sock` is open at the other end now: nothing to read yet, and no EOF."""
    sock.setblocking(False)
    try:
        sock.recv(1)
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        sock.setblocking(True)
    return False


def assert_each_rank_reaches_its_worker(conns: list[Any], workers: dict[int, socket.socket]) -> None:
    """Each rank's connection is the one its token came on: what the controller sends on conns[r]
    arrives at worker r (a multiprocessing Connection's 4-byte length, then the bytes)."""
    assert len(conns) == len(workers)
    for rank, conn in enumerate(conns):
        conn.send_bytes(f"rank {rank}".encode())
    for rank, sock in workers.items():
        sock.settimeout(30)
        assert sock.recv(64)[4:] == f"rank {rank}".encode()


class FakeRay:
    """What ray_workers._accept asks of Ray: whether an actor's `serve` task ended (none has). Each
    ask runs `hook` first, which is how a test acts while the accept loop runs."""

    def __init__(self, hook: Callable[[], None]) -> None:
        self.hook, self.asks = hook, 0

    def wait(self, refs: list[Any], timeout: float) -> tuple[list[Any], list[Any]]:
        self.asks += 1
        self.hook()
        return [], list(refs)


def test_the_workers_are_accepted_while_idle_and_bogus_connections_stay_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the launcher's own _accept: eight idle connections, one sending a wrong token and one
    a few bytes of garbage come first; the three workers connect (ranks in reverse) once the loop
    runs. The old loop read each connection's token in turn, waiting 5 s on each idle one (40 s here)
    before it reached a worker; now the workers are in at once and the rest closed after."""
    with listener() as listening:
        port = listening.getsockname()[1]
        tokens = [secrets.token_bytes(TOKEN) for _ in range(3)]
        bogus = [connect(port) for _ in range(IDLE)]
        bogus += [connect(port, secrets.token_bytes(TOKEN)), connect(port, b"GET /")]
        workers: dict[int, socket.socket] = {}

        def workers_connect() -> None:
            if not workers:
                for rank in reversed(range(3)):
                    workers[rank] = connect(port, tokens[rank])

        fake = FakeRay(workers_connect)
        monkeypatch.setattr(ray_workers, "ray_module", lambda: fake)
        result: list[Any] = []
        accepting = threading.Thread(
            target=lambda: result.append(ray_workers._accept(listening, tokens, ["serve"] * 3, "cpu[0 1 2]")),
            daemon=True)
        accepting.start()
        accepting.join(timeout=IDLE * handshake.TOKEN_TIMEOUT / 2)  # generous; the old loop needs 8 x 5 s
        assert not accepting.is_alive(), "the workers waited for the idle connections' deadlines"
    assert fake.asks >= 1
    assert_each_rank_reaches_its_worker(result[0], workers)
    assert all(closed_by_the_controller(sock) for sock in bogus)  # none of them was taken for a worker
    for sock in [*bogus, *workers.values()]:
        sock.close()


def test_a_connection_without_its_token_is_closed_at_its_own_deadline_while_the_loop_goes_on() -> None:
    """With a short per-connection deadline, the idle and the half-token connections are closed
    while the loop still waits for the workers, who connect only once both are; the loop then
    takes them. The whole wait has a deadline of a minute: only the connections' own ran out."""
    with listener() as listening:
        port = listening.getsockname()[1]
        tokens = [secrets.token_bytes(TOKEN) for _ in range(2)]
        idle, half = connect(port), connect(port, tokens[0][:TOKEN // 2])
        workers: dict[int, socket.socket] = {}
        events: list[str] = []

        def look() -> None:
            if not workers and not still_open(idle) and not still_open(half):
                events.append("idle and half closed")
                workers.update({rank: connect(port, token) for rank, token in enumerate(tokens)})

        conns = accept_workers(listening, tokens, time.monotonic() + 60, look, look_every=0.02, token_timeout=0.1)
    assert events == ["idle and half closed"]
    assert_each_rank_reaches_its_worker(conns, workers)
    for sock in [idle, half, *workers.values()]:
        sock.close()


def test_a_token_used_once_is_refused_the_second_time_and_a_worker_may_send_it_in_pieces() -> None:
    with listener() as listening:
        port = listening.getsockname()[1]
        tokens = [secrets.token_bytes(TOKEN) for _ in range(2)]
        first = connect(port, tokens[0])
        sent: dict[str, socket.socket] = {}

        def look() -> None:  # a replay of worker 0's token, then worker 1's token in two parts
            if not sent:
                sent["replay"] = connect(port, tokens[0])
                sent["pieces"] = connect(port, tokens[1][:5])
            elif "rest" not in sent:
                sent["pieces"].sendall(tokens[1][5:])
                sent["rest"] = sent["pieces"]

        conns = accept_workers(listening, tokens, time.monotonic() + 60, look, look_every=0.02)
        assert closed_by_the_controller(sent["replay"])
    assert_each_rank_reaches_its_worker(conns, {0: first, 1: sent["pieces"]})
    for sock in [first, sent["replay"], sent["pieces"]]:
        sock.close()


def test_a_flood_of_idle_connections_keeps_a_bounded_number_open_and_the_workers_get_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handshake, "MAX_PENDING", 4)
    with listener() as listening:
        port = listening.getsockname()[1]
        tokens = [secrets.token_bytes(TOKEN)]
        flood = [connect(port) for _ in range(12)]
        worker: dict[int, socket.socket] = {}
        open_counts: list[int] = []

        def look() -> None:  # the worker comes once at most 4 of the flood are open (none had 1 h)
            open_counts.append(sum(still_open(sock) for sock in flood))
            if open_counts[-1] <= 4 and not worker:
                worker[0] = connect(port, tokens[0])

        conns = accept_workers(listening, tokens, time.monotonic() + 60, look, look_every=0.02, token_timeout=3600)
    assert_each_rank_reaches_its_worker(conns, worker)
    assert open_counts[0] == 12  # the backlog's connections are open until accepted, and then closed
    assert all(closed_by_the_controller(sock) for sock in flood)
    for sock in [*flood, *worker.values()]:
        sock.close()


def test_missing_workers_are_named_and_the_connected_ones_closed() -> None:
    with listener() as listening:
        port = listening.getsockname()[1]
        tokens = [secrets.token_bytes(TOKEN) for _ in range(3)]
        middle = connect(port, tokens[1])
        with pytest.raises(NotConnected) as raised:
            accept_workers(listening, tokens, time.monotonic() + 0.3, lambda: None, look_every=0.05)
    assert raised.value.ranks == [0, 2]
    assert closed_by_the_controller(middle)
    middle.close()


def test_what_look_raises_stops_the_loop_and_every_connection_is_closed() -> None:
    with listener() as listening:
        port = listening.getsockname()[1]
        tokens = [secrets.token_bytes(TOKEN) for _ in range(2)]
        first, idle = connect(port, tokens[0]), connect(port)
        looks: list[int] = []

        def look() -> None:
            looks.append(1)
            if len(looks) == 3:
                raise WorkerError("worker 1 failed to start on the cluster")

        with pytest.raises(WorkerError, match="worker 1 failed"):
            accept_workers(listening, tokens, time.monotonic() + 60, look, look_every=0.02)
    assert closed_by_the_controller(first) and closed_by_the_controller(idle)
    first.close()
    idle.close()
