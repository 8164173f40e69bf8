"""The per-worker timeline: each call on the workers split into computing, loading
data, each collective by .ss line, waiting for the other workers and the controller's messages.

The references are independent of what the timeline measures: this test's own perf_counter around
each call (the parts must add up to it within 10%), the DeviceTable's collectives (each timed one
must be at the line it predicts, with its operation), a worker made slow on purpose by an extern fn
that sleeps on rank 1 only (the others must show that sleep as waiting, and rank 1 as slowest), and
a dataset whose items take a known time to load (the wait for them must show as data)."""

from __future__ import annotations

import re
import time
import warnings
from collections import Counter
from collections.abc import Iterator

import pytest
import torch
from programs import README

import shapescript as ss
from shapescript.notebook.throttle import Throttle
from shapescript.notebook.timeline import MEAN_OF, view_for
from shapescript.parallel.timeline import StepClock, WorkerTiming, timed
from shapescript.runtime.collectives import UPDATE_WHERE

HIDDEN, BATCH, STEPS = 1024, 512, 10  # enough work per call that the timing's noise is small
SLEEP = 0.2  # seconds rank 1 sleeps in each forward pass of the slow program: far more than its work

# The README's MLP with an extern fn in its forward pass that sleeps on rank 1 only.
SLOW = README.replace("fn forward(m: Mlp, x: [b D]) -> [b C]:\n    return relu(x @ m.w1) @ m.w2",
                      'extern fn pause(x: [b Hd]) -> [b Hd] = "test_timeline.pause_on_rank_one"\n\n'
                      "fn forward(m: Mlp, x: [b D]) -> [b C]:\n    return pause(relu(x @ m.w1)) @ m.w2")


class SlowDigits:
    """`n` digits loaded item by item, each taking `PER_ITEM` seconds (the workers import it from here)."""

    PER_ITEM = 0.02  # a batch part (32 items) takes far longer to load than a step to run

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        time.sleep(self.PER_ITEM)
        return {"img": torch.full((784,), i / self.n), "label": i % 10}


def pause_on_rank_one(x: torch.Tensor) -> torch.Tensor:
    """The slow program's extern fn: worker 1 sleeps, the others go on to the next collective."""
    if torch.distributed.is_initialized() and torch.distributed.get_rank() == 1:
        time.sleep(SLEEP)
    return x


def load(source: str, devices: str) -> ss.api.Program:
    with warnings.catch_warnings():  # Hd replaced: the warning says so
        warnings.simplefilter("ignore")
        return ss.load(source, devices=devices, dims={"Hd": HIDDEN}, name="mlp.ss")


@pytest.fixture(scope="module")
def two_workers() -> Iterator[ss.api.Program]:
    """The README's MLP on cpu[0 1], its workers started (once for the module: the slow program adopts them)."""
    prog = load(README, "cpu[0 1]")
    prog.workers()
    yield prog
    prog.stop()


def batch(seed: int, size: int = BATCH) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"img": torch.randn(size, 784, generator=g), "label": torch.randint(0, 10, (size,), generator=g)}


def timed_steps(prog: ss.api.Program, steps: int = STEPS, size: int = BATCH) -> list[float]:
    """Train for `steps` calls after two to warm up; each call's seconds as measured here."""
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-3)
    for k in range(2):
        prog.train_step(m, opt, batch(k, size))
    seconds = []
    for data in [batch(k, size) for k in range(steps)]:  # made before: only the call is timed
        began = time.perf_counter()
        prog.train_step(m, opt, data)
        seconds.append(time.perf_counter() - began)
    return seconds


def compute_cpu_seconds(rows: int) -> float:
    """The CPU time one thread of this process takes for the README MLP's forward and backward passes
    on `rows` rows (the least of 3): what a worker's compute of its part of a call takes at the least,
    however busy the machine (a busy machine adds wall time, not CPU time)."""
    g = torch.Generator().manual_seed(0)
    w1 = (torch.randn(784, HIDDEN, generator=g) * 0.02).requires_grad_()
    w2 = (torch.randn(HIDDEN, 10, generator=g) * 0.02).requires_grad_()
    x, label = torch.randn(rows, 784, generator=g), torch.randint(0, 10, (rows,), generator=g)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = []
        for _ in range(3):
            began = time.thread_time()
            torch.nn.functional.cross_entropy(torch.relu(x @ w1) @ w2, label).backward()
            times.append(time.thread_time() - began)
    finally:
        torch.set_num_threads(threads)
    return min(times)


def predicted_collectives(prog: ss.api.Program) -> Counter:
    """(line, column, operation) of each collective one call of train_step runs, as the DeviceTable says."""
    from test_comms import expected  # the DeviceTable's collectives of a call, as the comms tests read them
    return Counter({(line, col, op): n for (line, col, _, _, op), n in expected(prog, "train_step").items()})


def located(where: str) -> tuple[int, int]:
    match = re.fullmatch(r"mlp\.ss:(\d+):(\d+)", where)
    assert match, where
    return int(match[1]), int(match[2])


@pytest.mark.slow
def test_the_parts_of_each_call_add_up_to_its_time_measured_here_on_two_workers(two_workers: ss.api.Program) -> None:
    adds_up(two_workers, ["cpu:0", "cpu:1"])


@pytest.mark.slow
def test_the_parts_of_each_call_add_up_to_its_time_measured_here_on_three_workers() -> None:
    prog = load(README, "cpu[0 1 2]")
    try:
        adds_up(prog, ["cpu:0", "cpu:1", "cpu:2"])
    finally:
        prog.stop()


def adds_up(prog: ss.api.Program, labels: list[str]) -> None:
    """Per call and worker, the parts add up to the call's time as measured here, within 10%; each
    collective is where the DeviceTable says; the table names every worker and marks one slowest."""
    before = prog.pool.timeline.count if prog.pool is not None else 0
    least = compute_cpu_seconds(BATCH // len(labels))
    measured = timed_steps(prog)
    table = prog.timeline(last=STEPS)
    predicted = predicted_collectives(prog)
    assert [s.number for s in table.steps] == list(range(before + 3, before + 3 + STEPS))  # after 2 to warm up
    assert predicted and sum(predicted.values()) >= 3  # the loss's forward and backward, the gradients
    for step, seconds in zip(table.steps, measured):
        assert step.fn == "train_step" and step.wall <= seconds
        parts = step.parts()
        assert [p.device for p in parts] == labels
        for p in parts:
            added = p.compute + p.data + sum(p.transfer.values()) + p.waiting + p.messages
            assert abs(added - seconds) <= 0.1 * seconds, (p, seconds)
            assert min(p.compute, p.data, p.waiting, p.messages, *p.transfer.values()) >= 0, p
            # at least the CPU time its part's forward and backward passes take (a worker computes on
            # one thread): a share of the call's wall time would fail on a loaded machine (0.029 s
            # against 0.1 x 0.405 s once), where the workers also wait for the CPU
            assert p.compute >= 0.5 * least, (p, least)
        for worker in step.workers:  # every collective at the line the DeviceTable predicts
            assert Counter((*located(where), op) for where, op, _ in worker.collectives
                           if where != UPDATE_WHERE) == predicted  # and the workers' failure flags' sum
        assert len({tuple(p.transfer.items()) for p in parts}) == 1  # each collective's fastest time, for all
    rows = table.rows
    assert len(rows) == STEPS * len(labels)
    assert all(sum(r["slowest"] for r in rows if r["step"] == s.number) == 1 for s in table.steps)
    text = str(table)
    for device in labels:
        assert re.search(rf"^{re.escape(device)} .*\d", text, re.M), text
    assert text.count("<- slowest") == 1, text
    assert "waiting" in text and "messages" in text and "mlp.ss:" in text


@pytest.mark.slow
def test_a_slow_worker_shows_as_the_others_waiting_and_is_marked_slowest(two_workers: ss.api.Program) -> None:
    prog = ss.load(SLOW, devices="cpu[0 1]", name="mlp.ss")  # the README's sizes: the sleep is most of a call
    assert prog.adopt_workers(two_workers)
    try:
        measured = timed_steps(prog, steps=3, size=64)
        table = prog.timeline(last=3)
    finally:
        assert two_workers.adopt_workers(prog)  # the workers run the README's program again
    loss_line = next(k for k, text in enumerate(SLOW.splitlines(), 1) if "return cross_entropy" in text)
    for step, seconds in zip(table.steps, measured):
        fast, slow = step.parts()
        assert step.slowest() == 1 and seconds > SLEEP
        assert slow.compute >= SLEEP  # the sleep is rank 1's own time
        assert fast.waiting >= 0.8 * SLEEP and slow.waiting < fast.waiting - 0.5 * SLEEP
        # rank 0 waited at the first collective after the forward pass: the loss's all-reduce
        first = next(iter(fast.waited_at))
        assert located(first.split()[0])[0] == loss_line and fast.waited_at[first] >= 0.8 * SLEEP
        for p in (fast, slow):
            added = p.compute + p.data + sum(p.transfer.values()) + p.waiting + p.messages
            assert abs(added - seconds) <= 0.1 * seconds
    slowest_line = next(line for line in str(table).splitlines() if line.endswith("<- slowest"))
    assert slowest_line.startswith("cpu:1 ")
    # What %shapescript timeline shows of the same timeline: a bar per worker, cpu:1 marked, the table.
    shown = view_for(Notebook(prog)).shown()
    assert shown.html is not None
    latest = shown.html.split("</svg>")[0]  # the bars of the latest call, the slow program's train_step
    train_line = next(k for k, text in enumerate(SLOW.splitlines(), 1) if text.startswith("fn train_step"))
    assert f"`train_step` (mlp.ss:{train_line}:" in latest
    bars = re.findall(r'<g class="ss-timeline-bar" data-worker="(\d)"><text[^>]*>([^<]*)</text>', latest)
    assert bars == [("0", "cpu:0"), ("1", "cpu:1 ◀ slowest")]
    assert "waiting: " in shown.html and "ss-timeline-table" in shown.html
    assert shown.text == str(prog.pool.timeline.table(MEAN_OF)) and "<- slowest" in shown.text


@pytest.mark.slow
def test_loading_the_batches_shows_as_data(two_workers: ss.api.Program) -> None:
    """`run` loops over a dataset that loads slower than a step: each worker's prefetch can't keep up,
    and the wait for its part of the batch is its data time."""
    m = two_workers.Mlp.init(seed=0)
    before = two_workers.pool.timeline.count
    two_workers.run(m, ss.adamw(m, lr=1e-3), SlowDigits(64 * 5), ss.sinks.memory())
    steps = [step for step in two_workers.timeline().steps if step.number > before]
    # 5 batches; the first call isn't kept if it waited for the workers to load the program again
    assert len(steps) >= 4 and all(step.fn == "train_step" for step in steps)
    part = 32 * SlowDigits.PER_ITEM  # each worker's half of a batch of 64, item by item
    for step in steps[-3:]:  # once the two batches fetched ahead are used up
        for p in step.parts():
            assert 0.3 * part <= p.data <= step.wall, (p, part)
        for worker in step.workers:  # the workers agree that each has its part before the step starts
            assert worker.collectives[0][0] == "loading the batch"


class Notebook:
    """What the notebook's view reads of a session: its program."""

    def __init__(self, program: ss.api.Program) -> None:
        self.program = program


def test_a_call_costs_the_clock_a_few_microseconds() -> None:
    """The clock of a call with ten collectives, as the workers run it on cpu, against the same loop
    with no clock at all: the overhead that docs/several-devices.md gives. In this thread's CPU time:
    on a loaded machine the wall time also counts the other processes' turns."""
    clock = StepClock(torch.device("cpu"))
    calls, collectives = 2000, 10

    def timed_calls() -> float:
        began = time.thread_time()
        for _ in range(calls):
            with timed(clock):
                with clock.loading():
                    pass
                for _ in range(collectives):
                    clock.operation("all-reduce")
                    clock.begin("mlp.ss:20:12")
                    clock.end()
            clock.take()
        return (time.thread_time() - began) / calls

    def bare_calls() -> float:
        began = time.thread_time()
        for _ in range(calls):
            for _ in range(collectives):
                pass
        return (time.thread_time() - began) / calls

    timed_calls()
    overhead = min(timed_calls() for _ in range(3)) - min(bare_calls() for _ in range(3))
    assert overhead < 50e-6, f"{overhead * 1e6:.1f} µs a call"
    with timed(clock):
        clock.operation("all-reduce")
        clock.begin("f.ss:1:1")
        time.sleep(0.01)
        clock.end()
    timing = clock.take()
    assert isinstance(timing, WorkerTiming) and timing.collectives[0][:2] == ("f.ss:1:1", "all-reduce")
    assert 0.01 <= timing.collectives[0][2] <= timing.total and clock.take() is None


def test_the_environment_turns_the_clock_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAPESCRIPT_TIMELINE", "off")
    clock = StepClock(torch.device("cpu"))  # as a worker started with it makes its clock
    with timed(clock):
        clock.begin("f.ss:1:1")
        clock.end()
    assert clock.take() is None and not clock.running


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the cuda clock needs a GPU")
def test_on_cuda_a_collective_is_timed_by_events_on_the_stream() -> None:
    """On cuda the host returns before the work has run: the clock's events time the kernel that ran
    between `begin` and `end` (a spin of some 25 ms on the GPU), not the host's quick return."""
    clock = StepClock(torch.device("cuda"))
    with timed(clock):
        clock.operation("all-reduce")
        clock.begin("f.ss:1:1")
        host = time.perf_counter()
        torch.cuda._sleep(50_000_000)  # GPU cycles: about 25 ms at 2 GHz
        host = time.perf_counter() - host
        clock.end()
    timing = clock.take()
    assert timing is not None and host < 0.005  # the launch returned at once
    seconds = timing.collectives[0][2]
    assert 0.005 < seconds <= timing.total, (seconds, timing.total)


def test_without_workers_the_timeline_says_why_it_is_empty() -> None:
    one = ss.load(README, devices="cpu", name="mlp.ss")
    assert one.timeline().rows == [] and "one device (cpu)" in str(one.timeline())
    several = ss.load(README, devices="cpu[0 1]", name="mlp.ss")  # no call yet: no workers started
    assert several.timeline().rows == [] and "No workers run on cpu[0 1] now" in str(several.timeline())
    assert several.pool is None
    with pytest.raises(ValueError, match="last is a number of steps"):
        several.timeline(last=-1)


def test_the_throttle_draws_at_most_once_an_interval_and_always_the_last() -> None:
    drawn: list[float] = []
    throttle = Throttle(lambda: drawn.append(time.monotonic()), 0.1)
    began = time.monotonic()
    while time.monotonic() - began < 0.35:
        throttle.poke()
        time.sleep(0.005)
    last_poke = time.monotonic()
    while (not drawn or drawn[-1] < last_poke - 0.1) and time.monotonic() < last_poke + 30:
        time.sleep(0.01)  # the last pokes' draw, however late the machine runs its timer
    # At most one draw an interval (however the machine schedules the pokes), and the last poke drawn.
    assert 2 <= len(drawn) <= (last_poke - began) / 0.1 + 1, drawn
    assert all(b - a >= 0.09 for a, b in zip(drawn, drawn[1:]))
    assert drawn[-1] >= last_poke - 0.1  # the pokes at the end were drawn


def test_no_bar_runs_off_the_drawing_when_a_workers_own_time_is_longer_than_the_call() -> None:
    """A call sent ahead of the reply before it can take a worker longer than the controller's time
    of it (its messages come out negative, drawn as nothing): the bars are scaled to the longest, so
    each fits the drawing (a bar once ran off it in notebook 02)."""
    import re as re_

    from shapescript.notebook.timeline import NAME, WIDTH, bars_svg
    from shapescript.parallel.timeline import Step, WorkerTiming
    step = Step(1, "`step` (x.ss:3:4)", wall=0.010,
                workers=(WorkerTiming(0.016, 0.001, (("x.ss:2:5", "all-reduce", 0.002),)),
                         WorkerTiming(0.008, 0.001, (("x.ss:2:5", "all-reduce", 0.004),))),
                devices=("cpu:0", "cpu:1"))
    rect = re_.compile(r'<rect x="([\d.]+)" y="\d+" width="([\d.]+)"')
    bars = [[(float(x), float(w)) for x, w in rect.findall(bar)]
            for bar in re_.findall(r'<g class="ss-timeline-bar".*?</g>', bars_svg(step))]
    ends = [rects[-1][0] + rects[-1][1] for rects in bars]
    assert len(bars) == 2 and all(rects[0][0] == NAME for rects in bars)
    assert max(ends) == pytest.approx(WIDTH, abs=0.2)  # the longest bar fills the drawing, and no more
