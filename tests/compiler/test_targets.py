"""Lowering prints one module per target (one device, worker, controller, standalone), and each is
exactly what runs there: nothing is patched into it after it loads.

1. An extern fn returning the wrong shape raises ShapeError naming its .ss declaration on `cpu`, on
   the workers of `cpu[0 1]` (called from Python, and from a loop in the controller), and in a
   standalone module built by `shapescript build --standalone`, run where no shapescript is.
2. On several devices the controller's module holds the stubs of the fns on the workers and the
   runtime whose batches the workers load; `ss.load` runs that module as printed. The workers load
   one device's module.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from support import ROOT

import shapescript as ss
from shapescript.api import compile_program
from shapescript.errors import CompileError, WorkerError
from shapescript.lower.targets import Target
from shapescript.parallel.remote import RemoteFunction
from shapescript.pipeline import python_module

PROGRAM = textwrap.dedent("""\
    devices DEVICES
    dim D = 3

    data Ex:
        x: [D]

    extern fn narrow(x: [b D]) -> [b D] = "ss_targets_helper.narrow"
    extern fn twice(x: [b D]) -> [b D] = "ss_targets_helper.twice"

    fn wrong(x: [b D]) -> [b D] = narrow(x)
    fn right(x: [b D]) -> [b D] = twice(x)
    fn wrong_total(batch: [b] Ex) -> [] = sum(sum(narrow(batch.x), over=D), over=b)
    fn right_total(batch: [b] Ex) -> [] = sum(sum(twice(batch.x), over=D), over=b)

    fn wrong_loop(data: Dataset[Ex], log: Sink):
        for batch in data |> batches(2):
            write(log, logs(total=wrong_total(batch)))

    fn right_loop(data: Dataset[Ex], log: Sink):
        for batch in data |> batches(2):
            write(log, logs(total=right_total(batch)))
    """)

HELPER = textwrap.dedent("""\
    def narrow(x):
        return x[:, :2]

    def twice(x):
        return x * 2
    """)

# The check of `narrow`'s result, as every target words it (the batch's size aside).
WRONG = (r"`result` of `narrow` \(targets\.ss:7:1\): expected \[b D\] with D = 3, got shape \[\d+, 2\]; "
         r"dim 1 is 2, not D = 3")


def program(devices: str) -> str:
    return PROGRAM.replace("DEVICES", devices)


@pytest.fixture
def helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The extern fns' module, on sys.path here and (through PYTHONPATH) in the workers and subprocesses."""
    folder = tmp_path / "helpers"
    folder.mkdir()
    (folder / "ss_targets_helper.py").write_text(HELPER)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), str(ROOT)]))
    return folder


@pytest.fixture
def several(helper: Path):
    prog = ss.load(program("cpu[0 1]"), name="targets.ss")
    yield prog
    prog.stop()


# ---- 1. a wrong result is a ShapeError on every target ---------------------------------------------

def test_a_wrong_result_is_a_shape_error_on_one_device(helper: Path) -> None:
    prog = ss.load(program("cpu"), name="targets.ss")
    x = torch.randn(4, 3)
    assert torch.equal(prog.right(x), x * 2)
    with pytest.raises(ss.ShapeError, match=WRONG):
        prog.wrong(x)
    log = ss.sinks.memory()
    with pytest.raises(ss.ShapeError, match=WRONG):
        prog.wrong_loop(ss.TensorDataset(x=x), log)
    assert log.records == []


def test_a_wrong_result_is_a_shape_error_on_the_workers_called_from_python(several: ss.Program) -> None:
    x = torch.randn(4, 3)
    assert torch.equal(several.right(x), x * 2)
    with pytest.raises(ss.ShapeError, match=WRONG) as info:
        several.wrong(x)
    assert "worker 0's traceback" in "\n".join(info.value.__notes__)  # the check ran on a worker


def test_a_wrong_result_is_a_shape_error_on_the_workers_called_from_the_controller(several: ss.Program) -> None:
    x = torch.randn(6, 3)
    log = ss.sinks.memory()
    several.right_loop(ss.TensorDataset(x=x), log)  # the same loop computes what torch does, batch by batch
    expected = [float((x[k:k + 2] * 2).sum()) for k in range(0, 6, 2)]
    assert [r["total"] for r in log.records] == pytest.approx(expected, abs=1e-5)  # summed in parts
    log = ss.sinks.memory()
    with pytest.raises(ss.ShapeError, match=WRONG):
        several.wrong_loop(ss.TensorDataset(x=x), log)
    assert log.records == []


def test_a_wrong_result_is_a_shape_error_in_a_standalone_build(helper: Path, tmp_path: Path) -> None:
    source, built = tmp_path / "targets.ss", tmp_path / "targets_standalone.py"
    source.write_text(program("cpu"))
    done = subprocess.run([sys.executable, "-m", "shapescript.cli", "build", "--standalone", str(source),
                           "-o", str(built)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    script = textwrap.dedent("""\
        import sys
        sys.modules["shapescript"] = None  # a standalone module must run where no shapescript is
        import torch
        import targets_standalone as M
        x = torch.randn(4, 3)
        assert torch.equal(M.right(x), x * 2)
        try:
            M.wrong(x)
        except M._rt.ShapeError as e:
            print("ShapeError:", e)
        """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(helper), str(tmp_path)])))
    assert run.returncode == 0, run.stderr
    message = run.stdout.strip().removeprefix("ShapeError: ")
    assert run.stdout.startswith("ShapeError: ")
    # the standalone module names the file it was built from
    assert re.match(WRONG.replace(r"targets\.ss", re.escape(str(source))), message), message


# ---- 2. the controller's module is what runs ---------------------------------------------------------

def test_the_controller_module_holds_the_stubs_and_runs_as_printed(several: ss.Program) -> None:
    checked = several.checked
    assert several.python_source == python_module(checked, Target.CONTROLLER)
    fresh: dict = {"__name__": "fresh"}
    exec(compile(several.python_source, "<fresh>", "exec"), fresh)
    on_workers = {name for name, fn in checked.fns.items()
                  if checked.placement(name).where == "workers" and fn.kind == "fn"}
    assert on_workers == {"wrong", "right", "wrong_total", "right_total"}
    for name in checked.fns:  # what ss.load runs is what the module printed: no name replaced after it ran
        assert type(several.namespace[name]) is type(fresh[name])
        assert isinstance(fresh[name], RemoteFunction) == (name in on_workers)
    assert several.namespace["_workers"] is several and fresh["_workers"] is None
    assert "def right_total(" not in several.python_source and "def right_total(" in several.worker_source


def test_a_controller_module_run_without_workers_says_so(several: ss.Program) -> None:
    fresh: dict = {"__name__": "fresh"}
    exec(compile(several.python_source, "<fresh>", "exec"), fresh)
    with pytest.raises(WorkerError, match=r"`right` \(targets\.ss:11:4\) runs on the workers.*_workers"):
        fresh["right"](torch.ones(2, 3))
    with pytest.raises(WorkerError, match="a loop over batches runs on the workers"):
        fresh["right_loop"](ss.TensorDataset(x=torch.ones(2, 3)), ss.sinks.memory())


def test_the_workers_load_one_devices_module(several: ss.Program) -> None:
    """A worker's module is one device's: the same text, with its own DEVICE set as it loads."""
    checked = several.checked
    assert several.worker_source == python_module(checked, Target.WORKER) == python_module(checked, Target.ONE_DEVICE)
    assert several._load_args()[0] == several.worker_source
    one = ss.load(program("cpu"), name="targets.ss")
    assert one.worker_source is None and one.python_source == python_module(one.checked)


def test_each_target_is_refused_where_it_cannot_run() -> None:
    one = compile_program(program("cpu"), "targets.ss")
    with pytest.raises(ValueError, match="a controller is for several devices"):
        python_module(one, Target.CONTROLLER)
    assert python_module(one, Target.STANDALONE) == python_module(one, standalone=True)
    with pytest.raises(CompileError) as caught:
        python_module(compile_program(program("cpu[0 1]"), "targets.ss"), Target.STANDALONE)
    assert [d.code for d in caught.value.diagnostics] == ["E1805"]


def test_a_hostile_file_name_stays_text_in_the_controllers_stubs(helper: Path) -> None:
    """The stubs' .ss locations hold the file's name: as a literal, whatever it holds."""
    name = "x'\n__import__('sys').ss_canary = 1\n#\u2028\"\\"
    prog = ss.load(program("cpu[0 1]"), name=name)  # loads the controller's module; starts no worker
    assert not hasattr(sys, "ss_canary")
    # and shown as text a terminal can't take for commands: its controls as escapes (errors.terminal_text)
    shown = "x'\\n__import__('sys').ss_canary = 1\\n#\\u2028\"\\"
    assert prog.namespace["right"].where == f"`right` ({shown}:11:4)"
    assert prog.pool is None
