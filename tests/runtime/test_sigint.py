"""Ctrl-C held during a step without a handler install per step (runtime/sigint.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType

import pytest
import torch

import shapescript as ss
from shapescript.runtime import sigint


class Stray(Exception):
    pass


def _stray(signum: int, frame: FrameType | None) -> None:
    raise Stray


@pytest.fixture
def stray_handler() -> Iterator[None]:
    """The test's own SIGINT handler, put back as it was afterwards (pytest's must not see a Ctrl-C)."""
    previous = signal.signal(signal.SIGINT, _stray)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.02)  # handled here, between bytecodes


def test_a_held_ctrl_c_goes_to_the_holder_and_otherwise_to_the_handler_replaced(stray_handler: None) -> None:
    seen: list[int] = []
    token = sigint.hold_ctrl_c(lambda signum, frame: seen.append(signum))
    try:
        ctrl_c()
    finally:
        sigint.release_ctrl_c(token)
    assert seen == [signal.SIGINT]
    with pytest.raises(Stray):
        ctrl_c()


def test_holds_nest() -> None:
    outer: list[int] = []
    inner: list[int] = []
    with_stray = signal.signal(signal.SIGINT, _stray)
    try:
        a = sigint.hold_ctrl_c(lambda s, f: outer.append(s))
        b = sigint.hold_ctrl_c(lambda s, f: inner.append(s))
        ctrl_c()
        sigint.release_ctrl_c(b)
        ctrl_c()
        sigint.release_ctrl_c(a)
        with pytest.raises(Stray):
            ctrl_c()
    finally:
        signal.signal(signal.SIGINT, with_stray)
    assert (len(outer), len(inner)) == (1, 1)


def test_a_handler_installed_and_restored_around_a_hold_comes_back_as_it_was(stray_handler: None) -> None:
    """Code that saves the handler (ours), installs its own, holds, and restores what it saved: Ctrl-C
    afterwards reaches the handler that was in effect before it, not the one in between."""
    sigint.release_ctrl_c(sigint.hold_ctrl_c(lambda s, f: None))  # a router in front of the stray handler
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    sigint.release_ctrl_c(sigint.hold_ctrl_c(lambda s, f: None))  # a router in front of Python's own
    signal.signal(signal.SIGINT, saved)
    with pytest.raises(Stray):
        ctrl_c()


def test_a_hold_from_another_thread_changes_nothing(stray_handler: None) -> None:
    before = signal.getsignal(signal.SIGINT)
    tokens: list[object] = []
    thread = threading.Thread(target=lambda: tokens.append(sigint.hold_ctrl_c(lambda s, f: None)))
    thread.start()
    thread.join()
    assert tokens == [False]
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(Stray):
        ctrl_c()


def test_training_installs_no_handler_per_step(monkeypatch: pytest.MonkeyPatch, stray_handler: None) -> None:
    prog = ss.load("dim D = 3\nmodel M:\n    param w: [D] = normal(std=0.1)\n"
                   "fn loss(m: M, x: [b D]) -> [] = mean(x @ m.w, over=b)\n"
                   "fn step(mut m: M, mut opt: AdamW[M], x: [b D]) -> []:\n"
                   "    l, g = value_and_grad(loss, m, x)\n"
                   "    update(mut m, mut opt, g)\n    return l\n", devices="cpu")
    m = prog.M.init(seed=0)
    opt = ss.adamw(m, lr=1e-2)
    x = torch.randn(4, 3)
    prog.step(m, opt, x)  # the first step may put the router in place
    installs: list[object] = []
    real = signal.signal
    monkeypatch.setattr(signal, "signal", lambda signum, handler: installs.append(handler) or real(signum, handler))
    for _ in range(20):
        prog.step(m, opt, x)
    assert installs == []
    monkeypatch.undo()
    with pytest.raises(Stray):  # and Ctrl-C between steps is the handler's in effect
        ctrl_c()
