"""`%load_ext shapescript` in a real IPython kernel, driven as Jupyter drives it (jupyter_client).

One kernel serves the module; each test starts with `%shapescript reset`, so none depends on
another's definitions. The kernel runs this interpreter (sys.executable) with this checkout first
on its PYTHONPATH, so it imports the package under test installed or not.
"""

from __future__ import annotations

import html
import json
import os
import re
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbclient
import nbformat
import psutil
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient.exceptions import CellExecutionError
from support import README_MLP_SHAPES, ROOT, param_and_adamw_bytes

from shapescript.parallel.interrupts import DOUBLE_SAID, FIRST_SAID

KERNEL = "shapescript-test"
TIMEOUT = 120.0  # seconds for one cell: generous, for a loaded 2-core machine starting workers
ANSI = re.compile(r"\x1b\[[0-9;]*m")

# The README's program (examples/readme/mlp.ss) without its devices line and its loop: the
# cells give the devices themselves, and train from Python.
_README = (ROOT / "examples" / "readme" / "mlp.ss").read_text()
MLP = _README[_README.index("dim D"):_README.index("fn run(")].rstrip() + "\n"


@dataclass
class Run:
    """What one cell did: its reply's status and everything it showed."""

    status: str
    stdout: str = ""
    stderr: str = ""
    plain: list[str] = field(default_factory=list)  # text/plain of displays and results
    html: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None
    bundles: list[dict[str, Any]] = field(default_factory=list)  # every display's and result's whole data

    @property
    def traceback(self) -> str:
        return ANSI.sub("", "\n".join(self.error["traceback"])) if self.error else ""

    def value(self) -> Any:
        """The cell's result, as the JSON its last line printed."""
        assert self.status == "ok", self.traceback
        return json.loads(self.stdout.strip().splitlines()[-1])


def kernel_manager(tmp: Path) -> KernelManager:
    """A manager for a kernel of this interpreter that imports this checkout first."""
    spec = tmp / "kernels" / KERNEL
    spec.mkdir(parents=True)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "ShapeScript tests", "language": "python", "env": {"PYTHONPATH": path}}))
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(tmp / "kernels")]))


class Kernel:
    """A kernel, and a blocking client that runs cells and collects what they show."""

    def __init__(self, tmp: Path) -> None:
        self.manager = kernel_manager(tmp)
        self.manager.start_kernel()
        self.client = self.manager.client()
        self.client.start_channels()
        try:
            self.client.wait_for_ready(timeout=TIMEOUT)
        except BaseException:
            self.shutdown()
            raise

    def run(self, code: str, timeout: float = TIMEOUT, on_output: Callable[[dict[str, Any]], None] | None = None) -> Run:
        """`code` run as a cell; `on_output` is given each message of its output as it comes."""
        messages: list[dict[str, Any]] = []

        def hook(msg: dict[str, Any]) -> None:
            messages.append(msg)
            if on_output is not None:
                on_output(msg)
        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=hook, stop_on_error=False)
        run = Run(reply["content"]["status"])
        for msg in messages:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                setattr(run, content["name"], getattr(run, content["name"]) + content["text"])
            elif kind in ("display_data", "execute_result"):
                run.bundles.append(content["data"])
                run.plain.append(content["data"].get("text/plain", ""))
                if "text/html" in content["data"]:
                    run.html.append(content["data"]["text/html"])
            elif kind == "error":
                run.error = content
        return run

    def ok(self, code: str, timeout: float = TIMEOUT) -> Run:
        run = self.run(code, timeout)
        assert run.status == "ok", f"{code}\n-> {run.traceback}\n{run.plain}"
        return run

    def pid(self) -> int:
        return int(self.ok("import os; print(os.getpid())").stdout.strip())

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=False)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    k = Kernel(tmp_path_factory.mktemp("kernel"))
    k.ok("%load_ext shapescript\nimport json, torch\nimport shapescript as ss")
    yield k
    k.shutdown()


@pytest.fixture
def fresh(kernel: Kernel) -> Kernel:
    kernel.ok("%shapescript reset")
    return kernel


# A linear classifier and its training step on two devices.
LINEAR_STEP = """devices cpu[0 1]
dim D = 3
dim C = 2
data Ex:
    x: [D]
    y: [] Index[C]
model Lin:
    param w: [D C] = zeros()
fn loss(m: Lin, batch: [b] Ex) -> [] = cross_entropy(batch.x @ m.w, batch.y, over=C)
fn step(mut m: Lin, mut opt: AdamW[Lin], batch: [b] Ex) -> []:
    l, g = value_and_grad(loss, m, batch)
    update(mut m, mut opt, g)
    return l
"""


def cell(source: str) -> str:
    return "%%shapescript\n" + source


def test_a_compile_error_shows_in_the_cell_with_its_own_lines(fresh: Kernel) -> None:
    fresh.ok(cell(MLP))
    wrong = MLP.replace("relu(x @ m.w1) @ m.w2", "relu(x @ m.w1) @ m.w1")
    run = fresh.run(cell(wrong))
    assert run.status == "error"
    # The line as the cell shows it, the %%shapescript line being line 1.
    line = 1 + wrong.splitlines().index("    return relu(x @ m.w1) @ m.w1") + 1
    assert len(run.plain) == 1 and len(run.html) == 1
    text = run.plain[0]
    assert "error[E0304]: `@` contracts [b Hd]'s last axis Hd with [D Hd]'s first axis D" in text
    assert re.search(rf"--> cell \[\d+\]:{line}:12\n", text), text
    assert f"{line} |     return relu(x @ m.w1) @ m.w1" in text
    assert re.search(r"\|            \^{21} Hd vs D", text), text
    page = html.unescape(re.sub(r"<[^>]+>", "", run.html[0]))
    for piece in ("error[E0304]", f"{line} |     return relu(x @ m.w1) @ m.w1", "^" * 21 + " Hd vs D",
                  "%shapescript explain E0304", "docs/errors.md#e0304"):
        assert piece in page
    # The failure is one line, not a traceback of the extension's frames.
    assert run.error is not None and run.error["ename"] == "CellCompileError"
    assert run.traceback.startswith("CompileError: 1 error in cell [") and "\n" not in run.traceback
    # Nothing changed: the earlier forward is still bound, and still right.
    probe = fresh.ok("m = Mlp.init(seed=0); x = torch.randn(2, 784)\n"
                     "print(json.dumps(bool(torch.allclose(forward(m, x), torch.relu(x @ m.w1) @ m.w2))))")
    assert probe.value() is True


def test_an_error_in_an_earlier_cell_names_that_cell(fresh: Kernel) -> None:
    first = fresh.ok(cell("fn k(x: [3]) -> [3] = x\nfn h(x: [3]) -> [3]:\n    return k(x)\n"))
    count = int(fresh.ok("print(len(In) - 2)").stdout)  # In [n] of the cell before this one
    assert first.stdout == ""
    run = fresh.run(cell("fn k(x: [4]) -> [4] = x\n"))
    assert run.status == "error"
    assert f"--> cell [{count}]:4:" in run.plain[0], run.plain[0]  # h's call of k, in the first cell
    assert "4 |     return k(x)" in run.plain[0]


def test_rerunning_a_cell_replaces_its_function(fresh: Kernel) -> None:
    fresh.ok(cell("fn f(x: [3]) -> [3] = x * 2.0\n"))
    assert fresh.ok("print(json.dumps(f(torch.ones(3)).tolist()))").value() == [2.0, 2.0, 2.0]
    fresh.ok(cell("fn f(x: [3]) -> [3] = x * 3.0\n"))
    assert fresh.ok("print(json.dumps(f(torch.ones(3)).tolist()))").value() == [3.0, 3.0, 3.0]
    assert fresh.ok("print(json.dumps(ss_program.f is f))").value() is True


def test_nbclient_stops_at_a_failing_cell(tmp_path: Path) -> None:
    cells = ["%load_ext shapescript", cell("fn f(x: [3]) -> [4] = x\n"), "print('not reached')"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    km = kernel_manager(tmp_path)
    client = nbclient.NotebookClient(notebook, km=km, timeout=TIMEOUT)
    try:
        with pytest.raises(CellExecutionError) as info:
            client.execute()
    finally:  # nbclient leaves a kernel it was given
        km.shutdown_kernel(now=True)
    assert "CompileError: 1 error in cell [2]" in str(info.value)
    shown, failed = notebook.cells[1].outputs
    assert "error[E0305]" in shown["data"]["text/plain"] and "error[E0305]" in shown["data"]["text/html"]
    assert failed["output_type"] == "error" and len(failed["traceback"]) == 1
    assert notebook.cells[2].outputs == []


def test_bad_magic_arguments_are_usage_errors(fresh: Kernel) -> None:
    for line in ("%shapescript devices gpu[0]", "%shapescript frobnicate", "%shapescript explain E9999",
                 "%shapescript comms --batch 0", "%%shapescript --batch x\ndim D = 4"):
        run = fresh.run(line)  # IPython says a UsageError in one line, on stderr
        assert run.status == "error" and run.stderr.startswith("UsageError: ") and run.error is None, line
    assert "E0304: " in fresh.ok("%shapescript explain E0304").stdout


@pytest.mark.slow
def test_handles_survive_cells_on_two_devices(fresh: Kernel) -> None:
    started = fresh.ok(cell("devices cpu[0 1]\n\n" + MLP))
    assert "Starting workers on cpu[0 1]" in started.stdout
    fresh.ok("m = Mlp.init(seed=0)\nopt = ss.adamw(m, lr=1e-3)")
    added = fresh.ok(cell("fn predict(m: Mlp, x: [b D]) -> [b C] = relu(x @ m.w1) @ m.w2\n"))
    assert added.stdout == ""  # the same workers: nothing stopped, nothing started
    step = fresh.ok(
        "g = torch.Generator().manual_seed(0)\n"
        "batch = {'img': torch.randn(6, 784, generator=g), 'label': torch.randint(0, 10, (6,), generator=g)}\n"
        "before = m.w1.clone()\n"
        "l = train_step(m, opt, batch)\n"
        "print(json.dumps([list(m.w1.shape), bool(torch.isfinite(l)), bool((m.w1 != before).any()),\n"
        "                  list(predict(m, batch['img']).shape)]))")
    assert step.value() == [[784, 256], True, True, [6, 10]]
    status = fresh.ok("%shapescript status").plain[0]
    assert "workers on cpu[0 1]: running" in status
    params, state = param_and_adamw_bytes(README_MLP_SHAPES)  # each object's bytes per device, from torch
    assert (f"Every worker holds: m (Mlp model, {params:,} bytes ({params / 2**10:.0f} KiB) per device), "
            f"opt (AdamW[Mlp] optimizer, {state:,} bytes ({state / 2**20:.2f} MiB) per device).") in status
    assert "cpu:0" in status and "cpu:1" in status
    # Other devices: the old workers stop, saying what goes with them, and the handles say so too.
    moved = fresh.ok("%shapescript devices cpu --discard")
    assert "gone with them: m (Mlp model), opt (AdamW[Mlp] optimizer)" in moved.stdout
    stale = fresh.run("m.w1")
    assert stale.status == "error" and "workers that have stopped" in stale.traceback


def children(pid: int) -> set[int]:
    """The live processes under `pid` (a zombie has stopped: only its exit status is left)."""
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    return {p.pid for p in procs if _alive(p)}


def fork_servers(pid: int) -> set[int]:
    """The kernel's fork server (parallel/forkserver.py): a child it keeps from its first pool on, of
    whom the workers are children. (A worker, forked from it, shows the same command line.)"""
    try:
        procs = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return set()
    return {p.pid for p in procs if _alive(p) and "forkserver import serve" in " ".join(p.cmdline())}


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone(pids: set[int], within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and _alive(psutil.Process(p)) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_stop_and_the_kernels_end_leave_no_worker(tmp_path: Path) -> None:
    k = Kernel(tmp_path)
    try:
        k.ok("%load_ext shapescript")
        pid = k.pid()
        before = children(pid)
        k.ok(cell("devices cpu[0 1]\nmodel Mlp:\n    param w: [3 2] = zeros()\n"))
        workers_up = "_ = Mlp.init(seed=0)"  # the first call waits for the workers
        k.ok(workers_up)
        servers = fork_servers(pid)
        workers = children(pid) - before - servers
        assert len(workers) == 2 and len(servers) == 1
        # They watch the kernel's process: they end with it even if it is killed outright.
        assert all(psutil.Process(w).cmdline()[-2:] == ["--parent", str(pid)] for w in workers)
        assert all(str(w) in k.ok("%shapescript status").plain[0] for w in workers)
        assert "Stopping the workers on cpu[0 1]" in k.ok("%shapescript stop --discard").stdout
        assert gone(workers) and children(pid) == before | servers  # the fork server stays for the next
        k.ok(workers_up)  # they start again when needed
        workers = children(pid) - before - servers
        assert len(workers) == 2 and fork_servers(pid) == servers
        # A restart shuts the kernel down as a shutdown does (jupyter_client's shutdown_kernel): its
        # exit stops the workers and the fork server.
        k.manager.restart_kernel(now=False)
        assert gone(workers | servers | {pid}), "the kernel's end left workers behind"
        k.client.wait_for_ready(timeout=TIMEOUT)
    finally:
        k.shutdown()


STARTED = "print('started', flush=True)\n"  # a cell's first line, from which Interrupts count


class Interrupts:
    """The kernel interrupted (■) `delays` seconds after the cell printed `started` (STARTED), each
    from a timer: counted from when the cell runs, not from when it was sent, which on a loaded
    machine may be seconds before. An `on_output` of Kernel.run; cancel() once the cell is done."""

    def __init__(self, kernel: Kernel, *delays: float) -> None:
        self.timers = [threading.Timer(delay, kernel.manager.interrupt_kernel) for delay in delays]
        self.started = False

    def __call__(self, msg: dict[str, Any]) -> None:
        if not self.started and msg["msg_type"] == "stream" and "started" in msg["content"]["text"]:
            self.started = True
            for timer in self.timers:
                timer.start()

    def cancel(self) -> None:
        for timer in self.timers:
            timer.cancel()


@pytest.mark.slow
def test_an_interrupt_stops_a_loop_at_a_step_and_the_model_trains_on(fresh: Kernel) -> None:
    fresh.ok(cell(LINEAR_STEP))
    fresh.ok("m = Lin.init(seed=0)\nopt = ss.adamw(m, lr=0.1)\npids = ss_program.pool.pids\n"
             "batch = {'x': torch.randn(6, 3), 'y': torch.arange(6) % 2}\nsteps = 0")
    workers = set(fresh.ok("print(json.dumps(pids))").value())
    interrupts = Interrupts(fresh, 0.5)  # some steps in
    try:  # a loop of short steps: the interrupt lands during a step (which ends first) or between two
        run = fresh.run(STARTED + "while True:\n    step(m, opt, batch)\n    steps += 1", timeout=60,
                        on_output=interrupts)
    finally:
        interrupts.cancel()
    assert run.status == "error" and run.error["ename"] in ("KeyboardInterrupt", "StepInterrupt")
    assert set(fresh.ok("print(json.dumps(ss_program.pool.pids))").value()) == workers  # the same workers
    before = fresh.ok("w = m.w\nprint(json.dumps(steps))").value()
    assert before > 0
    fresh.ok("step(m, opt, batch)\nassert not torch.equal(m.w, w)")  # it trains on


def test_an_interrupt_that_waited_for_the_step_is_its_message_and_tb_has_the_rest(fresh: Kernel) -> None:
    """An interrupt during a call on the workers shows what became of the step and the models, in a
    few lines, not 40-60 lines through the package ending in an empty
    `StepInterrupt: `; %tb then shows the whole traceback."""
    fresh.ok(cell(LINEAR_STEP))
    fresh.ok("m = Lin.init(seed=0)\nopt = ss.adamw(m, lr=0.1)")
    # A double click on ■: the second press, 0.3 s after the first, is ignored. The step (3 s) ends
    # 2.5 s after the first press: time for both to land on a loaded machine.
    interrupts = Interrupts(fresh, 0.5, 0.8)
    try:
        run = fresh.run(STARTED + "x = 1\nss_program.workers().call('sleep', (3,), where='a long step')", timeout=60,
                        on_output=interrupts)
    finally:
        interrupts.cancel()
    assert run.status == "error" and run.error["ename"] == "StepInterrupt", run.traceback
    # each press said at once what it does
    assert run.stderr == FIRST_SAID + DOUBLE_SAID, run.stderr
    lines = run.traceback.splitlines()
    assert lines[0].startswith("StepInterrupt: Interrupted after a long step ended on every worker") and \
        len(lines) <= 6, run.traceback
    assert "the models and optimizer state" in run.traceback and "File " not in run.traceback
    assert lines[-1] == "The whole traceback, with ShapeScript's own frames: %tb"
    whole = fresh.run("%tb")
    shown = whole.stdout + whole.traceback
    assert "pool.py" in shown and "Interrupted after a long step ended" in shown, shown
    fresh.ok("step(m, opt, {'x': torch.randn(6, 3), 'y': torch.arange(6) % 2})")  # the workers go on


def test_a_second_quick_interrupt_stops_the_workers_and_says_so(fresh: Kernel) -> None:
    fresh.ok(cell("devices cpu[0 1]\nmodel Lin:\n    param w: [3 2] = zeros()\n"))
    fresh.ok("m = Lin.init(seed=0)\npids = ss_program.pool.pids")
    workers = set(fresh.ok("print(json.dumps(pids))").value())
    # Two interrupts while the controller waits for the workers, as during a long step: the first
    # would wait for the step to end; the second, 1.5 s later (not a double click), stops the workers at once.
    interrupts = Interrupts(fresh, 0.5, 2.0)
    try:
        run = fresh.run(STARTED + "ss_program.workers().call('sleep', (60,), where='a long step')", timeout=60,
                        on_output=interrupts)
    finally:
        interrupts.cancel()
    assert run.status == "error" and run.error["ename"] == "KeyboardInterrupt"
    assert "were stopped in the middle of a long step: the models and optimizer state on them are gone" \
        in run.traceback
    assert run.stderr == FIRST_SAID  # said at the first press; the second stopped them
    assert gone(workers)
    stale = fresh.run("m.w")
    assert stale.status == "error" and "workers that have stopped" in stale.traceback
    assert fresh.ok("print(json.dumps(list(Lin.init(seed=0).w.shape)))").value() == [3, 2]  # new workers


@pytest.mark.slow
def test_stopping_or_moving_workers_that_hold_models_is_refused_without_discard(fresh: Kernel) -> None:
    """`%shapescript stop`, `%shapescript devices ...` and a cell with a new devices line would lose
    the models and optimizers on the workers: each is refused, naming them, and nothing changes,
    until told `--discard`. On 875fb62 each went ahead."""
    fresh.ok(cell(LINEAR_STEP))
    fresh.ok("m = Lin.init(seed=0)\nopt = ss.adamw(m, lr=0.1)\n"
             "step(m, opt, {'x': torch.randn(4, 3), 'y': torch.arange(4) % 2})\nbefore = m.w")
    for line, how in (("%shapescript stop", "`%shapescript stop --discard`"),
                      ("%shapescript devices cpu", "`%shapescript devices cpu --discard`"),
                      (cell(LINEAR_STEP.replace("cpu[0 1]", "cpu")), "`%%shapescript --discard`")):
        refused = fresh.run(line)
        assert refused.status == "error", line
        said = refused.traceback
        assert "The workers on cpu[0 1] hold m (Lin model, 24 bytes per device), opt (AdamW[Lin] optimizer" in said
        assert how in said and "h.stop()" in said and "Traceback" not in said, said
        kept = fresh.ok("print(json.dumps([str(ss_program.devices), torch.equal(m.w, before)]))").value()
        assert kept == ["cpu[0 1]", True], line
    moved = fresh.ok("%shapescript devices cpu --discard")
    assert "gone with them: m (Lin model), opt (AdamW[Lin] optimizer)" in moved.stdout
    assert "this Lin was on workers that have stopped" in fresh.run("m.w").traceback
    assert fresh.ok("%shapescript stop").stdout == "No workers are running.\n"  # one device: nothing to refuse


@pytest.mark.slow
def test_reading_a_field_of_a_model_a_later_cell_reshaped_is_refused_as_a_call_is(fresh: Kernel) -> None:
    """A cell that changes a dim leaves the notebook's models of the old shapes: a call with one is
    refused (a ShapeError), and reading a field is refused the same way, not given silently in its
    old shape; its old values stay readable through state_dict()."""
    fresh.ok(cell(LINEAR_STEP))
    fresh.ok("m = Lin.init(seed=0)")
    fresh.ok(cell("dim D = 4"))
    call = fresh.run("step(m, ss.adamw(m, lr=0.1), {'x': torch.randn(4, 4), 'y': torch.arange(4) % 2})")
    read = fresh.run("m.w")
    for refused in (call, read):
        assert refused.error is not None and refused.error["ename"] == "ShapeError", refused.traceback
        assert "was made with D = 3, but D is now 4" in refused.traceback
        assert "make it again (Lin.init(seed=...)) or restore a checkpoint" in refused.traceback
    assert "reading `w`" in read.traceback
    assert fresh.ok("print(json.dumps(list(m.state_dict()['w'].shape)))").value() == [3, 2]
    fresh.ok("m = Lin.init(seed=0)\nassert m.w.shape == (4, 2)")


@pytest.mark.slow
def test_every_place_a_person_reads_is_a_cell_and_its_line(fresh: Kernel) -> None:
    """The timeline, the status, a worker's error and its whole traceback (%tb) say "cell [k], line n",
    as compile errors do, not notebook.ss:L:C; the caret of a worker's error is at the line that
    failed, not at the header of the function called from Python."""
    program = LINEAR_STEP + textwrap.dedent("""\
        fn bad(m: Lin, x: [b D]) -> [b C]:
            y = x @ m.w
            return log_softmax(y, over=C) + unencodable(y)
        extern fn unencodable(x: [b C]) -> [b C] = "json.dumps"
        """)
    fresh.ok(cell(program))

    def line_of(text: str) -> int:  # in the cell, whose first line is %%shapescript
        return program.split("\n").index(text) + 2
    header = line_of("fn bad(m: Lin, x: [b D]) -> [b C]:")
    failing = header + 2
    fresh.ok("m = Lin.init(seed=0)\nopt = ss.adamw(m, lr=0.1)\n"
             "step(m, opt, {'x': torch.randn(4, 3), 'y': torch.arange(4) % 2})")
    timeline = fresh.ok("%shapescript timeline").plain[-1]
    status = fresh.ok("%shapescript status").plain[-1]
    step_line = line_of("fn step(mut m: Lin, mut opt: AdamW[Lin], batch: [b] Ex) -> []:")
    said_as = re.search(r"`step` \(cell \[(\d+)\], line (\d+)\)", timeline)
    assert said_as is not None and int(said_as[2]) == step_line, timeline
    number = said_as[1]
    for shown in (timeline, status):
        assert f"`step` (cell [{number}], line {step_line})" in shown and "notebook.ss" not in shown, shown
    error = fresh.run("bad(m, torch.randn(4, 3))")
    said = error.traceback
    assert f"while running `bad` (cell [{number}], line {header})" in said
    assert f"--> cell [{number}], line {failing}\n" in said and f"{failing} |     return log_softmax" in said, said
    tb = fresh.run("%tb")
    whole = ANSI.sub("", tb.stdout + tb.traceback)
    assert f"while running `bad` (cell [{number}], line {header})" in whole and "failures.py" in whole, whole
    assert "notebook.ss:" not in whole


@pytest.mark.slow
def test_a_steps_result_logged_after_another_call_is_logged_in_a_kernel(fresh: Kernel) -> None:
    """The loop of tests/several/test_pipeline.py's LOGGED_AFTER, in a notebook on cpu[0 1]:
    `l = step(...)`, then another call, then `write(log, logs(loss=l))`. On 875fb62 the first batch
    failed with `TypeError: logs: loss has type Pending`; the losses logged must be the step's, as one
    device logs them."""
    fit = textwrap.dedent("""\
        fn fit(mut m: Lin, mut opt: AdamW[Lin], data: Dataset[Ex], log: Sink):
            for batch in data |> batches(6):
                l = step(mut m, mut opt, batch)
                p = loss(m, batch) * 2.0
                write(log, logs(loss=l, after=p))
        """)
    fresh.ok(cell(LINEAR_STEP + fit))
    train = ("g = torch.Generator().manual_seed(0)\n"
             "data = ss.TensorDataset(x=torch.randn(24, 3, generator=g), y=torch.arange(24) % 2)\n"
             "m = Lin.init(seed=0)\nlog = ss.sinks.memory()\nfit(m, ss.adamw(m, lr=0.1), data, log)\n"
             "print(json.dumps([[r['loss'], r['after']] for r in log.records]))")
    several = fresh.ok(train).value()
    fresh.ok("%shapescript devices cpu --discard")
    one = fresh.ok(train).value()
    assert len(several) == 4 and sum(several, []) == pytest.approx(sum(one, []), abs=1e-6)
