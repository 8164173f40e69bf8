"""The notebooks of notebooks/, run headlessly from top to bottom as Jupyter runs them (nbclient),
and judged by what they show: the numbers they print, not only the absence of errors.

Each notebook runs in a fresh kernel of this interpreter (sys.executable) with this checkout first on
its PYTHONPATH, as in test_kernel.py, and with notebooks/ as its working directory, as when it is
opened there. The kernelspec is written to a temporary folder under the name the notebooks ask for,
`python3`, so whatever `python3` kernel the machine has installed plays no part. A cell tagged
`raises-exception` may fail (nbclient lets it); any other failing cell fails the test.

The placement widget's test reads the widgets' state, which nbclient saves in the notebook's
metadata (store_widget_state). The committed notebooks carry no outputs: a test checks that too.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import nbclient
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbformat import NotebookNode
from support import README_MLP_SHAPES, ROOT, param_and_adamw_bytes

NOTEBOOKS = ROOT / "notebooks"
NAMES = ("01_tour.ipynb", "02_several_devices.ipynb", "03_attention.ipynb", "04_training.ipynb",
         "05_nanogpt.ipynb")
TIMEOUT = 240  # seconds for one cell: generous, for a loaded 2-core machine starting workers
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def python3_kernel(folder: Path, python: str = sys.executable, pythonpath: str | None = str(ROOT)) -> KernelManager:
    """A manager for a kernel named `python3` that runs `python`, its spec in `folder` alone. With
    `pythonpath`, that path comes first on the kernel's PYTHONPATH (the checkout, when the package
    isn't installed)."""
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    kernel = {"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
              "display_name": "Python 3 (ipykernel)", "language": "python"}
    if pythonpath is not None:
        kernel["env"] = {"PYTHONPATH": os.pathsep.join(p for p in (pythonpath, os.environ.get("PYTHONPATH")) if p)}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    return KernelManager(kernel_name="python3",
                         kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(folder / "kernels")]))


def execute(path: Path, km: KernelManager, **start: object) -> NotebookNode:
    """The notebook at `path`, run top to bottom in `km`'s kernel (started with `start`, such as an
    `env`), with the folder of `path` as the working directory; the widgets' state lands in
    nb.metadata.widgets. The kernel is shut down afterwards (nbclient leaves a kernel it was given)."""
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, km=km, timeout=TIMEOUT, kernel_name="python3", store_widget_state=True,
                                     resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute(**start)
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=False)
    return nb


def shown(cell: NotebookNode) -> str:
    """Everything a code cell showed as text: its streams, the text/plain of its displays and result,
    and its error."""
    parts: list[str] = []
    streaming = False  # the last part is a stream's: one print may arrive in pieces, joined as written
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            if streaming:
                parts[-1] += out.text
            else:
                parts.append(out.text)
            streaming = True
            continue
        streaming = False
        if out.output_type in ("display_data", "execute_result"):
            parts.append(out.data.get("text/plain", ""))
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
    return "\n".join(parts)


def code_cells(nb: NotebookNode) -> list[NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code"]


def cell_with(nb: NotebookNode, source: str) -> NotebookNode:
    """The one code cell whose source contains `source`."""
    found = [c for c in code_cells(nb) if source in c.source]
    assert len(found) == 1, f"{len(found)} cells contain {source!r}"
    return found[0]


def all_shown(nb: NotebookNode) -> str:
    return "\n".join(shown(c) for c in code_cells(nb))


def numbers(pattern: str, text: str) -> list[float]:
    """Every number `pattern`'s groups match in `text`, in order."""
    found = re.findall(pattern, text)
    return [float(x) for m in found for x in (m if isinstance(m, tuple) else (m,))]


def check_ran_cleanly(nb: NotebookNode) -> None:
    """Every code cell ran, and only a cell tagged raises-exception failed; nothing wrote a
    traceback or a Python warning to stderr (notebook 03 once warned of its own intended use)."""
    for cell in code_cells(nb):
        assert cell.execution_count is not None, cell.source
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if "raises-exception" not in cell.metadata.get("tags", []):
            assert not errors, f"{cell.source}\n-> {errors}"
        stderr = "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stderr")
        assert "Traceback" not in stderr and not re.search(r"\w+Warning: ", stderr), f"{cell.source}\n-> {stderr}"


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], NotebookNode]]:
    """`ran(name)`: the notebook run once for the whole module, with its outputs."""
    done: dict[str, NotebookNode] = {}

    def run(name: str) -> NotebookNode:
        if name not in done:
            km = python3_kernel(tmp_path_factory.mktemp("kernel"))
            done[name] = execute(NOTEBOOKS / name, km)
            check_ran_cleanly(done[name])
        return done[name]

    yield run


def test_committed_notebooks_have_no_outputs() -> None:
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert {p.name for p in paths} >= set(NAMES)
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert nb.metadata.kernelspec.name == "python3", path.name
        assert "widgets" not in nb.metadata, f"{path.name} keeps widget state from a run"
        for cell in code_cells(nb):
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: a run's outputs are saved"
        assert any(c.cell_type == "markdown" for c in nb.cells), path.name


@pytest.mark.slow
def test_the_tour_trains_to_a_good_held_out_accuracy(ran: Callable[[str], NotebookNode]) -> None:
    nb = ran("01_tour.ipynb")
    losses = numbers(r"epoch +\d+ +mean loss ([\d.]+)", shown(cell_with(nb, "epoch(m, opt, log)")))
    assert len(losses) >= 3 and losses[-1] < losses[0] / 4, losses
    accuracy = numbers(r"held-out accuracy: ([\d.]+)%", all_shown(nb))
    assert len(accuracy) == 1 and accuracy[0] > 90, accuracy


@pytest.mark.slow
def test_the_tour_shows_a_compile_error_that_changes_nothing(ran: Callable[[str], NotebookNode]) -> None:
    nb = ran("01_tour.ipynb")
    tagged = [c for c in code_cells(nb) if "raises-exception" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and tagged[0].source.startswith("%%shapescript")
    outputs = tagged[0].outputs
    diagnostic = next(o for o in outputs if o.output_type == "display_data")
    assert "error[E0304]" in diagnostic.data["text/plain"] and "error[E0304]" in diagnostic.data["text/html"]
    assert re.search(r"--> cell \[\d+\]:3:12", diagnostic.data["text/plain"])
    assert [o.ename for o in outputs if o.output_type == "error"] == ["CellCompileError"]
    # The cell after it runs on the program as it was: forward predicts what it did before.
    after = code_cells(nb)[code_cells(nb).index(tagged[0]) + 1:]
    assert len(after) == 1 and re.search(r"^forward as before: True$", shown(after[0]), re.M)


@pytest.mark.slow
def test_the_several_devices_notebook_trains_and_moves_a_checkpoint(ran: Callable[[str], NotebookNode]) -> None:
    nb = ran("02_several_devices.ipynb")
    assert "Starting workers on cpu[0 1]" in all_shown(nb)
    assert "813,072 bytes" in all_shown(nb)  # train_step's bytes per call, from the device table
    assert shown(cell_with(nb, "m.w1.shape")).strip() == "torch.Size([784, 256])"
    steps = numbers(r"step +\d+ +loss ([\d.]+)", shown(cell_with(nb, "train_step(m, opt")))
    assert len(steps) >= 4 and steps[-1] < steps[0] - 0.2, steps
    first, last = numbers(r"([\d.]+) over the (?:first|last) \d+", shown(cell_with(nb, "run(m, opt")))
    assert last < first - 0.2, (first, last)
    status = shown(cell_with(nb, "%shapescript status"))
    assert "workers on cpu[0 1]: running" in status and "cpu:0" in status and "cpu:1" in status
    params, state = param_and_adamw_bytes(README_MLP_SHAPES)  # each object's bytes per device, from torch
    assert (f"Every worker holds: m (Mlp model, {params:,} bytes ({params / 2**10:.0f} KiB) per device), "
            f"opt (AdamW[Mlp] optimizer, {state:,} bytes ({state / 2**20:.2f} MiB) per device).") in status
    assert re.search(r"^same params: True$", shown(cell_with(nb, "ss.restore(")), re.M)
    assert re.search(r"^same outputs: True$", shown(cell_with(nb, "one.forward(")), re.M)
    assert "Stopping the workers on cpu[0 1]" in shown(cell_with(nb, "%shapescript stop"))


@pytest.mark.slow
def test_the_several_devices_notebook_shows_the_placement_table_as_html_that_outlives_the_kernel(
        ran: Callable[[str], NotebookNode]) -> None:
    """The cell that defines train_step ends with the placement and communication table, with
    train_step's bytes per call, in a closed panel of HTML: saved in the notebook as it shows, not as
    a widget whose state JupyterLab doesn't save (reopened, it said "Error displaying widget")."""
    nb = ran("02_several_devices.ipynb")
    outputs = cell_with(nb, "fn train_step(").outputs
    assert not [o for o in outputs if WIDGET_VIEW in o.get("data", {})]
    tables = [o.data["text/html"] for o in outputs if "ss-device-table" in o.get("data", {}).get("text/html", "")]
    assert len(tables) == 1 and "<details>" in tables[0] and "813,072" in tables[0], tables


@pytest.mark.slow
def test_the_attention_notebook_loss_falls_below_the_unigram_entropy(ran: Callable[[str], NotebookNode]) -> None:
    nb = ran("03_attention.ipynb")
    steps = numbers(r"step +\d+ +loss ([\d.]+)", shown(cell_with(nb, "gpt.train(")))
    assert len(steps) >= 4 and steps[-1] < steps[0] - 1.0, steps
    before = numbers(r"before training: ([\d.]+) nats \(uniform guess [\d.]+, unigram entropy ([\d.]+)\)",
                     all_shown(nb))
    after = numbers(r"after \d+ steps: ([\d.]+) nats \(unigram entropy ([\d.]+)\)", all_shown(nb))
    assert len(before) == 2 and len(after) == 2
    assert before[0] > before[1] > after[0], (before, after)  # trained past what character counts give
    # %load_ext shapescript: the training loop shows its bar, ending at the loop's batch count.
    bars = [o.data["text/html"] for o in cell_with(nb, "gpt.train(").outputs
            if "ss-bars" in o.get("data", {}).get("text/html", "")]
    assert len(bars) == 1 and 'value="60" max="60"' in bars[0], bars


@pytest.mark.slow
def test_the_nanogpt_notebook_trains_resumes_from_the_best_checkpoint_and_samples(
        ran: Callable[[str], NotebookNode]) -> None:
    nb = ran("05_nanogpt.ipynb")
    training = shown(cell_with(nb, "run = nanogpt.train(config)"))
    evals = [(int(it), val) for it, val in re.findall(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)$",
                                                       training, re.M)]
    assert [it for it, _ in evals] == [0, 20, 40, 60] and float(evals[-1][1]) < float(evals[0][1]) - 0.5, evals
    first, last = numbers(r"loss ([\d.]+) over the first 10 iterations, ([\d.]+) over the last 10", all_shown(nb))
    assert last < first - 0.5, (first, last)
    assert "['ckpt.json', 'ckpt.safetensors']" in all_shown(nb)
    # train.py keeps the best val loss's checkpoint (never iteration 0's), and the resume starts there.
    best_it, best = min(evals[1:], key=lambda e: float(e[1]))
    resumed = shown(cell_with(nb, "resume=True"))
    assert "resuming training from " in resumed and f"at iter {best_it}, best val loss {best}" in resumed
    assert re.search(rf"^resumed at {best_it}, now at 90 \(optimizer steps 90\)", resumed, re.M), resumed
    samples = shown(cell_with(nb, "nanogpt.sample(")).split("---------------\n")
    assert len(samples) == 3 and all(s.startswith("The ") and len(s) == len("The ") + 60 + 1 for s in samples[:2])
    assert samples[2].strip() == "the same samples again: True"


def saved_html(cell: NotebookNode) -> str:
    return "\n".join(o.data["text/html"] for o in cell.outputs if "text/html" in o.get("data", {}))


@pytest.mark.slow
def test_the_training_notebook_shows_what_a_long_session_needs(ran: Callable[[str], NotebookNode]) -> None:
    nb = ran("04_training.ipynb")
    model = shown(cell_with(nb, "m = Mlp.init(seed=0)"))  # the model, as a table
    assert "w1: [784, 256] f32" in model and "w2: [256, 10] f32" in model
    # Two passes in one cell: one bar, at 64 of 64 (4,096 examples in batches of 64) on its second pass.
    training = cell_with(nb, "for _ in range(2):")
    assert saved_html(training).count("<progress") == 1 and 'value="64" max="64"' in saved_html(training)
    assert "pass 2: 100%" in shown(training)
    assert "<svg" in saved_html(training) and "<polyline" in saved_html(training)  # the live chart
    first, last = numbers(r"([\d.]+) over the (?:first|last) \d+", shown(training))
    assert last < first - 0.5, (first, last)
    # The timeline: both workers, one marked slowest, each collective of train_step by its line.
    timeline = shown(cell_with(nb, "print(ss_program.timeline("))
    assert re.search(r"^cpu:0 ", timeline, re.M) and re.search(r"^cpu:1 ", timeline, re.M)
    assert timeline.count("<- slowest") == 1 and "notebook.ss:21:12 all-reduce" in timeline
    # %shapescript timeline's output is HTML that later calls redraw: saved, it
    # shows a call made after the next cell printed the table, with a bar per worker: a later call
    # on cpu[0 1], or the last cells' program on cpu[0 1 2] (it shows the pool that called last).
    [drawn] = cell_with(nb, "%shapescript timeline").outputs
    assert WIDGET_VIEW not in drawn.data and 'class="ss-timeline-bars"' in drawn.data["text/html"]
    assert re.findall(r'<g class="ss-timeline-bar" data-worker="(\d)">', drawn.data["text/html"])[:2] == ["0", "1"]
    [printed_last] = numbers(r"\(the last: #(\d+)\)", timeline.split("\n\n")[0])
    calls = re.findall(r"on (cpu\[[\d ]+\]): mean ms of \d+ calls? \(the last: #(\d+)\)", drawn.data["text/plain"])
    assert calls and any(devices == "cpu[0 1 2]" or int(last) > printed_last for devices, last in calls), calls
    # In the background: read between steps, shown by status, stopped at a step boundary, resumed.
    moved = shown(cell_with(nb, "while h.steps < 5"))
    assert re.search(r"^running at step \d+; w1 has moved by [\d.]+$", moved, re.M), moved
    assert "Running in the background `run`: running; batch " in shown(cell_with(nb, "%shapescript status"))
    resumed = shown(cell_with(nb, "h.stop()"))
    assert "stopped at a step boundary" in resumed and "`run`: finished; batch 64 of 64" in resumed
    # An interrupt waits for the step, and the model trains on.
    interrupted = shown(cell_with(nb, "except ss.parallel.StepInterrupt"))
    assert re.search(r"^interrupted after \d+ steps$", interrupted, re.M)
    assert "ended on every worker" in interrupted and "as that step left them" in interrupted
    assert numbers(r"going on: ([\d.]+)", all_shown(nb))
    # The checkpoint from two devices, on three.
    moved_to_three = shown(cell_with(nb, "devices=\"cpu[0 1 2]\""))
    assert re.search(r"^same outputs on three devices: True$", moved_to_three, re.M)
    assert re.search(r"^and the same step: True$", moved_to_three, re.M)
    stopped = shown(cell_with(nb, "%shapescript stop"))
    assert "m (Mlp model), opt (AdamW[Mlp] optimizer), data (dataset TensorDataset)" in stopped


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_a_notebook_saved_without_the_widgets_state_shows_every_output_as_html(
        ran: Callable[[str], NotebookNode], name: str) -> None:
    """A notebook saved as JupyterLab saves one by default, without the widgets'
    state, keeps no widget view (which a reopened notebook would draw as "Error displaying widget:
    model not found"): the bars, the live charts, the timeline and the placement table are HTML, and
    nbconvert's HTML of it shows each of them."""
    from nbconvert import HTMLExporter

    nb = ran(name).copy()
    nb.metadata = {k: v for k, v in nb.metadata.items() if k != "widgets"}
    views = [c.source.splitlines()[0] for c in code_cells(nb) for o in c.outputs if WIDGET_VIEW in o.get("data", {})]
    assert not views, views
    page, _ = HTMLExporter().from_notebook_node(nb)
    assert WIDGET_VIEW not in page and "model not found" not in page
    shows = {"02_several_devices.ipynb": ["ss-bars", "ss-device-table", "ss-model-table", "ss-timeline-bars"],
             "04_training.ipynb": ["ss-bars", "ss-device-table", "ss-live", "ss-timeline-bars"],
             "05_nanogpt.ipynb": []}.get(name, ["ss-bars"])  # 05's loop is Python's: no bar
    assert [cls for cls in shows if f'class="{cls}"' not in page] == []
