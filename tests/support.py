"""Paths and switches the tests share (imported as `support`, since each folder has its own conftest)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
UPDATE_GOLDEN = os.environ.get("SHAPESCRIPT_UPDATE_GOLDEN") == "1"


def assert_golden(text: str, path: Path, update: bool = UPDATE_GOLDEN) -> None:
    """`text` is what the golden file at `path` holds. A missing golden file fails: one is written
    only when asked (`update`, from SHAPESCRIPT_UPDATE_GOLDEN=1), to be reviewed and committed."""
    if update:
        path.write_text(text)
    if not path.exists():
        raise AssertionError(f"no golden file {path}: run the test with SHAPESCRIPT_UPDATE_GOLDEN=1 to write "
                             f"it, then review it")
    assert text == path.read_text(), f"the output differs from {path}"


def cli(*args: str, cwd: Path = ROOT, **run: Any) -> subprocess.CompletedProcess:
    """`shapescript ARGS` (python -m shapescript.cli) run as a subprocess on this checkout's package, in
    `cwd`: its exit code and what it printed (tests/frontends/test_cli.py, tests/several/test_sharding.py)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "shapescript.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, **run)


README_MLP_SHAPES = [(784, 256), (256, 10)]  # the README's Mlp: w1 [D Hd], w2 [Hd C]


def param_and_adamw_bytes(shapes: list[tuple[int, ...]]) -> tuple[int, int]:
    """The bytes of f32 params of `shapes`, and of the state torch's own AdamW keeps for them after
    a step (two moments a param, and its step count as torch keeps it): what the workers should say
    their models and optimizers take, computed by torch alone."""
    import torch  # here: most tests that import support need no torch of their own
    params = [torch.zeros(shape, requires_grad=True) for shape in shapes]
    opt = torch.optim.AdamW(params)
    torch.stack([p.sum() for p in params]).sum().backward()
    opt.step()
    state = [t for per_param in opt.state.values() for t in per_param.values() if isinstance(t, torch.Tensor)]
    return sum(p.numel() * p.element_size() for p in params), sum(t.numel() * t.element_size() for t in state)


@contextmanager
def importable(folder: Path, module: str, source: str) -> Iterator[Path]:
    """`source` as the module `module` in `folder`, on sys.path while the block runs: a module only the
    controller's sys.path finds (the workers get that path), e.g. to register handlers of a test's own."""
    (folder / f"{module}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))


# Ctrl-C from a thread of the test (tests/parallel/test_interrupts.py, tests/cluster/test_failures.py).
def interrupt_after(*delays: float) -> threading.Thread:
    """Ctrl-C this process after each of `delays` seconds (counted from now), from a thread."""
    def send() -> None:
        start = time.monotonic()
        for delay in delays:
            time.sleep(max(0.0, start + delay - time.monotonic()))
            os.kill(os.getpid(), signal.SIGINT)
    thread = threading.Thread(target=send)
    thread.start()
    return thread


LONG_STEP = "`a long step`"  # the `where` of interrupted_once's and interrupted_twice's calls


def interrupted_once(pool: Any) -> BaseException:
    """A 1.5 s step on the pool's workers (the `sleep` handler) with one Ctrl-C 0.4 s in: the
    StepInterrupt raised once the step has run to its end, which is asserted."""
    from shapescript.parallel.interrupts import StepInterrupt
    thread = interrupt_after(0.4)
    start = time.monotonic()
    with pytest.raises(StepInterrupt) as info:
        pool.call("sleep", (1.5,), where=LONG_STEP)
    thread.join()
    assert time.monotonic() - start >= 1.5  # the step ran to its end
    return info.value


def interrupted_twice(pool: Any) -> BaseException:
    """A 30 s step with a second Ctrl-C soon after the first: the plain KeyboardInterrupt (not a
    StepInterrupt) raised at once, which is asserted."""
    from shapescript.parallel.interrupts import SECOND_INTERRUPT_S, StepInterrupt
    thread = interrupt_after(0.4, 0.4 + SECOND_INTERRUPT_S / 2)  # after a double click's time (DOUBLE_CLICK_S)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt) as info:
        pool.call("sleep", (30.0,), where=LONG_STEP)
    thread.join()
    assert not isinstance(info.value, StepInterrupt) and time.monotonic() - start < 10
    return info.value


def fork_server_pids() -> set[int]:
    """The pid of this process's fork server (parallel/forkserver.py), a child it keeps on purpose
    between pools; none where it has none."""
    from shapescript.parallel import forkserver
    server = forkserver._server
    return {server.proc.pid} if server is not None and server.alive() else set()


@contextmanager
def loaded_with_timeout(source: str, devices: str, name: str, seconds: float) -> Iterator[Any]:
    """`source` loaded on `devices`, every collective timing out after `seconds` while it lives (pools
    started again after a failure stopped one included), so that a test of a failure that would
    hang fails fast instead."""
    import shapescript as ss
    ss.collective_timeout(seconds)
    try:
        prog = ss.load(source, devices=devices, name=name)
        try:
            yield prog
        finally:
            prog.stop()
    finally:
        ss.collective_timeout(None)
