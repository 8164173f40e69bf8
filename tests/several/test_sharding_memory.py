"""`shard params` saves memory: a model whose params and AdamW state don't fit what a
worker may hold trains under `shard params` on cpu[0 1 2], and doesn't as plain data parallel.

"What a worker may hold" is a cap worked out from the model's declared sizes alone; the worker's
memory is measured (parallel/memory.py: the peak RSS of a call) during a training step after a first
one (AdamW makes its state lazily, in the first step), above its RSS before the model was made.

The model: six f32 params [H H], H = 3072, so one param is S = 4·H² bytes (37.7 MB), the params are
P = 6·S (226 MB) and AdamW's two moments 2·P (453 MB). On N = 3 devices:

- Every device holds its piece of the params, of AdamW's state and, during a step, of the gradients:
  (1 + 2 + 1)·P / N = 8·S, whatever the layout can do.
- A read of a param gathers it whole (S), freed after use. In the backward pass it is gathered again,
  its whole gradient is made (S), and a copy of that padded to a multiple of N is reduce-scattered
  (S): 3·S at once. We allow one param more as margin: 4·S.
- 64 MiB for what a worker's first steps add whatever the model's size (pages of torch's code,
  Gloo's buffers, autograd's threads): about 52 MB here, the same with H = 2048 and 3072.

The cap is 8·S + 4·S + 64 MiB = 13.8·S (520 MB). Data parallel holds the params, AdamW's state and
the gradients whole at the update, 4·P = 24·S, 1.7 times the cap. Had the gathered params been kept
after use, a sharded step would hold all six on top of its pieces, 14·S and the 64 MiB: over the cap
too. (Measured here: 12.4·S sharded, 31.4·S data parallel.)

So params + AdamW state are 3·P = 18·S = 1.3 times the cap, not the 3 times first asked for, which no
layout reaches: a device holds at least 4·P / N, so 3·P is at most 9/4 of what it holds on 3 devices
however many params there are, and less with a gathered param and its gradient on top (18·S / 11·S
for six params with the three temporaries and no margin).

glibc keeps freed memory of small allocations in its heap, which RSS then still counts: with
MALLOC_MMAP_THRESHOLD_ at 64 KiB in the workers' environment (they inherit the controller's), every
tensor bigger than that is mmapped, and its pages are returned when it is freed. (Without it, one
sharded worker's step peaked at 13.85·S here, over the cap.)

Last, the figures docs/several-devices.md quotes on `shard params` are checked against the
DeviceTable's and this file's.
"""

from __future__ import annotations

import re
import sys

import pytest
import torch
from programs import README
from support import ROOT
from test_comms import sharded

import shapescript as ss
from shapescript.api import compile_program
from shapescript.parallel.memory import CPU_PEAK
from shapescript.plan.comms_text import report

needs_clear_refs = pytest.mark.skipif(sys.platform != "linux", reason="a call's own peak RSS needs /proc/self/clear_refs")

H = 3072
LAYERS = 6
DEVICES = "cpu[0 1 2]"
WORKERS = 3
BATCH = 6

PARAM = 4 * H * H  # S: one f32 [H H] param, in bytes
PARAMS = LAYERS * PARAM  # P
ADAMW_STATE = 2 * PARAMS  # two moments a value
GRADIENTS = PARAMS
RUNTIME_ALLOWANCE = 64 * 2**20  # what a worker's first steps add, whatever the model's size
CAP = (PARAMS + ADAMW_STATE + GRADIENTS) // WORKERS + 4 * PARAM + RUNTIME_ALLOWANCE


PROGRAM = """\
devices {devices}

dim H = {h}

data Ex:
    x: [H]
    label: [] Index[H]

model Deep:
{params}

fn loss(m: Deep, batch: [b] Ex) -> []:
    return cross_entropy({scores}, batch.label, over=H)

fn train_step(mut m: Deep, mut opt: AdamW[Deep], batch: [b] Ex) -> []:
    l, g = value_and_grad(loss, m, batch)
    update(mut m, mut opt, g)
    return l
"""


def deep_program() -> str:
    """`LAYERS` [H H] layers on `DEVICES`, relu between them, and an AdamW training step."""
    params = "\n".join(f"    param w{k}: [H H] = normal(std=0.02)" for k in range(1, LAYERS + 1))
    scores = "batch.x"
    for k in range(1, LAYERS + 1):
        scores = f"{scores} @ m.w{k}" if k == LAYERS else f"relu({scores} @ m.w{k})"
    return PROGRAM.format(devices=DEVICES, h=H, params=params, scores=scores)


def step_peaks(source: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each worker's peak during a second training step, above its RSS before the model was made."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")  # read by the workers' glibc as they start
    prog = ss.load(source, name="deep.ss")
    try:
        prog.workers()  # started, the program loaded, no model yet
        before = [w.now for w in prog.memory()]
        m = prog.Deep.init(seed=0)
        opt = ss.adamw(m, lr=1e-3)
        g = torch.Generator().manual_seed(0)
        batch = {"x": torch.randn(BATCH, H, generator=g), "label": torch.randint(0, H, (BATCH,), generator=g)}
        prog.train_step(m, opt, batch)  # makes AdamW's state
        prog.train_step(m, opt, batch)
        workers = prog.memory()
    finally:
        prog.stop()
    assert len(workers) == WORKERS and all(w.how == CPU_PEAK and w.last is not None for w in workers)
    return [w.last.peak - start for w, start in zip(workers, before) if w.last is not None]


def in_params(nbytes: int) -> str:
    return f"{nbytes / PARAM:.2f} params ({nbytes / 2**20:.0f} MiB)"


@pytest.mark.slow
@needs_clear_refs
def test_a_sharded_step_stays_under_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    peaks = step_peaks(sharded(deep_program()), monkeypatch)
    pieces = (PARAMS + ADAMW_STATE + GRADIENTS) // WORKERS
    for rank, peak in enumerate(peaks):
        assert peak >= pieces, f"worker {rank}: {in_params(peak)} is less than its pieces: the measure misses them"
        assert peak < CAP, f"worker {rank}: {in_params(peak)} over the cap of {in_params(CAP)}"


@pytest.mark.slow
@needs_clear_refs
def test_a_data_parallel_step_goes_over_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    peaks = step_peaks(deep_program(), monkeypatch)
    for rank, peak in enumerate(peaks):
        assert peak >= PARAMS + ADAMW_STATE + GRADIENTS, f"worker {rank}: {in_params(peak)}: the measure misses them"
        assert peak > CAP, f"worker {rank}: {in_params(peak)} under the cap of {in_params(CAP)}"


def test_the_docs_figures_are_the_device_tables_and_this_files() -> None:
    """docs/several-devices.md's section on `shard params` quotes what `shapescript comms` says of
    the README on cuda[0 1 2] with and without the option, and this test's model and cap."""
    doc = (ROOT / "docs" / "several-devices.md").read_text()
    section = doc[doc.index("### `shard params`"):doc.index("### `split H`")]
    shown = set(re.findall(r"\d{1,3}(?:,\d{3})+", section))
    sharded_table = report(compile_program(sharded(README), "mlp.ss"))
    plain_table = report(compile_program(README, "mlp.ss"))
    whole = {f"{n:,}" for n in (784 * 256, 256 * 10)}  # the params' sizes, from the spec
    pieces = {f"{-(-n // 3):,}" for n in (784 * 256, 256 * 10)}  # a third of each, rounded up
    assert shown, "the section quotes no figures"
    for figure in sorted(shown - whole - pieces):
        assert figure in sharded_table or f"{figure} bytes" in plain_table, f"{figure}: in neither table"
    assert "2,439,232 bytes" in sharded_table and "2,439,232" in shown  # a step's total, with the option
    assert f"six [{H} {H}] f32" in section and LAYERS == 6 and f"{CAP / 1e6:.0f} MB" in section
