"""A .ss file is code: its `python fn` and `extern fn` import and call what they name. Loading with
Python refused (`ss.load(..., python=False)`, `shapescript run --no-python`) rejects such a program
at compile time (E0701); and the tools that only read a program never import what it names.
The language server's side is tests/lsp/test_lsp_imports.py."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import ROOT

import shapescript as ss
import shapescript.std
from shapescript.names import STD_EXTERNS

# A module whose import leaves a mark beside itself: what shows that something imported it.
MARKING_MODULE = """\
import pathlib

pathlib.Path(__file__).with_name("imported.marker").write_text("imported")


def answer():
    import torch
    return torch.tensor(42.0)


def double(x):
    return x * 2
"""

PROGRAM = """\
dim D = 3

python fn answer() -> [] = "{module}.answer"

extern fn double(x: [n D]) -> [n D] = "{module}.double"

extern fn normed(x: [n D], over: Axis[D]) -> [n D] = "shapescript.std.layer_norm"

fn main() -> [] = answer()

fn twice(x: [b D]) -> [b D] = normed(double(x), over=D)
"""

STD_ONLY = """\
dim D = 3

extern fn normed(x: [n D], over: Axis[D]) -> [n D] = "shapescript.std.layer_norm"

extern fn rms(x: [n D], over: Axis[D]) -> [n D] = "shapescript.std.rms_norm"

fn f(x: [b D]) -> [b D] = rms(normed(x, over=D), over=D)
"""


def write_program(folder: Path, module: str) -> Path:
    (folder / f"{module}.py").write_text(MARKING_MODULE)
    path = folder / "prog.ss"
    path.write_text(PROGRAM.format(module=module))
    return path


def test_python_false_refuses_each_python_and_extern_fn_at_its_declaration() -> None:
    source = PROGRAM.format(module="never_imported_module")
    with pytest.raises(ss.CompileError) as info:
        ss.load(source, name="prog.ss", python=False)
    found = [(d.code, d.span.line, d.span.col, d.span.end_col) for d in info.value.diagnostics]
    # `python fn answer` and `extern fn double`, underlined from the keyword to the name; the std
    # library's layer_norm is allowed
    assert found == [("E0701", 3, 1, len("python fn answer") + 1), ("E0701", 5, 1, len("extern fn double") + 1)]
    first = info.value.diagnostics[0]
    assert first.message == "`python fn answer` runs Python code, and this program is loaded with Python refused"
    assert first.secondary[0][0].line == 3 and first.secondary[0][1] == "the function it would import and call"
    assert "never_imported_module" not in sys.modules
    std = ss.load(STD_ONLY, name="std.ss", python=False)  # the standard library's are allowed, and run
    x = torch.randn(4, 3)
    torch.testing.assert_close(std.f(x), torch.nn.functional.rms_norm(torch.nn.functional.layer_norm(x, (3,)), (3,)))
    ss.load(source, name="prog.ss")  # allowed by default: and still nothing imported
    assert "never_imported_module" not in sys.modules
    with pytest.raises(TypeError, match="python= is True or False, not str"):
        ss.load(source, name="prog.ss", python="no")  # type: ignore[arg-type]


def test_the_allowed_std_externs_are_std_pys_functions() -> None:
    functions = {f"shapescript.std.{name}" for name, value in vars(shapescript.std).items()
                 if inspect.isfunction(value) and value.__module__ == "shapescript.std" and not name.startswith("_")}
    assert STD_EXTERNS == functions


def test_loading_imports_nothing_until_a_python_fn_is_called(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = f"marking_{os.getpid()}_load"
    path = write_program(tmp_path, module)
    monkeypatch.syspath_prepend(str(tmp_path))
    prog = ss.load(path)
    assert not (tmp_path / "imported.marker").exists() and module not in sys.modules
    assert prog.main().item() == 42.0  # the control: a call imports it, and the marker shows it
    assert (tmp_path / "imported.marker").exists()
    sys.modules.pop(module, None)


def cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command line in `folder`, where the marking module can be imported (the current folder is
    on `python -m`'s path)."""
    return subprocess.run([sys.executable, "-m", "shapescript.cli", *args], capture_output=True, text=True,
                          cwd=folder, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


# The reading commands, run one after another in one process (one start of Python), which then says
# whether any of them imported the module, or torch (3 s at every start, for nothing).
READ_ONLY = [["check", "prog.ss"], ["check", "prog.ss", "--devices", "cpu[0 1]"],
             ["comms", "prog.ss", "--devices", "cpu[0 1 2]"], ["comms", "prog.ss", "--json"],
             ["build", "prog.ss"], ["build", "prog.ss", "--standalone"], ["build", "prog.ss", "-o", "out.py"],
             ["build", "prog.ss", "--devices", "cpu[0 1]"], ["explain", "E0701"]]
READ_ONLY_SCRIPT = """\
import contextlib, io, sys
from shapescript.cli import main
for args in {commands!r}:
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    print(code, "marking_cli" in sys.modules, "torch" in sys.modules)
"""


def test_check_comms_and_build_never_import_what_a_program_names_nor_torch_and_run_does(tmp_path: Path) -> None:
    write_program(tmp_path, "marking_cli")
    marker = tmp_path / "imported.marker"
    read = subprocess.run([sys.executable, "-c", READ_ONLY_SCRIPT.format(commands=READ_ONLY)], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert read.returncode == 0, read.stderr
    assert read.stdout.splitlines() == ["0 False False"] * len(READ_ONLY), read.stderr  # each ran, and imported neither
    assert (tmp_path / "out.py").exists() and not marker.exists()
    refused = cli(tmp_path, "run", "prog.ss", "main", "--no-python")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("error[E0701]: `python fn answer` runs Python code") and \
        refused.stderr.count("error[E0701]") == 2
    assert not marker.exists()
    ran = cli(tmp_path, "run", "prog.ss", "main")  # the control: running it imports it
    assert (ran.returncode, ran.stdout) == (0, "42.0\n"), ran.stderr
    assert marker.exists()


def test_the_cli_help_says_a_program_is_code(capsys: pytest.CaptureFixture[str]) -> None:
    from shapescript.cli import main
    for args in (["--help"], ["run", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            main(args)
        text = " ".join(capsys.readouterr().out.split())
        assert exit_.value.code == 0 and "A .ss file is code" in text and "--no-python" in text
