"""Memory measured on the workers: each worker's params, optimizer state and the
peak of its last call, read back through the Python API, `%shapescript status` and the DeviceTable.
The references are the spec's sizes and torch's own AdamW state; the peaks must grow with the model."""

from __future__ import annotations

import re

import pytest
import torch
from programs import README
from support import README_MLP_SHAPES, param_and_adamw_bytes

import shapescript as ss
from shapescript.notebook.cells import Cell
from shapescript.notebook.device_table import DeviceTableView
from shapescript.notebook.session import Session
from shapescript.notebook.workers import short_bytes, status_table
from shapescript.parallel.memory import CPU_PEAK, WorkerMemory

MLP_PARAMS = 4 * (784 * 256 + 256 * 10)  # f32 w1 [D Hd] and w2 [Hd C], as the spec declares them


def batch(size: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"img": torch.randn(size, 784, generator=g), "label": torch.randint(0, 10, (size,), generator=g)}


def trained_once(prog: ss.api.Program) -> tuple[list[WorkerMemory], list[WorkerMemory]]:
    """The workers' memory after making a model and its AdamW, and after one train_step."""
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-3)
    fresh = prog.memory()
    prog.train_step(m, opt, batch())
    return fresh, prog.memory()


@pytest.mark.slow
def test_each_worker_reports_its_params_optimizer_state_and_the_peak_of_its_step() -> None:
    prog = ss.load(README, devices="cpu[0 1]", name="mlp.ss")
    try:
        fresh, after = trained_once(prog)
        assert [w.rank for w in after] == [0, 1]
        params, adamw_state = param_and_adamw_bytes(README_MLP_SHAPES)  # torch's own AdamW, as a second reference
        assert params == MLP_PARAMS
        for before_step, w in zip(fresh, after):
            assert before_step.last is None and before_step.optimizer_state == 0  # AdamW's state comes with a step
            assert w.how == CPU_PEAK  # clear_refs works on this Linux: the peak is the call's own
            assert w.params == MLP_PARAMS and w.model_bytes == {"Mlp": MLP_PARAMS}
            # Two moments a param, and torch's step count (one f32 scalar a param).
            assert w.optimizer_state == 2 * MLP_PARAMS + 4 * len(README_MLP_SHAPES) == adamw_state
            assert w.gradients == 0
            assert w.last is not None and w.last.what == "`train_step` (mlp.ss:22:4)"
            assert w.last.peak >= w.last.before > 0
            # The step made AdamW's state (2x params) on top of what was there, so its peak is above it.
            assert w.activations == w.last.peak - w.last.before >= 2 * MLP_PARAMS
            assert w.largest == w.last  # the only call so far
    finally:
        prog.stop()


@pytest.mark.slow
def test_asking_what_the_workers_hold_keeps_the_last_steps_peak() -> None:
    prog = ss.load(README, devices="cpu[0 1]", name="mlp.ss")
    try:
        _, after = trained_once(prog)
        pool = prog.workers()
        pool.call("objects", ())
        pool.call("ping", ())
        again = prog.memory()
        assert [w.last for w in again] == [w.last for w in after]  # neither reset nor replaced the figures
    finally:
        prog.stop()


@pytest.mark.slow
def test_a_wider_model_makes_a_bigger_step_peak() -> None:
    """16x the hidden width: the step holds 16x the params' gradients and AdamW state, and wider
    activations, so what it adds must exceed the small model's by at least the extra state."""
    added = {}
    for width in (256, 4096):
        prog = ss.load(README.replace("dim Hd = 256", f"dim Hd = {width}"), devices="cpu[0 1]", name="mlp.ss")
        try:
            _, after = trained_once(prog)
            assert all(w.params == 4 * (784 * width + width * 10) for w in after)
            added[width] = min(w.activations or 0 for w in after)
        finally:
            prog.stop()
    extra_state = 2 * 4 * (784 + 10) * (4096 - 256)  # AdamW's two moments for the extra params
    assert added[4096] - added[256] >= extra_state, {k: short_bytes(v) for k, v in added.items()}


def test_one_device_has_no_workers_to_measure() -> None:
    assert ss.load(README, devices="cpu", name="mlp.ss").memory() == []


@pytest.mark.slow
def test_status_and_device_table_show_the_measured_figures() -> None:
    ns: dict = {}
    session = Session(ns)
    session.run_cell(Cell("cell [1]", "%%shapescript\n" + README.replace("devices cuda[0 1 2]", "devices cpu[0 1]"), 2))
    try:
        static_text = session.device_table_view().text()  # workers starting: nothing measured yet
        ns["m"] = m = ns["Mlp"].init(seed=0)
        ns["opt"] = opt = ss.adamw(m, lr=1e-3)
        unmeasured = session.device_table_view()
        assert unmeasured.measured and unmeasured.measured_note("Mlp") == ""  # held, but no call yet
        assert unmeasured.text() == static_text and "measured:" not in unmeasured.html()
        ns["train_step"](m, opt, batch())
        workers = session.program.memory()

        status = status_table(session.program, ns).text
        header = next(line for line in status.splitlines() if line.startswith("rank"))
        assert re.split(r"\s{2,}", header)[-5:] == ["params", "optimizer state", "last call: before", "peak",
                                                     "activations and the rest"]
        for w in workers:
            assert w.last is not None
            added = "0 (reused)" if w.last.added == 0 else short_bytes(w.last.added)  # on CPU, RSS's growth
            cells = [short_bytes(w.params), short_bytes(w.optimizer_state), short_bytes(w.last.before),
                     short_bytes(w.last.peak), added]
            row = next(line for line in status.splitlines() if line.startswith(f"{w.rank} "))
            assert re.split(r"\s{2,}", row)[-5:] == cells, (row, cells)
        assert "794 KiB" in status and "`train_step` (notebook.ss:" in status and "clear_refs" in status

        view = session.device_table_view()
        peak = max(w.last.peak for w in workers if w.last is not None)  # no call since: the same figures
        note = view.measured_note("Mlp")
        assert note.startswith(f"measured: 794 KiB per device; peak {short_bytes(peak)} per device in the last call")
        measured_text = view.text().removeprefix(static_text)  # the report, then what was measured
        assert measured_text == "\n\nMeasured on the workers:\n- `Mlp`: " + note.removeprefix("measured: ")
        assert "measured: 794 KiB per device" in view.html()
        assert DeviceTableView(view.table, view.source).text() == static_text  # the static table is unchanged
    finally:
        session.shutdown()


def test_a_cpu_call_that_needed_no_more_resident_memory_says_it_reused_some() -> None:
    """On a CPU, "activations and the rest" is the growth of the resident memory, 0 whenever the call
    reused memory freed before it: the table says "0 (reused)", not "0 bytes" as if it needed none;
    on cuda, whose allocator counts tensors, 0 is 0."""
    from shapescript.notebook.workers import added_cell
    from shapescript.parallel.memory import CUDA_PEAK, CallPeak
    reused, grew = CallPeak("`step`", before=2**20, peak=2**20), CallPeak("`step`", before=2**20, peak=3 * 2**20)

    def on(how: str, call: CallPeak) -> WorkerMemory:
        return WorkerMemory(rank=0, device="cpu:0", how=how, now=2**20, params=0, optimizer_state=0,
                            last=call, largest=call)
    assert added_cell(on(CPU_PEAK, reused)) == "0 (reused)"
    assert added_cell(on(CPU_PEAK, grew)) == short_bytes(2 * 2**20)
    assert added_cell(on(CUDA_PEAK, reused)) == short_bytes(0)
