"""Every bad input is a clear error that names what is wrong and where, never a traceback from our
internals: recursion, bad dims, what `load` is given, unreadable files, folders, sizes beyond the
memory, timeouts, CUDA with no GPU, meta and sparse tensors; and on the command line, one line and a
non-zero exit for each."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import ROOT

import shapescript as ss
from shapescript import cli
from shapescript.api import parse_devices
from shapescript.errors import CompileError, DeviceError, ShapeError
from shapescript.parallel import pool as pool_mod
from shapescript.parallel.pool import WorkerPool, collective_timeout, current_collective_timeout
from shapescript.pipeline import check_source
from shapescript.runtime import model as model_mod

DOUBLE = "dim D = 4\n\nfn f(x: [n D]) -> [n D] = x * 2\n"  # `x` is declared at 3:6
OPEN_DIM = "dim D\n\nfn f(x: [n D]) -> [n D] = x * 2\n"
MODEL = "dim D = 4\n\nmodel M:\n    param w: [D D] = normal(std=0.1)\n"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The command line in this process: an exception escaping main() fails the test, as a traceback
    would show in a shell."""
    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line_error(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# -- 1. recursion ----------------------------------------------------------------------------------

def test_a_function_calling_itself_is_e0405_at_the_call() -> None:
    with pytest.raises(CompileError) as info:
        check_source("fn f(x: [n]) -> [n] = f(x)\n", "rec.ss")
    (d,) = info.value.diagnostics
    assert d.code == "E0405" and "`f` calls itself" in d.message
    assert (d.span.line, d.span.col, d.span.end_col) == (1, 23, 27)  # `f(x)`
    assert any("recursion" in h for h in d.help)


def test_mutual_recursion_points_at_the_call_that_closes_the_cycle() -> None:
    source = "fn f(x: [n]) -> [n] = g(x) * 2\n\nfn g(x: [n]) -> [n] = f(x) + 1\n"
    with pytest.raises(CompileError) as info:
        ss.load(source, name="rec.ss")
    (d,) = info.value.diagnostics
    assert d.code == "E0405" and (d.span.file, d.span.line, d.span.col) == ("rec.ss", 3, 23)
    assert "the cycle: f -> g -> f" in d.help


def test_recursion_through_value_and_grad_and_on_the_command_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "rec.ss"
    path.write_text("dim D = 4\n\nmodel M:\n    param w: [D] = zeros()\n\n"
                    "fn loss(m: M, x: [b D]) -> []:\n    l, g = value_and_grad(loss, m, x)\n    return l\n")
    code, out, err = run_cli(capsys, "check", str(path))
    assert code == 1 and out == ""
    assert "error[E0405]: `loss` calls itself" in err and f"{path}:7:12" in err and "Traceback" not in err


# -- 2, 3. dims ------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [1.5, True, "3", torch.tensor(3), None])
def test_a_dim_size_that_is_not_an_int_is_a_type_error(size: object) -> None:
    with pytest.raises(TypeError, match=r"dims: the size of `D` must be a whole number \(an int\), not "):
        ss.load(OPEN_DIM, dims={"D": size})


@pytest.mark.parametrize("size", [0, -3])
def test_a_dim_size_that_is_not_positive_is_a_value_error(size: int) -> None:
    with pytest.raises(ValueError, match=f"dims: the size of `D` must be positive, not {size}"):
        ss.load(OPEN_DIM, dims={"D": size})


def test_dims_take_a_dict_of_names_and_any_integral_size() -> None:
    with pytest.raises(TypeError, match="dims is a dict"):
        ss.load(OPEN_DIM, dims=[("D", 3)])
    with pytest.raises(TypeError, match="a dim's name is a str"):
        ss.load(OPEN_DIM, dims={4: 3})
    import numpy as np
    prog = ss.load(OPEN_DIM, dims={"D": np.int64(3)})
    assert prog.checked.dim_values == {"D": 3} and type(prog.checked.dim_values["D"]) is int
    assert torch.equal(prog.f(torch.ones(2, 3)), torch.full((2, 3), 2.0))


def test_a_size_replacing_a_declared_one_is_used_and_said(recwarn) -> None:
    prog = ss.load("dim D = 784\ndim C = 10\n\nfn f(x: [n D]) -> [n D] = x * 2\n", dims={"D": 10, "C": 10},
                   name="mlp.ss")
    (warning,) = recwarn.list  # C = 10 is the program's own size: nothing to say
    assert issubclass(warning.category, UserWarning)
    assert str(warning.message) == ("mlp.ss: sizes given when loading replace the program's: "
                                    "D = 10 (declared 784 at line 1)")
    assert warning.filename == __file__  # it points at the caller's load
    assert prog.f(torch.ones(1, 10)).shape == (1, 10)
    with pytest.raises(CompileError, match="no dim `Q` to set"):
        ss.load(DOUBLE, dims={"Q": 10})


def test_bad_dims_on_the_command_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "p.ss"
    path.write_text(OPEN_DIM)
    for command in (["check"], ["build"], ["comms"], ["run"]):
        for bad in ("D=1.5", "D=0", "D=-2", "D=three", "D"):
            args = [*command, str(path), *(["f"] if command == ["run"] else []), "--dim", bad]
            code, _, err = run_cli(capsys, *args)
            assert code == 1 and f"--dim takes NAME=SIZE with a positive whole SIZE, as V=65, not '{bad}'" in \
                one_line_error(err)
    code, _, err = run_cli(capsys, "check", str(path), "--dim", "D=3", "--dim", "D=4")
    assert code == 1 and one_line_error(err) == "error: --dim D is given twice"
    path.write_text(DOUBLE)
    code, out, err = run_cli(capsys, "check", str(path), "--dim", "D=10")
    assert code == 0 and "ok" in out
    assert err == f"warning: {path}: sizes given when loading replace the program's: D = 10 (declared 4 at line 1)\n"


# -- 4. what load takes ----------------------------------------------------------------------------

@pytest.mark.parametrize("value, kind", [(None, "NoneType"), (b"dim D = 4\n", "bytes"), (42, "int"),
                                         (["dim D = 4\n"], "list")])
def test_load_takes_a_path_or_text(value: object, kind: str) -> None:
    with pytest.raises(TypeError, match=f"load takes a path .* or a program's text \\(a str\\), not {kind}"):
        ss.load(value)


def test_bytes_get_a_hint_and_devices_and_name_are_typed() -> None:
    with pytest.raises(TypeError, match=r"decode it first"):
        ss.load(b"dim D = 4\n")
    with pytest.raises(TypeError, match="devices is a str"):
        ss.load(DOUBLE, devices=2)
    with pytest.raises(TypeError, match="name is the program's name"):
        ss.load(DOUBLE, name=7)


# -- 5. files that aren't UTF-8 text ---------------------------------------------------------------

@pytest.mark.parametrize("data, message, place", [
    (b"dim D = 4\n\xff\xfe rest", "byte 0xff is not UTF-8 text", (2, 1)),
    (b"dim D = 4  # \xc3\xa9t\xc3\xa9 \xe9\n", "byte 0xe9 is not UTF-8 text", (1, 18)),  # columns in characters
    (b"\xef\xbb\xbfdim D = 4\n\x80", "byte 0x80 is not UTF-8 text", (2, 1)),  # after a byte-order mark
    (b"\xef\xbb\xbfdim \x80", "byte 0x80 is not UTF-8 text", (1, 5)),  # which takes no column
    (b"dim D = 4\x00\n", "a NUL byte (0x00)", (1, 10)),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00", "a NUL byte (0x00)", (1, 8)),
])
def test_a_binary_file_names_the_file_the_byte_and_its_place(tmp_path: Path, capsys, data: bytes, message: str,
                                                             place: tuple[int, int]) -> None:
    path = tmp_path / "mlp.ss"
    path.write_bytes(data)
    with pytest.raises(CompileError) as info:
        ss.load(path)
    (d,) = info.value.diagnostics
    assert d.code == "E0101" and d.message.startswith(message)
    assert (d.span.file, d.span.line, d.span.col) == (str(path), *place)
    code, _, err = run_cli(capsys, "check", str(path))
    assert code == 1 and f"error[E0101]: {message}" in err and f"--> {path}:{place[0]}:{place[1]}" in err
    assert "Traceback" not in err


def test_a_byte_order_mark_is_skipped(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bom.ss"
    path.write_bytes(b"\xef\xbb\xbf" + DOUBLE.encode())
    prog = ss.load(path)
    assert torch.equal(prog.f(torch.ones(2, 4)), torch.full((2, 4), 2.0))
    assert prog.f.info.params[0].node.span.col == 6  # columns count from the first character after it
    assert ss.load("\ufeff" + DOUBLE).devices.count == 1  # text read with open() keeps the mark
    code, out, _ = run_cli(capsys, "check", str(path))
    assert code == 0 and "ok (1 function, 0 models" in out


# -- 6. folders and missing files ------------------------------------------------------------------

def test_a_folder_given_as_a_program(tmp_path: Path) -> None:
    folder = tmp_path / "mlp.ss"
    folder.mkdir()
    for given in (folder, str(folder)):
        with pytest.raises(IsADirectoryError, match="a folder, not a .ss file") as info:
            ss.load(given)
        assert info.value.filename == str(folder)
    with pytest.raises(FileNotFoundError) as missing:
        ss.load(tmp_path / "nope.ss")
    assert missing.value.filename == str(tmp_path / "nope.ss")


@pytest.mark.parametrize("command", [["check"], ["build"], ["run", "{}", "f"], ["comms"]])
def test_each_command_refuses_a_folder_or_a_missing_file_in_one_line(tmp_path: Path, capsys,
                                                                     command: list[str]) -> None:
    folder = tmp_path / "mlp.ss"
    folder.mkdir()
    for target, wanted in ((folder, f"error: {folder}: a folder, not a .ss file"),
                           (tmp_path / "nope.ss", f"error: no such file: {tmp_path / 'nope.ss'}")):
        args = [command[0], str(target), *command[2:]]
        code, out, err = run_cli(capsys, *args)
        assert code == 2 and out == "" and one_line_error(err) == wanted


def test_build_refuses_a_folder_as_its_output_and_leaves_nothing(tmp_path: Path, capsys) -> None:
    (tmp_path / "p.ss").write_text(DOUBLE)
    (tmp_path / "out.py").mkdir()
    code, _, err = run_cli(capsys, "build", str(tmp_path / "p.ss"), "-o", str(tmp_path / "out.py"))
    assert code == 2 and one_line_error(err) == f"error: {tmp_path / 'out.py'}: a folder, not a .py file to write"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.py", "p.ss"]


def test_save_and_restore_refuse_a_folder_and_leave_nothing(tmp_path: Path) -> None:
    m = ss.load(MODEL).M.init(seed=0)
    folder = tmp_path / "ckpt.safetensors"
    folder.mkdir()
    for op, call in (("save", ss.save), ("restore", ss.restore)):
        with pytest.raises(IsADirectoryError, match=f"{op}: .* is a folder, not a checkpoint file") as info:
            call(folder, m)
        assert info.value.filename == str(folder)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.safetensors"] and not any(folder.iterdir())
    with pytest.raises(TypeError, match="save: a checkpoint's path is a str or os.PathLike, not NoneType"):
        ss.save(None, m)


# -- 7. sizes beyond the memory --------------------------------------------------------------------

def test_a_model_bigger_than_any_memory_is_refused_at_init_with_its_size() -> None:
    prog = ss.load("dim D = 10000000000\n\nmodel Mlp:\n    param w1: [D D] = normal(std=0.1)\n", name="big.ss")
    with pytest.raises(DeviceError, match=r"Mlp.init: the model needs 400 EB, more than the .* memory; its "
                                          r"biggest member `w1` is \[10000000000, 10000000000\] f32, 400 EB "
                                          r"\(declared at big.ss:4:5\)"):
        prog.Mlp.init(seed=0)


def test_the_size_counts_every_model_of_a_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_mod, "_memory_bytes", lambda device: (10**10, "available (test)"))
    prog = ss.load("dim D = 1000\ndim L = 100\n\nmodel B:\n    param w: [D D] = normal(std=0.1)\n"
                   "    buffer s: [D] f64 = ones()\n\nmodel M:\n    blocks: [L] B\n", name="stack.ss")
    # 100 blocks of 1000*1000 f32 and 1000 f64: 400.8 MB, under 10 GB
    assert len(prog.M.init(seed=0).params()) == 100
    monkeypatch.setattr(model_mod, "_memory_bytes", lambda device: (4 * 10**8, "available (test)"))
    with pytest.raises(DeviceError, match=r"needs 401 MB, more than the 400 MB available \(test\); its biggest "
                                          r"member `blocks.0.w` is \[1000, 1000\] f32, 4 MB"):
        prog.M.init(seed=0)


def test_a_model_too_big_for_the_workers_raises_the_same_in_the_controller() -> None:
    prog = ss.load("dim D = 10000000000\n\nmodel Mlp:\n    param w1: [D D] = normal(std=0.1)\n",
                   devices="cpu[0 1]", name="big.ss")
    try:
        with pytest.raises(DeviceError, match=r"Mlp.init: the model needs 400 EB"):
            prog.Mlp.init(seed=0)
    finally:
        prog.stop()


# -- 8. collective timeouts ------------------------------------------------------------------------

TIMEOUT_RANGE = r"must be a positive number of seconds, at most 604800 \(7 days\)"


@pytest.mark.parametrize("seconds", [math.inf, math.nan, -math.inf, 1e300, pool_mod.MAX_TIMEOUT * 2, True, "60", 0])
def test_a_timeout_that_is_not_a_finite_span_is_refused(seconds: object) -> None:
    with pytest.raises(ValueError, match=TIMEOUT_RANGE):
        collective_timeout(seconds)
    with pytest.raises(ValueError, match=TIMEOUT_RANGE):
        WorkerPool(parse_devices("cpu[0 1]"), timeout=seconds)


@pytest.mark.parametrize("text", ["inf", "nan", "-inf", "1e300", "1209600", "0", "soon"])
def test_a_timeout_in_the_environment_that_is_not_a_finite_span_is_refused(text: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pool_mod.TIMEOUT_ENV, text)
    with pytest.raises(ValueError, match=r"\$SHAPESCRIPT_COLLECTIVE_TIMEOUT " + TIMEOUT_RANGE):
        current_collective_timeout()


def test_the_longest_timeout_starts_workers() -> None:
    collective_timeout(pool_mod.MAX_TIMEOUT)
    try:
        with WorkerPool(parse_devices("cpu[0 1]")) as pool:
            pool.start()
            assert pool.timeout == pool_mod.MAX_TIMEOUT and pool.alive
    finally:
        collective_timeout(None)


# -- 9. CUDA with no GPU ---------------------------------------------------------------------------

@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def test_cuda_with_no_gpu_loads_but_says_so_at_the_first_use(no_gpu: None) -> None:
    prog = ss.load(DOUBLE + MODEL.removeprefix("dim D = 4\n"), devices="cuda", name="p.ss")  # reading it is fine
    with pytest.raises(DeviceError, match=r"`f` on cuda: no CUDA device is visible.*devices=\"cpu\""):
        prog.f(torch.ones(2, 4))
    with pytest.raises(DeviceError, match=r"M.init on cuda:0: no CUDA device is visible"):
        prog.M.init(seed=0)


def test_cuda_on_several_devices_with_no_gpu_starts_no_worker(no_gpu: None) -> None:
    prog = ss.load(DOUBLE + MODEL.removeprefix("dim D = 4\n"), devices="cuda[0 1]", name="p.ss")
    try:
        with pytest.raises(DeviceError, match=r"the workers on cuda\[0 1\]: no CUDA device is visible.*"
                                              r"devices=\"cpu\[0 1\]\""):
            prog.M.init(seed=0)
        assert prog.pool is None
        with pytest.raises(DeviceError, match=r"`f` on cuda\[0 1\]: no CUDA"):
            prog.f(torch.ones(2, 4))
    finally:
        prog.stop()


CONTROLLER_ONLY = """dim D = 4

fn double(x: [n D]) -> [n D] = x * 2.0

fn count(k: int) -> int:
    total = 0
    for i in range(k):
        print(i)
        total = total + i
    return total

fn log_steps(k: int, log: Sink):
    for i in range(k):
        write(log, logs(step=i))

fn doubled(x: [n D], k: int) -> [n D]:
    print(k)
    return double(x)
"""


@pytest.mark.parametrize("devices", ["cuda[0 1]", "cuda"])
def test_a_function_that_never_touches_the_devices_runs_without_them(devices: str, no_gpu: None, capsys) -> None:
    """Only device work needs the devices (issue 44): a function in the controller that loops, prints
    and writes numbers to a sink runs on a machine with no GPU; one on the devices still raises, and
    so does one in the controller that calls it, once it does (on one device, at its call: it holds
    tensors, which live on the device)."""
    prog = ss.load(CONTROLLER_ONLY, devices=devices, name="p.ss")
    try:
        assert prog.count(3) == 3 and capsys.readouterr().out == "0\n1\n2\n"
        log = ss.sinks.memory()
        prog.log_steps(2, log)
        assert [r["step"] for r in log.records] == [0, 1]
        with pytest.raises(DeviceError, match=rf"`double` on {re.escape(devices)}: no CUDA device is visible"):
            prog.double(torch.ones(2, 4))
        where = "the workers" if devices != "cuda" else "`doubled`"
        with pytest.raises(DeviceError, match=rf"{where} on {re.escape(devices)}: no CUDA device is visible"):
            prog.doubled(torch.ones(2, 4), 7)
        assert capsys.readouterr().out == ("7\n" if devices != "cuda" else "")  # it ran until it reached the devices
        assert prog.pool is None  # no worker started
    finally:
        prog.stop()


def test_more_cuda_devices_than_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    prog = ss.load(DOUBLE, devices="cuda[0 1 2]")
    with pytest.raises(DeviceError, match=r"on cuda\[0 1 2\]: only 1 CUDA device is visible \(cuda\[0\]\)"):
        prog.f(torch.ones(2, 4))


def test_cuda_with_no_gpu_on_the_command_line(tmp_path: Path, capsys, no_gpu: None) -> None:
    path = tmp_path / "main.ss"
    path.write_text('fn main():\n    print("hello")\n')
    for devices in ("cuda", "cuda[0 1]"):  # a main that only prints never touches the devices
        code, out, err = run_cli(capsys, "run", str(path), "main", "--devices", devices)
        assert (code, out, err) == (0, "hello\n", "")
    # One that calls a function on them: on one device it holds tensors, and its call needs the device;
    # on several it runs in the controller until it first calls the workers.
    path.write_text('fn half(x: []) -> [] = x * 0.5\n\nfn main():\n    print("hello")\n    print(half(to(2.0, f32)))\n')
    for devices, printed in (("cuda", ""), ("cuda[0 1]", "hello\n")):
        code, out, err = run_cli(capsys, "run", str(path), "main", "--devices", devices)
        assert code == 1 and out == printed and "no CUDA device is visible" in one_line_error(err)
    code, _, err = run_cli(capsys, "run", str(path), "main", "--devices", "gpu")
    assert code == 1 and "devices must be written as in a program" in one_line_error(err)


# -- 10. meta and sparse tensors -------------------------------------------------------------------

UNUSABLE = {"meta": (lambda: torch.empty(3, 4, device="meta"), "a meta tensor, which has a shape but no values"),
            "sparse": (lambda: torch.eye(4)[:3].to_sparse(), "a sparse_coo tensor; pass it as .to_dense()"),
            "csr": (lambda: torch.eye(4)[:3].to_sparse_csr(), "a sparse_csr tensor")}


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("devices", ["cpu", "cpu[0 1]"])
@pytest.mark.parametrize("kind", sorted(UNUSABLE))
def test_a_meta_or_sparse_argument_names_the_parameter(devices: str, kind: str) -> None:
    make, why = UNUSABLE[kind]
    prog = ss.load(DOUBLE, devices=devices, name="p.ss")
    try:
        with pytest.raises(ShapeError, match=f"`x` of `f` \\(p.ss:3:6\\) must be a tensor with its values, but it "
                                             f"is {why.replace('(', '[(]').replace(')', '[)]')}"):
            prog.f(make())
        assert prog.pool is None  # refused before anything reaches a worker
    finally:
        prog.stop()


def test_a_meta_field_of_a_batch_names_the_field() -> None:
    prog = ss.load("dim D = 4\n\ndata Ex:\n    x: [D]\n\nfn total(batch: [b] Ex) -> [] = sum(batch.x)\n",
                   name="p.ss")
    with pytest.raises(ShapeError, match=r"`x`.*a meta tensor, which has a shape but no values.*p.ss:4:5"):
        prog.total({"x": torch.empty(3, 4, device="meta")})


# -- 11. python -m shapescript ---------------------------------------------------------------------

def test_python_dash_m_shapescript_is_the_command_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    usage = subprocess.run([sys.executable, "-m", "shapescript", "--help"], capture_output=True, text=True,
                           cwd=tmp_path, env=env)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: shapescript ")
    for command in ("check", "build", "run", "comms", "explain", "lsp"):
        assert command in usage.stdout
    (tmp_path / "p.ss").write_text(DOUBLE)
    ok = subprocess.run([sys.executable, "-m", "shapescript", "check", "p.ss"], capture_output=True, text=True,
                        cwd=tmp_path, env=env)
    assert ok.returncode == 0 and ok.stdout == "p.ss: ok (1 function, 0 models, on cpu)\n"
    (tmp_path / "dir.ss").mkdir()
    bad = subprocess.run([sys.executable, "-m", "shapescript", "run", "dir.ss", "f"], capture_output=True, text=True,
                         cwd=tmp_path, env=env)
    assert bad.returncode == 2 and bad.stderr == "error: dir.ss: a folder, not a .ss file\n"


def test_topk_along_a_generic_axis_with_too_few_entries_is_a_shape_error() -> None:
    """The checker proves k fits a sized axis; a generic one is checked as the program runs."""
    prog = ss.load("fn f(x: [n]) -> [3]:\n    v, i = topk(x, 3, over=n)\n    return v\n", name="topk.ss")
    x = torch.tensor([1.0, 5.0, 3.0, 4.0])
    assert torch.equal(prog.f(x), torch.topk(x, 3).values)
    with pytest.raises(ss.ShapeError, match=r"topk\.ss:2:12: `topk` takes the 3 largest entries along n, which has only 2"):
        prog.f(torch.tensor([1.0, 5.0]))
