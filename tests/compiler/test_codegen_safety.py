"""The generated module holds the user's text only as escaped literals and comments, and checks
python and extern fns' results itself, so that both hold wherever it runs.

1. Names and file names built to break out of a comment, a docstring or a string (line breaks of
   every kind Python or `str.splitlines` knows, quotes, backslashes, an encoding declaration) go
   through `ss.load(src, name=...)`, `ss.load(path)` and `shapescript build`: the program loads and
   works, its run-time errors still name the .ss lines, and the payload they carry never runs.
2. Property tests over random names and file names: the module compiles to the same code as for a
   plain name (only its strings differ), with the same line table.
3. An extern fn returning the wrong shape or dtype raises the same ShapeError, naming its .ss line,
   on one device, on the workers of cpu[0 1], and in a standalone build.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import ROOT

import shapescript as ss
from shapescript.api import compile_program
from shapescript.cli import main as cli_main
from shapescript.lower.specs import STANDALONE_MODULES
from shapescript.pipeline import python_module

# Run as code, this leaves a mark in `sys` and a file in the working directory.
PAYLOAD = "import sys, pathlib; sys.ss_canary = pathlib.Path('pwned').touch() or 1"
HOSTILE = [template.replace("{P}", PAYLOAD) for template in [
    "x\n{P}\n#",  # a newline ends a `# file:line` comment
    "x\r{P}\r#", "x\r\n{P}\r\n#",  # so do \r and \r\n, for Python's tokenizer
    '"""\n{P}\n"""', "'''\n{P}\n'''",  # a docstring's end
    "x'; {P}; '", 'x"; {P}; "',  # a string's end
    "x\\\n{P}\n#", "x\\",  # a backslash: a line continuation, an escaped closing quote
    "x\u2028{P}\u2029#", "x\x85{P}\x0c#", "x\x0b{P}\x1c\x1d\x1e#",  # where str.splitlines (and linecache) split
    "x\n# -*- coding: utf-7 -*-\n{P}",  # an encoding declaration on line 2 of a written module
    "\t\x1b[2J\x7f é 名前 🙂.ss",  # tabs, escapes, DEL, letters of any script
]]

PROGRAM = textwrap.dedent("""\
    dim D = 3

    data Ex:
        x: [D]

    model Lin:
        param w: [D D] = normal(std=0.1)

    extern fn twice(x: [b D]) -> [b D] = "ss_safety_helper.twice"
    extern fn broken(x: [b D]) -> [b D] = "ss_safety_helper.broken"

    fn f(m: Lin, batch: [b] Ex) -> [b D] = twice(batch.x @ m.w)

    fn g(x: [b D]) -> [b D] = broken(x)

    fn hello():
        print("STRING")
    """)
# A .ss string holds anything but `"` and a newline (read from a file, a lone \r may count as one).
STRING = "x'''; " + PAYLOAD + "; '''\\\x0b" + PAYLOAD + "\u2028\x0c\\"
STRING_CR = STRING + "\r" + PAYLOAD  # \r ends a line for Python's tokenizer

HELPER = textwrap.dedent("""\
    def twice(x):
        return x * 2

    def broken(x):
        raise ValueError("broken on purpose")

    def narrow(x):
        return x[:, :2]

    def as_int(x):
        return x.long()

    def square(x):
        return x.new_zeros(x.shape[0], 2 * x.shape[0] + 1)
    """)


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A working directory for the canary's file, and the extern fns' module on sys.path."""
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "ss_safety_helper.py").write_text(HELPER)
    monkeypatch.syspath_prepend(str(helpers))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    yield work
    assert not hasattr(sys, "ss_canary") and not (work / "pwned").exists(), "a name's text ran as code"


def assert_runs(prog: ss.Program, file: str, capsys: pytest.CaptureFixture[str], string: str = STRING) -> None:
    """The program computes what PyTorch does, prints its string as written, and maps its errors
    to its .ss lines, in a file of that name."""
    m = prog.Lin.init(seed=0)
    x = torch.randn(2, 3)
    assert torch.allclose(prog.f(m, {"x": x}), (x @ m.w) * 2)
    with pytest.raises(ValueError, match="broken on purpose") as info:
        prog.g(torch.ones(2, 3))
    assert [(fn, span.file, span.line) for fn, span in prog.locate(info.value)] == [("g", file, 14), ("broken", file, 10)]
    capsys.readouterr()
    prog.hello()
    assert capsys.readouterr().out == string + "\n"
    assert prog.namespace["SS_FILE"] == file


@pytest.mark.parametrize("name", HOSTILE + ["x\x00\n" + PAYLOAD], ids=[f"name{k}" for k in range(len(HOSTILE) + 1)])
def test_a_hostile_program_name_runs_nothing(sandbox: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    prog = ss.load(PROGRAM.replace("STRING", STRING_CR), name=name)
    assert_runs(prog, name, capsys, STRING_CR)


def test_hostile_file_names_run_nothing_when_loaded_or_built(sandbox: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    for k, name in enumerate(HOSTILE):
        path = src / (name + ".ss")
        path.write_text(PROGRAM.replace("STRING", STRING), encoding="utf-8")
        assert_runs(ss.load(path), str(path), capsys)
        assert cli_main(["build", str(path), "-o", str(out / f"built_{k}.py")]) == 0
        assert cli_main(["build", "--standalone", str(path), "-o", str(out / f"alone_{k}.py")]) == 0
    # The real command, and every module it wrote run from its file by a fresh Python: nothing but
    # the program runs, and each module names its .ss file.
    nastiest = src / (HOSTILE[0] + ".ss")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path / "helpers")])}
    done = subprocess.run([sys.executable, "-m", "shapescript.cli", "build", str(nastiest), "-o",
                           str(out / "cli.py")], capture_output=True, text=True, cwd=sandbox, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    script = textwrap.dedent("""\
        import contextlib, io, runpy, sys, torch
        for path in sys.argv[1:]:
            module = runpy.run_path(path)
            assert torch.equal(module["twice"](torch.ones(1, 3)), torch.full((1, 3), 2.0))
            with contextlib.redirect_stdout(io.StringIO()) as out:
                module["hello"]()
            print(ascii((module["SS_FILE"], out.getvalue())))
        assert not hasattr(sys, "ss_canary")
        """)
    built = sorted(str(p) for p in out.glob("*.py"))
    done = subprocess.run([sys.executable, "-c", script, *built], capture_output=True, text=True, cwd=sandbox,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    runs = sorted(ast.literal_eval(line) for line in done.stdout.splitlines())
    assert runs == sorted([(str(src / (n + ".ss")), STRING + "\n") for n in HOSTILE] * 2
                          + [(str(nastiest), STRING + "\n")])


# ---- property tests: random names and file names ----------------------------------------------

SIMPLE = textwrap.dedent("""\
    dim D = 3

    data Ex:
        x: [D]

    model Lin:
        param w: [D D] = normal(std=0.1)

    fn f(m: Lin, batch: [b] Ex) -> [b D] = relu(batch.x @ m.w)

    fn hello():
        print("hi")
    """)


class _Blank(ast.NodeTransformer):
    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        return ast.Constant("") if isinstance(node.value, str) else node


def code_shape(source: str) -> str:
    """The module's code with every string emptied: what it runs, whatever its names say."""
    return ast.dump(_Blank().visit(ast.parse(source)))


@functools.cache
def reference() -> ss.Program:
    return ss.load(SIMPLE, name="ref.ss")
PROPERTY = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(st.text(max_size=40))  # any code point but surrogates: controls, line breaks, quotes, NUL
def test_any_program_name_gives_the_same_code(name: str) -> None:
    prog = ss.load(SIMPLE, name=name)
    assert code_shape(prog.python_source) == code_shape(reference().python_source)
    assert prog.namespace["SS_LINES"] == reference().namespace["SS_LINES"]
    assert prog.namespace["SS_FILE"] == (name or "<string>")  # an empty name is no name
    m = prog.Lin.init(seed=0)
    x = torch.randn(2, 3)
    assert torch.equal(prog.f(m, {"x": x}), torch.relu(x @ m.w))


FILE_NAMES = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"),
                     min_size=1, max_size=40).filter(lambda s: s not in (".", ".."))


@PROPERTY
@given(FILE_NAMES)
def test_any_file_name_builds_the_same_code(tmp_path_factory: pytest.TempPathFactory, name: str) -> None:
    folder = tmp_path_factory.mktemp("file-name")
    path, out = folder / name, folder / "built.py"
    path.write_text(SIMPLE)
    assert cli_main(["build", str(path), "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert code_shape(text) == code_shape(reference().python_source)
    namespace: dict = {"__name__": "built"}
    exec(compile(text, str(out), "exec"), namespace)
    assert namespace["SS_FILE"] == str(path) and namespace["SS_LINES"] == reference().namespace["SS_LINES"]


# ---- python and extern fns' results are checked on every target --------------------------------

RESULTS = textwrap.dedent("""\
    devices DEVICES
    dim D = 3
    extern fn narrow(x: [b D]) -> [b D] = "ss_safety_helper.narrow"
    extern fn as_int(x: [b D]) -> [b D] = "ss_safety_helper.as_int"
    extern fn square(x: [b D]) -> [b 2*b] = "ss_safety_helper.square"
    extern fn twice(x: [b D]) -> [b D] = "ss_safety_helper.twice"
    fn f(x: [b D]) -> [b D] = narrow(x)
    fn g(x: [b D]) -> [b D] = as_int(x)
    fn h(x: [b D]) -> [b 2*b] = square(x)
    fn ok(x: [b D]) -> [b D] = twice(x)
    """)

# What each wrong result raises, on every target (the batch's size aside).
WRONG = {
    "f": r"`result` of `narrow` \(res\.ss:3:1\): expected \[b D\] with D = 3, got shape \[\d+, 2\]; dim 1 is 2, not D = 3",
    "g": r"`result` of `as_int` \(res\.ss:4:1\): expected dtype f32, got i64",
    "h": r"`result` of `square` \(res\.ss:5:1\): expected \[b 2\*b\], got shape \[\d+, \d+\]; dim 1 is \d+, not 2\*b = \d+",
}


def result_checks(devices: str) -> str:
    return RESULTS.replace("DEVICES", devices)


@pytest.mark.parametrize("devices", ["cpu", "cpu[0 1]"])
def test_a_wrong_result_is_a_shape_error_on_one_device_and_on_the_workers(sandbox: Path, devices: str) -> None:
    prog = ss.load(result_checks(devices), name="res.ss")
    try:
        x = torch.ones(4, 3)
        assert torch.equal(prog.ok(x), x * 2)
        for fn, message in WRONG.items():
            with pytest.raises(ss.ShapeError, match=message) as info:
                getattr(prog, fn)(x)
            if devices != "cpu":  # raised by the check on a worker
                assert "worker 0's traceback" in "\n".join(info.value.__notes__)
    finally:
        prog.stop()


def test_the_standalone_runtime_defines_each_name_once() -> None:
    """A standalone build runs the runtime's modules in one namespace: a name two of them define
    (as `_plain` in sinks.py and calls.py once) would silently be the later one's in both."""
    defined: dict[str, str] = {}
    clashes = []
    for rel in STANDALONE_MODULES:
        for node in ast.parse((ROOT / "shapescript" / rel).read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name) and t.id != "__all__"]
            else:
                continue
            clashes += [f"{name}: {defined[name]} and {rel}" for name in names if defined.get(name, rel) != rel]
            defined.update((name, rel) for name in names)
    assert clashes == []


def test_a_wrong_result_is_a_shape_error_in_a_standalone_build(sandbox: Path, tmp_path: Path) -> None:
    path = tmp_path / "res_standalone.py"
    path.write_text(python_module(compile_program(result_checks("cpu"), "res.ss"), standalone=True))
    spec = importlib.util.spec_from_file_location("res_standalone", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        x = torch.ones(4, 3)
        assert torch.equal(module.ok(x), x * 2)
        for fn, message in WRONG.items():
            with pytest.raises(module._rt.ShapeError, match=message):
                getattr(module, fn)(x)
    finally:
        sys.modules.pop("res_standalone._rt", None)
