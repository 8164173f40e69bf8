"""Polling for a message before sleeping (parallel/spin.py): the budget's setting, the poll itself,
and pools whose controller and workers find their messages by polling, as the kernel's own count of
each process's sleeps shows."""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from shapescript.api import parse_devices
from shapescript.errors import WorkerError
from shapescript.parallel import spin
from shapescript.parallel.pool import WorkerPool


@pytest.mark.parametrize(("text", "seconds"), [("", spin.BUDGET), ("0", 0.0), ("50", 50e-6), (" 1000000 ", 1.0)])
def test_the_budget_is_the_default_or_the_environments(text: str, seconds: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(spin.ENV, text)
    assert spin.budget() == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["fast", "-1", "nan", "2e6"])
def test_a_bad_budget_is_refused_by_name(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(spin.ENV, text)
    with pytest.raises(ValueError, match=f"{spin.ENV} must be"):
        spin.budget()
    with pytest.raises(ValueError, match=f"{spin.ENV} must be"):
        WorkerPool(parse_devices("cpu[0 1]"))  # before any worker starts


def polling(sock: socket.socket) -> select.poll:
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return poller


def test_poll_briefly_finds_a_message_sent_while_it_polls_and_gives_up_after_its_budget() -> None:
    a, b = socket.socketpair()
    with a, b:
        poller = polling(a)
        t0 = time.perf_counter()
        assert spin.poll_briefly(poller, 0.05) == []
        assert time.perf_counter() - t0 >= 0.05

        sender = threading.Timer(0.02, b.send, (b"x",))
        sender.start()
        t0 = time.perf_counter()
        ready = spin.poll_briefly(poller, 30.0)
        sender.join()
        assert ready == [(a.fileno(), select.POLLIN)]
        assert time.perf_counter() - t0 < 25  # found when it came, not at the budget's end
        assert spin.poll_briefly(poller, 0.0) == ready  # still unread: found by the first poll


def sleeps(pid: int, tid: int | None = None) -> int:
    """How many times the kernel has put this thread to sleep (a yield is not a sleep)."""
    path = Path(f"/proc/{pid}/task/{tid}/status") if tid else Path(f"/proc/{pid}/status")
    for line in path.read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no count of sleeps in {path}")


@pytest.mark.parametrize("micros", ["0", "1000000"])
def test_the_controller_and_the_workers_find_their_messages_by_polling(micros: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With polling off, each of 50 calls puts the controller to sleep until the replies come (the
    workers take 2 ms), and each of 50 pings puts each worker to sleep until the next one comes; with
    a budget longer than any of those waits, they poll instead and hardly ever sleep."""
    monkeypatch.setenv(spin.ENV, micros)
    me = threading.get_native_id()
    with WorkerPool(parse_devices("cpu[0 1]")) as pool:
        pool.start()
        pool.call("sleep", (0.002,))
        before = sleeps(os.getpid(), me)
        for _ in range(50):
            pool.call("sleep", (0.002,))  # the workers sleep in it: only the controller's count tells
        controller = sleeps(os.getpid(), me) - before
        for _ in range(10):
            pool.call("ping", ())
        before_workers = [sleeps(pid) for pid in pool.pids]
        for _ in range(50):
            pool.call("ping", ())
        workers = [sleeps(pid) - n for pid, n in zip(pool.pids, before_workers)]
    if micros == "0":
        assert controller >= 40 and all(n >= 40 for n in workers), (controller, workers)
    else:
        # The controller is this test process, where threads left by earlier tests may take the GIL
        # from it now and then (a wait for the GIL is a sleep too): CI once counted 14. At most one
        # sleep in two calls still says that polling found the replies.
        assert controller <= 25 and all(n <= 10 for n in workers), (controller, workers)


def test_a_worker_killed_while_the_controller_polls_is_found_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(spin.ENV, "1000000")  # a second's polling in each wait for the replies
    with WorkerPool(parse_devices("cpu[0 1]")) as pool:
        pool.start()
        timer = threading.Timer(0.3, os.kill, (pool.pids[0], signal.SIGKILL))
        timer.start()
        t0 = time.perf_counter()
        try:
            with pytest.raises(WorkerError, match="worker 0 .* killed by SIGKILL"):
                pool.call("sleep", (60,))
        finally:
            timer.cancel()
        assert time.perf_counter() - t0 < 5
