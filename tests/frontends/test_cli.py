"""The command line: check, build (and --standalone), run, explain."""

from __future__ import annotations

import os
import resource
import signal
import stat
import subprocess
import sys
import textwrap

import pytest
from programs import README, README_FILE
from support import cli

BLOCK_SHAPESCRIPT = textwrap.dedent("""\
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "shapescript":
                raise ImportError("a standalone module must not import shapescript")
    sys.meta_path.insert(0, Block())
    """)


def test_check_ok_and_with_errors(tmp_path) -> None:
    ok = cli("check", str(README_FILE))
    assert ok.returncode == 0 and "ok (4 functions, 1 model, on cuda[0 1 2])" in ok.stdout
    bad = tmp_path / "bad.ss"
    bad.write_text(README.replace("relu(x @ m.w1) @ m.w2", "relu(x @ m.w1) @ m.w1"))
    out = cli("check", str(bad))
    assert out.returncode == 1 and out.stdout == ""
    assert "error[E0304]" in out.stderr and "Traceback" not in out.stderr
    assert "17 |     return relu(x @ m.w1) @ m.w1" in out.stderr
    missing = cli("check", str(tmp_path / "nope.ss"))
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_build_writes_python_that_names_ss_lines(tmp_path) -> None:
    out = tmp_path / "sub" / "mlp.py"
    res = cli("build", str(README_FILE), "-o", str(out), "--devices", "cpu")
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    compile(text, str(out), "exec")
    assert "return _rt.matmul(torch.relu(_rt.matmul(x, m._m_w1)), m._m_w2)  # " in text and "mlp.ss:17:5" in text


def test_build_never_writes_through_a_name_planted_beside_its_output(tmp_path) -> None:
    """A symlink at the name a build once wrote through (OUT.tmp) is left alone, and so is its target:
    the module goes through a temporary file of the build's own, made with the mode a new file gets."""
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file\n")
    out = tmp_path / "mlp.py"
    planted = tmp_path / "mlp.py.tmp"
    planted.symlink_to(victim)
    res = cli("build", str(README_FILE), "-o", str(out), "--devices", "cpu")
    assert res.returncode == 0, res.stderr
    assert victim.read_text() == "someone else's file\n" and planted.is_symlink()
    compile(out.read_text(), str(out), "exec")
    assert sorted(os.listdir(tmp_path)) == ["mlp.py", "mlp.py.tmp", "victim.txt"]
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask


def small_disk(size: int) -> None:
    """In the child: files can't grow past `size` bytes, and a write past it fails with EFBIG
    (SIGXFSZ ignored) as a write to a full disk fails with ENOSPC."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def test_a_build_that_cant_be_written_keeps_the_old_module_and_leaves_no_temporary_file(tmp_path) -> None:
    out = tmp_path / "mlp.py"
    out.write_text("# the old module\n")
    res = cli("build", str(README_FILE), "-o", str(out), "--devices", "cpu", preexec_fn=lambda: small_disk(1024))
    assert res.returncode == 2 and res.stderr.startswith("error: ") and "Traceback" not in res.stderr
    assert "File too large" in res.stderr
    assert out.read_text() == "# the old module\n"
    assert os.listdir(tmp_path) == ["mlp.py"]


def test_standalone_build_runs_without_shapescript(tmp_path) -> None:
    src = tmp_path / "mlp.ss"
    src.write_text(README.replace("devices cuda[0 1 2]", "devices cpu"))
    res = cli("build", "--standalone", str(src), "-o", str(tmp_path / "mlp_standalone.py"))
    assert res.returncode == 0, res.stderr
    script = BLOCK_SHAPESCRIPT + textwrap.dedent("""\
        import torch, mlp_standalone as M
        m = M._rt.Model.init(M.Mlp_spec, 0)
        opt = M._rt.adamw(m, lr=1e-3)
        g = torch.Generator().manual_seed(0)
        b = M._rt.Batch(M.Digit_spec, {"img": torch.randn(16, 784, generator=g),
                                   "label": torch.randint(0, 10, (16,), generator=g)})
        first = float(M.train_step(m, opt, b))
        for _ in range(5):
            last = float(M.train_step(m, opt, b))
        assert last < first, (first, last)
        data = M._rt.TensorDataset(img=torch.randn(100, 784, generator=g), label=torch.randint(0, 10, (100,), generator=g))
        sink = M._rt.memory()
        M.run(m, opt, data, sink)  # a loop over shuffled batches (runtime/loops.py, inlined)
        assert len(sink.records) == 2, sink.records
        assert not [k for k in sys.modules if k.startswith("shapescript")]
        print("standalone ok", first, last)
        """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert run.returncode == 0, run.stderr
    assert "standalone ok" in run.stdout


def test_standalone_build_for_several_devices_is_e1805() -> None:
    res = cli("build", "--standalone", str(README_FILE))
    assert res.returncode == 1 and "error[E1805]: a standalone build can't run on 3 devices" in res.stderr


def test_run_calls_a_function_without_arguments(tmp_path) -> None:
    src = tmp_path / "hello.ss"
    src.write_text('fn main():\n    print("hello", 1 + 2)\n')
    res = cli("run", str(src), "main")
    assert res.returncode == 0 and res.stdout == "hello 3\n", res.stderr
    res = cli("run", str(src), "nope")
    assert res.returncode == 1 and "has no function `nope`" in res.stderr


@pytest.mark.parametrize("args", [["bogus"], []])
def test_usage_errors(args) -> None:
    res = cli(*args)
    assert res.returncode == 2 and "usage:" in res.stderr


def test_comms_prints_the_table_as_text_and_as_json() -> None:
    import json

    text = cli("comms", str(README_FILE))
    assert text.returncode == 0, text.stderr
    assert "on cuda[0 1 2]: a batch of 64 splits 22/21/21" in text.stdout
    assert "203,264 × f32 = 813,056 bytes (794 KiB)" in text.stdout
    assert "inside `loss` (forward and backward): 16 bytes per call" in text.stdout
    assert "`train_step` on the workers: 813,072 bytes (794 KiB) per call" in text.stdout
    data = json.loads(cli("comms", str(README_FILE), "--json", "--devices", "cpu[0 1]", "--batch", "7").stdout)
    assert data["devices"] == "cpu[0 1]" and data["shares"] == [4, 3]
    step = next(f for f in data["functions"] if f["name"] == "train_step")
    assert step["per_call"]["bytes"] == 813_072 and step["placement"] == "workers"
    sends = {(s["what"].split(",")[0], s["count"], s["dtype"], s["times"]) for s in step["sends"]}
    assert sends == {("the gradients of `Mlp`'s params `w1` and `w2`", 203_264, "f32", 1),
                     ("cross_entropy's sum and count", 2, "f32", 2)}
    bad = cli("comms", str(README_FILE), "--batch", "0")
    assert bad.returncode == 1 and "--batch takes a positive number" in bad.stderr


@pytest.mark.parametrize("source, counts", [
    ("dim D = 4\n\nfn f(x: [n D]) -> [n D] = x * 2\n", "1 function, 0 models"),
    ("dim D = 4\n\nmodel M:\n    param w: [D D] = zeros()\n\nfn f(m: M, x: [n D]) -> [n D] = x @ m.w\n"
     "fn g(x: [n D]) -> [n D] = x\n", "2 functions, 1 model"),
    ("dim D = 4\n\nmodel M:\n    param w: [D] = zeros()\n\nmodel N:\n    param w: [D] = zeros()\n", "0 functions, 2 models"),
])
def test_check_counts_in_words_that_agree(tmp_path, capsys, source: str, counts: str) -> None:
    from shapescript import cli as cli_module

    path = tmp_path / "p.ss"
    path.write_text(source)
    assert cli_module.main(["check", str(path), "--devices", "cpu"]) == 0
    assert capsys.readouterr().out == f"{path}: ok ({counts}, on cpu)\n"
    if "fn f(x" in source:
        assert cli_module.main(["run", str(path), "f", "--devices", "cpu"]) == 1
        assert "error: `f` takes 1 argument; `run` calls functions that take none" in capsys.readouterr().err
