"""Training in the background through a real kernel: a cell starts
`fit(..., background=True)` on cpu[0 1] and returns at once; the next cells read the model and
`%shapescript status` while it trains, then stop it at a step boundary; the model trains on. And
after Ctrl-C landed all over the notebook's progress bars, a run still trains."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_kernel import LINEAR_STEP, Kernel, cell, kernel  # noqa: F401  (kernel: the module's fixture)

INTERRUPT_POINTS = Path(__file__).with_name("interrupt_points.py")

FIT = """
fn fit(mut m: Lin, mut opt: AdamW[Lin], data: Dataset[Ex], log: Sink):
    for batch in data |> batches(6):
        write(log, logs(loss=step(mut m, mut opt, batch)))
"""

# A sink that takes 20 ms a step, so that the run is still going when the next cells look.
SLOW_SINK = """
import threading, time
from shapescript.runtime.sinks import Sink

class Slow(Sink):
    def __init__(self):
        super().__init__()
        self.records, self.third = [], threading.Event()
    def _emit(self, step, values):
        time.sleep(0.02)
        self.records.append(values)
        if step == 3:
            self.third.set()
"""


@pytest.mark.slow
def test_a_background_run_leaves_the_kernel_free_and_stops_at_a_step(kernel: Kernel) -> None:
    kernel.ok(cell(LINEAR_STEP + FIT))
    kernel.ok(SLOW_SINK + "\nm = Lin.init(seed=0)\nopt = ss.adamw(m, lr=0.1)\nlog = Slow()\n"
              "g = torch.Generator().manual_seed(0)\n"
              "data = ss.TensorDataset(x=torch.randn(6000, 3, generator=g), y=torch.arange(6000) % 2)")
    started = kernel.ok("h = fit(m, opt, data, log, background=True)\nh")
    assert any("background `fit`" in text for text in started.plain)  # the cell shows the handle at once
    waited = kernel.ok("assert log.third.wait(60)")
    # The run's progress bar belongs to the cell that started it, not to the one running as it's drawn.
    assert not [b for b in waited.bundles if "application/vnd.jupyter.widget-view+json" in b]
    # Mid-run: a read, the status table and another call, each between two steps.
    mid = kernel.ok("w = m.w\nsteps = h.steps\n"
                    "print(json.dumps([h.state, steps, list(w.shape), len(log.records) >= steps]))").value()
    assert mid[0] == "running" and mid[1] >= 3 and mid[2] == [3, 2] and mid[3]
    status = kernel.ok("%shapescript status")
    shown = " ".join(status.plain)
    assert "Every worker holds: " in shown and "m (Lin model" in shown and "opt (AdamW[Lin] optimizer" in shown
    assert "Running in the background `fit`: running; batch " in shown
    assert kernel.ok("print(json.dumps(h.state))").value() == "running"  # status didn't wait for the end
    stopped = kernel.ok("h.stop(timeout=60)\nprint(json.dumps([h.state, h.steps, len(log.records), "
                        "len(data) // 6]))").value()
    assert stopped[0] == "stopped" and stopped[1] == stopped[2] and mid[1] <= stopped[1] < stopped[3]
    # The model is as the last step left it: a step in the foreground changes it, from there.
    kernel.ok("before = m.w\nstep(m, opt, {'x': torch.randn(4, 3), 'y': torch.arange(4) % 2})\n"
              "assert not torch.equal(before, m.w)")


@pytest.mark.slow
def test_ctrl_c_anywhere_in_the_notebooks_bars_leaves_no_lock_taken(kernel: Kernel) -> None:
    """Each cell lands one Ctrl-C at a line of tqdm's or the widgets' code as a loop's bar is made,
    moved on or closed, on cpu[0 1] (interrupt_points.py); tqdm's lock must then be free. Then a
    background run trains while a field is read. On 875fb62 a Ctrl-C in tqdm's lock code left the
    lock taken, and the background run, holding the step lock, waited for it for good."""
    kernel.ok("%shapescript reset")
    kernel.ok(cell(LINEAR_STEP + FIT))
    kernel.ok(f"exec(open({str(INTERRUPT_POINTS)!r}).read())\n"
              "from tqdm.notebook import tqdm\n"
              "LIBRARIES = ['tqdm', 'ipywidgets', 'comm']\n"
              "m = Lin.init(seed=0)\nopt = ss.adamw(m, lr=0.1)\n"
              "data = ss.TensorDataset(x=torch.randn(18, 3), y=torch.arange(18) % 2)\n"
              "def go():\n    fit(m, opt, data, ss.sinks.memory())\n"
              "go()")  # once untraced: some things happen only the first time
    run = kernel.ok("run = lines_run(go, LIBRARIES)\nprint(json.dumps(run))").value()
    assert any(name == "acquire" for name, _ in run)
    tried = kernel.ok("print(json.dumps(points(run, most=20)))").value()
    locking = {tuple(point) for name, point in run if name in ("acquire", "release")}
    missed = []
    for point in tried:  # tqdm.notebook redraws by the clock: a redraw's line may not come in every run
        seen = kernel.ok(f"came, raised = interrupted_at({point}, go, LIBRARIES)\n"
                         "print(json.dumps([came, type(raised).__name__, lock_free(tqdm.get_lock())]))").value()
        assert seen[2], f"Ctrl-C at {point} of the bars' code left tqdm's lock taken"
        if not seen[0]:
            missed.append(point)
        else:
            assert seen[1] in ("KeyboardInterrupt", "StepInterrupt"), f"at {point}: {seen}"
    assert not locking & {tuple(p) for p in missed} and len(missed) <= len(tried) // 5, missed
    ran = kernel.ok("h = fit(m, opt, data, ss.sinks.memory(), background=True)\nw = m.w\nh.wait(timeout=60)\n"
                    "print(json.dumps([h.state, h.steps, list(w.shape)]))", timeout=90).value()
    assert ran == ["finished", 3, [3, 2]]
