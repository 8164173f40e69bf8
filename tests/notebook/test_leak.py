"""Hours of notebook work don't grow the workers or the kernel: twenty rounds of
`m = Mlp.init(...)`, `opt = ss.adamw(m)` and `run(m, opt, ss.TensorDataset(...), log)` with a
new dataset each round on cpu[0 1], as a person reassigns the same variables in a cell run again
and again (no gc.collect: reassigning drops the last reference). Each worker's and the kernel's
resident memory (psutil) after the 20th round stays within a bound of the 3rd's, computed from the
sizes, and `%shapescript status` lists exactly what the live variables hold: the last round's
model, optimizer and dataset. Once through the notebook's Session in this process, once in a real
kernel (test_kernel.py's), where the progress bars, IPython's history and the extension's trimming
of the C heap after each cell (notebook/workers.py's give_back_freed_memory) take part too:
without it the kernel grew by one dataset a round once glibc's heap had fragmented (in about one
run in three, from a round between 5 and 35 on)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import psutil
import pytest
from support import README_MLP_SHAPES, ROOT, param_and_adamw_bytes
from test_kernel import Kernel, cell, fresh, kernel  # noqa: F401  (the fixtures)
from test_session import Notebook, opened

from shapescript.notebook.workers import ask_workers, give_back_freed_memory, held_objects, pool_of, status_table

# The README's program on two CPUs, with bigger batches: fewer steps a round, the same objects.
PROGRAM = ((ROOT / "examples" / "readme" / "mlp.ss").read_text()
           .replace("devices cuda[0 1 2]", "devices cpu[0 1]").replace("batches(64)", "batches(512)"))
ROWS = 1536  # a dataset of 1536 digits: img [1536 784] f32 and label [1536] i64, 4.6 MiB
ROUNDS, WARM_UP = 20, 3
# What the person's cell does, the same names each round; `k` seeds the model and the data.
ROUND = """\
m = Mlp.init(seed={k})
opt = ss.adamw(m, lr=1e-3)
g = torch.Generator().manual_seed({k})
data = ss.TensorDataset(img=torch.randn({rows}, 784, generator=g), label=torch.randint(0, 10, ({rows},), generator=g))
log = ss.sinks.memory()
run(m, opt, data, log)
"""
DATA_BYTES = ROWS * (784 * 4 + 8)  # img f32, label i64
PARAMS, STATE = param_and_adamw_bytes(README_MLP_SHAPES)  # the model's params and AdamW's state, as torch counts them
ONE_ROUND = DATA_BYTES + PARAMS + STATE  # what a round makes on each worker (and in the kernel, which sends it)
HOLDS = (f"Every worker holds: m (Mlp model, {PARAMS:,} bytes ({PARAMS / 2**10:.0f} KiB) per device), "
         f"opt (AdamW[Mlp] optimizer, {STATE:,} bytes ({STATE / 2**20:.2f} MiB) per device), data (dataset "
         f"TensorDataset, {DATA_BYTES:,} bytes ({DATA_BYTES / 2**20:.2f} MiB) per device).")


def rss(pids: list[int]) -> list[int]:
    return [psutil.Process(pid).memory_info().rss for pid in pids]


def assert_bounded_over_the_rounds(round_: Callable[[int], None], pids: Callable[[], list[int]]) -> None:
    """Run the rounds; the processes `pids()` (the kernel, then each worker) must grow by less than
    three rounds' objects from the end of the warm-up to the last round (a leak of every round's
    objects would be 17 rounds' worth)."""
    for k in range(1, WARM_UP + 1):  # warm up: the workers' loaded code, the allocators' pools
        round_(k)
    watched = pids()
    before = rss(watched)
    for k in range(WARM_UP + 1, ROUNDS + 1):
        round_(k)
    growth = [a - b for a, b in zip(rss(watched), before)]
    assert max(growth) < 3 * ONE_ROUND, (
        f"over rounds {WARM_UP + 1} to {ROUNDS} the kernel, then each worker, grew by "
        f"{[f'{g / 2**20:.1f} MiB' for g in growth]}; a round makes {ONE_ROUND / 2**20:.1f} MiB")


@pytest.fixture
def nb() -> Iterator[Notebook]:
    with opened(PROGRAM) as notebook:
        yield notebook


@pytest.mark.slow
def test_twenty_rounds_in_a_session_keep_memory_bounded_and_status_lists_the_live_objects(nb: Notebook) -> None:
    ns = nb.ns
    exec("import torch\nimport shapescript as ss", ns)  # the notebook's imports

    def round_(k: int) -> None:
        exec(ROUND.format(k=k, rows=ROWS), ns)
        assert len(ns["log"].records) == -(-ROWS // 512)  # it trained: one loss a batch
        give_back_freed_memory()  # what the extension does after each cell (the kernel's test has the hook's own)

    program = ns["ss_program"]
    assert_bounded_over_the_rounds(round_, lambda: [os.getpid(), *pool_of(program).pids])  # type: ignore[union-attr]
    pool = pool_of(program)
    assert pool is not None
    # What the workers hold is exactly what the live variables hold: every worker the same, no handle
    # that no variable names (a leaked one shows as "handle N"), and the controller's table of sent
    # datasets holds the live one only.
    answers = ask_workers(pool)
    assert answers is not None and answers[0]["objects"] == answers[1]["objects"]
    held = held_objects(pool, ns, answers, program.datasets)
    assert [(h.label(), h.what) for h in held] == [
        ("m", "Mlp model"), ("opt", "AdamW[Mlp] optimizer"), ("data", "dataset TensorDataset")]
    assert [e.dataset() for e in program.datasets.sent.values()] == [ns["data"]]
    status = status_table(program, ns).text
    assert HOLDS in status, status
    assert pool.released_pending == 0


@pytest.mark.slow
def test_twenty_rounds_in_a_kernel_keep_memory_bounded(fresh: Kernel) -> None:
    fresh.ok(cell(PROGRAM))
    kernel_pid = fresh.pid()

    def round_(k: int) -> None:
        batches = fresh.ok(ROUND.format(k=k, rows=ROWS) + "print(json.dumps(len(log.records)))").value()
        assert batches == -(-ROWS // 512)

    def pids() -> list[int]:
        workers = fresh.ok("print(json.dumps(ss_program.pool.pids))").value()
        return [kernel_pid, *workers]

    try:
        assert_bounded_over_the_rounds(round_, pids)
        status = fresh.ok("%shapescript status").plain[0]
        assert HOLDS in status and "handle" not in status, status
    finally:
        fresh.ok("%shapescript reset")
