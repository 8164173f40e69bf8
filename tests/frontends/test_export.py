"""`ss.export` and `shapescript export`: a program's function with its model baked in, as ONNX (run by
onnxruntime) and as torch.export's ExportedProgram, equal to the program within 1e-5 on the README's
MLP, the attention example and nanoGPT's forward, at batch sizes (and nanoGPT's lengths) other than
the example's: the generic dims are dynamic."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from support import ROOT

import shapescript as ss
from shapescript.exporting import export

pytestmark = pytest.mark.slow

# (program, dims, model type, function, its arguments after the model, inputs to compare on)
CASES = {
    "mlp": ("examples/readme/mlp.ss", {}, "Mlp", "forward", (None,), lambda: (torch.randn(9, 784),)),
    "attention": ("examples/attention/gpt.ss", {"V": 17, "T": 8, "D": 16, "H": 2, "Dh": 8, "F": 32, "L": 2}, "Gpt",
                  "logits", (None, ss.Eval), lambda: (torch.randint(0, 17, (3, 8)),)),
    "nanogpt": ("examples/nanogpt/gpt.ss", {"V": 17, "T": 8, "H": 2, "Dh": 8, "L": 2}, "Gpt", "logits",
                (None, ss.Eval), lambda: (torch.randint(0, 17, (3, 5)),)),
}


def loaded(case: str) -> tuple[Any, Any, Any, tuple[Any, ...], tuple[torch.Tensor, ...]]:
    path, dims, model, fn, rest, inputs = CASES[case]
    prog = ss.load(ROOT / path, devices="cpu", dims=dims)
    m = getattr(prog, model).init(seed=0)
    torch.manual_seed(1)
    return prog, m, getattr(prog, fn), rest, inputs()


def called(fn: Any, m: Any, rest: tuple[Any, ...], inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    given = iter(inputs)
    return fn(m, *[next(given) if r is None else r for r in rest])


@pytest.mark.parametrize("case", sorted(CASES))
def test_onnx_runs_in_onnxruntime_as_the_program(case: str, tmp_path: Path) -> None:
    prog, m, fn, rest, inputs = loaded(case)
    export(fn, m, *rest, path=tmp_path / "model.onnx")
    session = ort.InferenceSession(str(tmp_path / "model.onnx"))
    names = [i.name for i in session.get_inputs()]
    assert names == [p.name for p, r in zip(fn.info.params[1:], rest) if r is None]
    assert session.get_inputs()[0].shape[0] == "b"  # the batch axis is dynamic, by its name
    got = session.run(None, {n: t.numpy() for n, t in zip(names, inputs)})[0]
    want = called(fn, m, rest, inputs)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", sorted(CASES))
def test_torch_export_gives_the_programs_values(case: str, tmp_path: Path) -> None:
    prog, m, fn, rest, inputs = loaded(case)
    exported = export(fn, m, *rest, path=tmp_path / "model.pt2", format="torch")
    again = torch.export.load(str(tmp_path / "model.pt2"))
    want = called(fn, m, rest, inputs)
    for ep in (exported, again):
        torch.testing.assert_close(ep.module()(*inputs), want, atol=1e-5, rtol=1e-5)


def test_what_an_export_cant_take_is_said() -> None:
    prog = ss.load(ROOT / "examples/readme/mlp.ss", devices="cpu")
    m = prog.Mlp.init(seed=0)
    with pytest.raises(ss.ShapeError, match="`batch` of `loss`.*export a function of tensors"):
        export(prog.loss, m, None)
    with pytest.raises(TypeError, match="`m` of `forward` is a model"):
        export(prog.forward, None, None)
    with pytest.raises(ss.ShapeError, match=r"`x` of `forward`.*dim 1 is 5"):
        export(prog.forward, m, torch.zeros(2, 5))
    several = ss.load(ROOT / "examples/readme/mlp.ss", devices="cpu[0 1]")
    try:
        with pytest.raises(ss.ShapeError, match="load the program on one device"):
            export(several.forward, several.Mlp.init(seed=0), None)
    finally:
        several.stop()


def test_the_command_line_writes_the_model_from_a_checkpoint(tmp_path: Path) -> None:
    prog = ss.load(ROOT / "examples/readme/mlp.ss", devices="cpu")
    m = prog.Mlp.init(seed=3)
    ss.save(tmp_path / "mlp.safetensors", m)
    scratch = tmp_path / "tmp"  # torch's own caches (inductor's, the exporter's) go here, not in the tests' folder
    scratch.mkdir()
    out = subprocess.run([sys.executable, "-m", "shapescript", "export", str(ROOT / "examples/readme/mlp.ss"),
                          "forward", "-o", str(tmp_path / "mlp.onnx"), "--checkpoint", str(tmp_path / "mlp.safetensors")],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(scratch)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("wrote ") and not out.stderr
    x = torch.randn(4, 784)
    got = ort.InferenceSession(str(tmp_path / "mlp.onnx")).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, prog.forward(m, x).numpy(), atol=1e-5, rtol=1e-5)
