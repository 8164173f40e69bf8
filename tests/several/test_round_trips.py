"""Fewer round trips' costs: worker 0 alone answers a whole result, the others
None; a result split along the batch axis still comes from every worker; the wire format's shortcuts
for tensors; the memory peak read after the reply. Results are compared with devices="cpu"."""

from __future__ import annotations

import errno
import os
import pickle
import resource
import sys
from typing import Any

import pytest
import torch
from programs import LINEAR

import shapescript as ss
from shapescript.errors import WorkerError
from shapescript.parallel import memory as memory_mod
from shapescript.parallel import worker as worker_mod
from shapescript.parallel.memory import CPU_LIFETIME_PEAK, CPU_PEAK, Meter
from shapescript.parallel.timeline import WorkerTiming

# Unsplit calls with a whole result (`ident`, `col_sums`), a split one joined from the parts
# (`scores`), split ones with a whole result (`loss`, `step`), and the loop `fit`.
PROGRAM = LINEAR + """
fn ident(x: [n]) -> [n] = x

fn col_sums(m: Lin) -> [C] = sum(m.w, over=D)
"""


def batch(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 4, generator=g), "y": torch.randint(0, 3, (n,), generator=g)}


def every_result(prog: Any) -> list[torch.Tensor]:
    """Several calls of each kind, in turns, and each one's result."""
    m = prog.Lin.init(seed=0)
    opt = ss.adamw(m, lr=0.1)
    out: list[torch.Tensor] = []
    for k in range(4):
        b = batch(7 + k, seed=k)  # 7 to 10 rows: uneven parts on 2 and 3 workers
        out += [prog.step(m, opt, b), prog.scores(m, b["x"]), prog.loss(m, b), prog.col_sums(m),
                prog.ident(torch.arange(3.0) + k)]
    sink = ss.sinks.memory()
    prog.fit(m, opt, ss.TensorDataset(**batch(21, seed=9)), sink)
    return out + [torch.tensor([r["loss"] for r in sink.records]), m.state_dict()["w"]]


@pytest.mark.slow
@pytest.mark.parametrize("devices", ["cpu[0 1]", "cpu[0 1 2]"])
def test_several_calls_give_what_one_device_gives(devices: str) -> None:
    one = every_result(ss.load(PROGRAM, devices="cpu", name="rt.ss"))
    prog = ss.load(PROGRAM, devices=devices, name="rt.ss")
    try:
        several = every_result(prog)
    finally:
        prog.stop()
    assert len(several) == len(one) == 22
    for a, b in zip(several, one):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b.detach(), atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def two() -> Any:
    prog = ss.load(PROGRAM, devices="cpu[0 1]", name="rt.ss")
    prog.ident(torch.zeros(1))  # starts the workers and loads the program
    yield prog
    prog.stop()


def recorded_replies(prog: Any, monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """The workers' answers to every call the program makes from now on (pool.call's list)."""
    pool, seen = prog._pool, []
    call = pool.call

    def recording(*args: Any, **kwargs: Any) -> Any:
        replies = call(*args, **kwargs)
        seen.append(replies)
        return replies
    monkeypatch.setattr(pool, "call", recording)
    return seen


@pytest.mark.slow
def test_only_worker_0_answers_a_whole_result(two: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    m = two.Lin.init(seed=0)
    b = batch(5, seed=1)
    replies = recorded_replies(two, monkeypatch)
    loss, scores, sums = two.loss(m, b), two.scores(m, b["x"]), two.col_sums(m)
    whole_loss, split_scores, whole_sums = replies
    # A whole result: worker 0's value, worker 1's None; every worker's timing for the timeline.
    for whole, value in ((whole_loss, loss), (whole_sums, sums)):
        assert torch.equal(whole[0][0], value) and whole[1][0] is None and whole[1][1] is None
        assert all(WorkerTiming(*r[2]).total > 0 for r in whole)  # every worker timed it: `wired` sends its fields
    # A result split along the batch axis: each worker's rows (3 and 2), joined in order.
    assert [r[0].shape[0] for r in split_scores] == [3, 2]
    assert torch.equal(torch.cat([r[0] for r in split_scores]), scores)
    torch.testing.assert_close(scores, b["x"] @ m.w, atol=1e-6, rtol=0)
    torch.testing.assert_close(sums, m.w.sum(0), atol=1e-6, rtol=0)


def test_the_call_handler_answers_on_every_worker_when_asked(two: Any) -> None:
    x = torch.arange(4.0)
    args = ("ident", (("tensor", x),), None)
    everyone = two._pool.call("call", args + (True,), where="ident, every worker")
    first_only = two._pool.call("call", args + (False,), where="ident, worker 0")
    assert [torch.equal(r[0], x) for r in everyone] == [True, True]
    assert torch.equal(first_only[0][0], x) and first_only[1][0] is None


def test_an_error_on_one_worker_names_it(two: Any) -> None:
    x = torch.arange(2.0)
    per_worker = [("ident", (("tensor", x),), None, False), ("ident", (("handle", 10**9),), None, False)]
    with pytest.raises(WorkerError, match=r"^worker 1 \(cpu:1\) raised KeyError while running `ident` here"):
        two._pool.call("call", per_worker, where="`ident` here")
    assert torch.equal(two.ident(x), x)  # the pool goes on


@pytest.mark.parametrize("tensor", [
    torch.split(torch.arange(14.0).reshape(7, 2), [4, 3])[1],  # a worker's part: a view at an offset
    torch.arange(24.0).reshape(2, 3, 4).half(),
    torch.arange(3.0).expand(2, 3),  # not contiguous: no storage of its own
    torch.randn(3, dtype=torch.complex64).conj(),  # a conjugate view: numpy refuses it
    torch.tensor(2.5),  # 0-d
    torch.zeros(0),
    torch.ones(1, dtype=torch.int16),
])
def test_tensors_travel_as_their_values(tensor: torch.Tensor) -> None:
    back = pickle.loads(worker_mod.dumps(("ok", tensor)))[1]
    assert back.dtype == tensor.dtype and back.shape == tensor.shape
    assert torch.equal(back, tensor.resolve_conj())


def vm_rss() -> int:
    """This process's resident memory as /proc/self/status's VmRSS says it, in bytes (Linux)."""
    with open("/proc/self/status") as status:
        return int(status.read().split("VmRSS:")[1].split("kB")[0]) * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status and clear_refs are Linux's")
def test_the_memory_peak_read_later_is_the_calls_own() -> None:
    meter = Meter(torch.device("cpu"))
    assert meter.how == CPU_PEAK
    assert abs(meter.now() - vm_rss()) < 8 << 20  # /proc/self/statm's resident pages, as VmRSS counts them
    size = 64 << 20
    with meter.measuring("a call", later=True):
        held = torch.ones(size // 4)  # written: resident
        del held
    peak = meter.last  # reading it reads the peak
    assert peak is not None and peak.what == "a call" and peak.added >= size * 0.9
    with meter.measuring("a small call", later=True):
        pass
    meter.settle()
    assert meter.last is not None and meter.last.what == "a small call" and meter.last.added < size // 2
    assert meter.largest is peak


def lifetime_peak_rss() -> int:
    """The reference for the fallback: the process's peak RSS since it started, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # ru_maxrss is bytes on macOS, KiB elsewhere


def test_without_proc_status_the_peak_is_the_lifetime_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where /proc/self/status can't be opened (not Linux), the meter says so in `how` and reads the
    process's peak since it started (ru_maxrss), for the memory now as for each call's peak."""
    def missing() -> None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "/proc/self/status")
    monkeypatch.setattr(memory_mod, "_ProcStatus", missing)
    meter = Meter(torch.device("cpu"))
    assert meter.how == CPU_LIFETIME_PEAK
    slack = 4 << 20  # the kernel's RSS counters are per-CPU sums, read a little late
    size = 64 << 20
    before = lifetime_peak_rss()
    with meter.measuring("a call"):
        held = torch.ones(size // 4)  # written: resident
        during = lifetime_peak_rss()  # at least the RSS while `held` is
        resident = vm_rss() if sys.platform.startswith("linux") else 0  # /proc is there: only the meter lost it
        del held  # freed: the RSS now falls back, the peak since the start doesn't
    after = lifetime_peak_rss()
    call = meter.last
    assert call is not None and call.what == "a call"
    assert before - slack <= call.before <= during + slack
    assert during - slack <= call.peak <= after + slack  # the peak, not the RSS once `held` has gone
    assert call.peak >= resident - slack
    assert during - slack <= meter.now() <= lifetime_peak_rss() + slack
