"""The notebook's workers: one pool that outlives the cells.

Every `%%shapescript` cell makes a new `Program`. A RemoteModel stays usable only while its own
program's pool is the pool it was made on (`RemoteModel._workers()`), and a Program starts a pool of
its own when it has none. So a new program adopts the previous one's running pool when both run on
the same devices (`Program.adopt_workers`): the workers load the new compiled code with their next
call, and the models and optimizer state they keep by handle stay where they are. Old programs
keep their reference to the pool, so every handle made with any of them stays valid until the
pool stops. Workers start in the background (`Program.workers(background=True)`), so a cell
doesn't wait for them.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..api import Program
from ..background import running
from ..errors import ShapeScriptError
from ..parallel.lifecycle import PoolState
from ..parallel.loading import Datasets
from ..parallel.memory import CUDA_PEAK, WorkerMemory
from ..parallel.pool import WorkerPool
from ..parallel.processes import STOPPED_BY_CONTROLLER
from ..parallel.remote import RemoteModel, RemoteOptimizer
from .models import _size  # the model table's wording of bytes
from .report import Rich, render_rows


def pool_of(program: Program | None) -> WorkerPool | None:
    """The program's pool if it is started (or starting) and not stopped."""
    return program.pool if program is not None else None


@dataclass
class Held:
    """An object the workers keep: its handle, what it is, the notebook's names for it, and the
    bytes its tensors take on each device ("" when the workers weren't asked)."""

    handle: int
    what: str
    names: list[str] = field(default_factory=list)
    size: str = ""

    def label(self) -> str:
        """`m, m2` or `handle 7`: how the notebook reaches it."""
        return ", ".join(self.names) if self.names else f"handle {self.handle}"

    def __str__(self) -> str:
        """`m (Mlp model, 813,056 bytes (794 KiB) per device)`: the model table's wording."""
        size = f", {self.size} per device" if self.size else ""
        return f"{self.label()} ({self.what}{size})"


def _sent_handle(datasets: Datasets | None, pool: WorkerPool, value: Any) -> int | None:
    """The workers' handle of `value` if it is a dataset sent to `pool`'s workers."""
    entry = datasets.sent.get(id(value)) if datasets is not None else None
    if entry is None or entry.pool is not pool or entry.dataset() is not value:
        return None
    return entry.handle


def _named_handles(pool: WorkerPool, user_ns: Mapping[str, Any], datasets: Datasets | None) -> dict[int, Held]:
    """The notebook's variables that are handles on `pool`, by handle: models, optimizers, and the
    datasets of `datasets` (the program's) sent to its workers."""
    held: dict[int, Held] = {}
    for name, value in list(user_ns.items()):
        if name.startswith("_"):  # IPython's output history (_, _3...) repeats the user's names
            continue
        if isinstance(value, RemoteModel) and value._pool is pool:
            handle, what = value._handle, f"{value.spec.name} model"
        elif isinstance(value, RemoteOptimizer) and value.model._pool is pool:
            handle, what = value._handle, f"{value.kind}[{value.model.spec.name}] optimizer"
        elif (sent := _sent_handle(datasets, pool, value)) is not None:
            handle, what = sent, f"dataset {type(value).__name__}"
        else:
            continue
        held.setdefault(handle, Held(handle, what)).names.append(name)
    return held


def ask_workers(pool: WorkerPool, handler: str = "objects", where: str = "%shapescript status") -> list[Any] | None:
    """Each worker's answer to `handler` ("objects": what it holds and its device memory; "memory":
    its WorkerMemory), or None if it can't be asked now (still starting, or stopped)."""
    if pool.state != PoolState.RUNNING:
        return None
    try:
        return pool.call(handler, (), where=where)
    except ShapeScriptError:  # a worker gone, or the pending program failing to load: said by the next call
        return None


def measured_memory(program: Program | None, where: str) -> list[WorkerMemory]:
    """What the workers of `program` measured of their memory; [] when no running workers can say."""
    pool = pool_of(program)
    return (ask_workers(pool, "memory", where) or []) if pool is not None else []


def held_objects(pool: WorkerPool, user_ns: Mapping[str, Any], answers: list[dict[str, Any]] | None = None,
                 datasets: Datasets | None = None) -> list[Held]:
    """What the workers keep (every worker keeps the same), with the notebook's names for each and,
    when the workers answered, its bytes per device."""
    held = _named_handles(pool, user_ns, datasets)
    if answers:
        sizes = answers[0]["bytes"]
        for handle, what in answers[0]["objects"].items():
            size = sizes[handle]
            held.setdefault(handle, Held(handle, what)).size = "? bytes" if size is None else _size(size)
    return [held[h] for h in sorted(held)]


def describe_loss(pool: WorkerPool, user_ns: Mapping[str, Any], why: str, datasets: Datasets | None = None) -> str:
    """What stopping `pool` loses, said before it stops; `datasets`: the program's, to name them."""
    held = held_objects(pool, user_ns, ask_workers(pool), datasets)
    # What and by which name, without the sizes: the message says what is lost, not how much.
    named = ", ".join(f"{h.label()} ({h.what})" for h in held)
    gone = f"; gone with them: {named}" if held else "; they held nothing"
    return f"Stopping the workers on {pool.devices} ({why}){gone}."


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.0f} MiB"


def status_table(program: Program | None, user_ns: Mapping[str, Any]) -> Rich:
    """`%shapescript status`: the workers, their processes and what they hold."""
    if program is None:
        return render_rows("ShapeScript: no program yet", [], [], ["Run a %%shapescript cell first."])
    pool = pool_of(program)
    if not program.several:
        return render_rows(f"ShapeScript on {program.devices}: one device, in this kernel; no workers", [], [],
                           recording_notes([program.recording()]) + _background_notes())
    if pool is None:
        return ended_table(program.last_pool) or render_rows(
            f"ShapeScript on {program.devices}: no workers running", [], [],
            ["They start when the program next needs them."])
    answers = ask_workers(pool)
    measured = ask_workers(pool, "memory") if answers else None
    state = pool.state  # after asking, which may have found a worker gone
    if state == PoolState.DEAD and (ended := ended_table(pool)) is not None:
        return ended
    rss = _memory(pool.pids)
    header = ["rank", "device", "pid", "memory (RSS)", "objects"]
    cuda = pool.devices.kind == "cuda"
    if cuda:
        header.append("device memory")
    header += MEMORY_HEADER
    rows = []
    for rank, (index, pid) in enumerate(zip(pool.indices, pool.pids)):
        answer = answers[rank] if answers else None
        now = measured[rank].now if measured and not cuda else None  # the worker's own RSS without psutil
        row = [str(rank), f"{pool.devices.kind}:{index}", str(pid), _mib(rss.get(pid, now)),
               str(len(answer["objects"])) if answer else "?"]
        if cuda:
            row.append(_mib(answer["device_memory"]) if answer else "?")
        rows.append(row + _memory_cells(measured[rank] if measured else None))
    held = held_objects(pool, user_ns, answers, program.datasets) if state == PoolState.RUNNING else []
    notes = [f"Every worker holds: {', '.join(map(str, held))}." if held else "The workers hold nothing."]
    notes += _memory_notes(measured or [])
    if cuda and answers:  # a cpu program records nothing: its table says nothing of it
        notes += recording_notes(ask_workers(pool, "recording") or [])
    notes += _background_notes()
    if state == PoolState.STARTING:
        notes = ["The workers are starting; the next call waits for them."]
    return render_rows(f"ShapeScript workers on {pool.devices}: {state}", header, rows, notes)


def recording_notes(reports: list[dict[str, str]]) -> list[str]:
    """What is recorded as CUDA graphs (Program.recording(), each worker's in rank order): one line
    for every worker where they agree, as they do unless one is behind; [] for a cpu program."""
    if not reports or not reports[0]:
        return []
    if all(r == reports[0] for r in reports):
        return [_recording_line("Recorded steps (CUDA graphs)", reports[0])]
    return [_recording_line(f"Recorded steps on worker {rank}", r) for rank, r in enumerate(reports)]


def _recording_line(title: str, report: dict[str, str]) -> str:
    """`train_step: recorded (replays 120)`, for each fn called so far; fns not called are named only."""
    called = [f"{name}: {state}" for name, state in report.items() if state != "not called yet"]
    if not called:
        return f"{title}: none called yet (recordable: {', '.join(report)})."
    return f"{title}: {'; '.join(called)}."


def _background_notes() -> list[str]:
    return [f"Running in the {run.describe()}." for run in running()]


def ended_table(pool: WorkerPool | None) -> Rich | None:
    """How the workers of a pool that failed ended: each one's signal or exit code (processes.py's
    how_it_stopped), or that the controller stopped it with the others. None unless `pool` failed."""
    if pool is None or pool.state != PoolState.DEAD or not pool.exits:
        return None
    rows = [[str(e.rank), e.label, str(e.pid), e.how] for e in pool.exits]
    first = next((e for e in pool.exits if e.how != STOPPED_BY_CONTROLLER), None)
    why = f"worker {first.rank} ({first.label}) stopped: {first.how}" if first else "the workers were stopped"
    return render_rows(f"ShapeScript workers on {pool.devices}: stopped", ["rank", "device", "pid", "how it stopped"],
                       rows, [f"{why[0].upper()}{why[1:]}. What the workers held is gone; new workers start when "
                              "the program next needs them (new models, or a checkpoint, are needed to go on)."])


# The measured columns: the last call's peak, and its breakdown (parallel/memory.py).
MEMORY_HEADER = ["params", "optimizer state", "last call: before", "peak", "activations and the rest"]


def short_bytes(n: int | None) -> str:
    """`794 KiB`, `1.55 MiB`, `315 MiB`: a figure short enough for a table's cell."""
    if n is None:
        return "?"
    value, unit = float(n), "bytes"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    if unit == "bytes":
        return f"{n} bytes"
    return f"{value:.0f} {unit}" if value >= 100 else f"{value:.1f} {unit}" if value >= 10 else f"{value:.2f} {unit}"


def added_cell(m: WorkerMemory) -> str:
    """The last call's "activations and the rest". On a CPU the peak is the process's resident
    memory, which grows only when a call needs more than the process holds already: 0 there means
    the call reused memory freed before it, not that it needed none, and says so."""
    if m.last is None:
        return "-"
    return "0 (reused)" if m.how != CUDA_PEAK and m.last.added == 0 else short_bytes(m.last.added)


def _memory_cells(m: WorkerMemory | None) -> list[str]:
    if m is None:
        return ["?"] * len(MEMORY_HEADER)
    call = m.last
    return [short_bytes(m.params), short_bytes(m.optimizer_state),
            *((short_bytes(call.before), short_bytes(call.peak), added_cell(m)) if call else ["-"] * 3)]


def _memory_notes(measured: list[WorkerMemory]) -> list[str]:
    """What the measured columns mean, said once under the table."""
    if not measured:
        return []
    last = measured[0].last
    if last is None:
        return ["No call has run on the workers yet: their memory is measured around each one."]
    reused = ("; 0 (reused): the call's memory came from what the process already held (its resident memory "
              "grows only for more)") if measured[0].how != CUDA_PEAK else ""
    return [f"Memory measured on each worker around its last call, {last.what}: peak is {measured[0].how}; "
            f"activations and the rest = peak - before{reused}; no gradients are held between calls "
            "(value_and_grad's live within a step and count in its peak)."]


def _memory(pids: list[int]) -> dict[int, int]:
    """Each live process's resident memory in bytes."""
    try:
        import psutil
    except ImportError:  # the `notebook` extra brings it; without it the column says "?"
        return {}
    out = {}
    for pid in pids:
        try:
            out[pid] = psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return out


# -- the kernel's own memory ----------------------------------------------------------------------

def give_back_freed_memory() -> None:
    """Return the free pages inside the C heap to the system (glibc's malloc_trim); nothing where
    there is no glibc. The extension calls it after each cell. Why: once a big block has been freed,
    glibc raises its mmap threshold and serves blocks of that size from its heap, whose freed pages
    it keeps (split up by smaller allocations, a freed dataset's block no longer fits the next):
    a kernel that made a new 4.6 MiB dataset a cell grew, in about one run in three, by one dataset
    a cell without end, though Python held none of them, and not at all with a fixed threshold
    (MALLOC_MMAP_THRESHOLD_) or with this trim (tests/notebook/test_leak.py). It takes a few ms."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # the process's C library: glibc has it, musl doesn't
    except (OSError, AttributeError):
        return None
