"""Training in the background through a real kernel (issue 14, item 4's Done-when): a cell starts
`fit(..., background=True)` on cpu[0 1] and returns at once; the next cells read the model and
`%shapescript status` while it trains, then stop it at a step boundary; the model trains on."""

from __future__ import annotations


import pytest

from test_kernel import LINEAR_STEP, Kernel, cell, kernel  # noqa: F401  (kernel: the module's fixture)

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
