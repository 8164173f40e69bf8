"""`precision f64`: the dtype of every tensor type written without one (data fields, params, parameters,
results) and of one_hot's floats, so a program in f64 or bf16 needn't write its dtype into every type;
a dtype written stays. Checked against PyTorch in f64, and the codes of each misuse."""

from __future__ import annotations

import pytest
import torch

import shapescript as ss
from shapescript.errors import CompileError

PROGRAM = """\
precision {dtype}
dim D = 3
dim C = 4

data Row:
    x: [D]
    y: [] Index[C]

model Lin:
    param w: [D C] = normal(std=0.5)
    param kept: [C] f32 = ones()

fn loss(m: Lin, batch: [b] Row) -> [] = mean(sum((batch.x @ m.w - one_hot(batch.y)) ** 2, over=C))

fn step(mut m: Lin, mut opt: Sgd[Lin], batch: [b] Row) -> []:
    l, g = value_and_grad(loss, m, batch)
    update(mut m, mut opt, g)
    return l
"""


def rows(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(5, 3, generator=g, dtype=torch.float64).to(dtype), "y": torch.tensor([0, 1, 2, 3, 0])}


def test_f64_throughout_and_torchs_values() -> None:
    prog = ss.load(PROGRAM.format(dtype="f64"), name="f64.ss")
    assert prog.checked.fns["loss"].ret.show() == "[] f64"
    m = prog.Lin.init(seed=0)
    assert m.w.dtype == torch.float64 and m.kept.dtype == torch.float32  # a written dtype stays
    batch = rows(torch.float64)
    w = m.w.clone().requires_grad_(True)
    expected = ((batch["x"] @ w - torch.nn.functional.one_hot(batch["y"], 4).double()) ** 2).sum(1).mean()
    expected.backward()
    assert w.grad is not None
    loss = prog.step(m, ss.sgd(m, lr=0.1), batch)
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, expected.detach(), atol=1e-14, rtol=0)
    torch.testing.assert_close(m.w, (w - 0.1 * w.grad).detach(), atol=1e-14, rtol=0)


def test_bf16_params_and_data() -> None:
    prog = ss.load(PROGRAM.format(dtype="bf16"), name="bf16.ss")
    m = prog.Lin.init(seed=0)
    assert m.w.dtype == torch.bfloat16
    assert prog.loss(m, rows(torch.bfloat16)).dtype == torch.bfloat16
    with pytest.raises(ss.ShapeError, match="expected dtype bf16, got f64"):
        prog.loss(m, rows(torch.float64))


@pytest.mark.parametrize("head, code, words", [
    ("precision i64\n", "E0204", "`precision` is a float dtype, not `i64`"),
    ("precision f46\n", "E0204", "not `f46`"),
    ("precision f64\nprecision f32\n", "E0202", "a second `precision` line"),
    ("precision\n", "E0105", "expected a float dtype"),
])
def test_each_misuse_has_its_code(head: str, code: str, words: str) -> None:
    with pytest.raises(CompileError) as info:
        ss.load(head + "dim D = 2\nfn f(x: [D]) -> [D] = x\n", name="p.ss")
    found = [(d.code, d.message) for d in info.value.diagnostics]
    assert [c for c, _ in found] == [code] and words in found[0][1], found
