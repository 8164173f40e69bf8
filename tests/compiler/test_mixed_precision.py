"""`precision mixed bf16` (issue 41): the params, the optimizer's state and every type written without
a dtype stay f32, each function on the devices runs under torch.autocast in bf16, and its results leave
in their written dtypes. Checked here on one device (the CPU, where bf16 autocast runs):

- the compute dtype the compiler gives each op (plan/precision.py, from the op table's `autocast`)
  is the dtype torch.autocast gives the op's lowering, run under autocast on the CPU;
- the README MLP trains as a hand-written PyTorch loop under torch.autocast does;
- f16 scales the loss and skips the updates that overflow, as torch.amp.GradScaler does;
- f32 and f64 are refused (E0208), and results from Python are in their written dtypes.
tests/several/test_mixed_precision_several.py runs it on several devices."""

from __future__ import annotations

import pytest
import torch
from programs import F16_OVERFLOWING, README

import shapescript as ss
from shapescript.errors import CompileError
from shapescript.ir import nodes as N
from shapescript.lower.printer import py_name
from shapescript.pipeline import check_source
from shapescript.plan.comms import device_table
from shapescript.plan.comms_text import hover_text
from shapescript.plan.precision import ComputeDtypes

HEADER = "precision mixed bf16\n\ndim D = 8\ndim E = 4\ndim C = 3\n\n"
TORCH = {"bf16": torch.bfloat16, "f32": torch.float32}

# (the probe's signature and body, its arguments): one op each, on f32 arguments
PROBES = {
    "product": ("fn probe(x: [b D], w: [D E]) -> [b E] = x @ w", lambda: (torch.randn(5, 8), torch.randn(8, 4))),
    "einsum-like contraction": ("fn probe(x: [b D], w: [D E]) -> [b E] = relu(x @ w) * 2.0",
                                lambda: (torch.randn(5, 8), torch.randn(8, 4))),
    "sum of a product": ("fn probe(x: [b D], w: [D E]) -> [b] = sum(x @ w, over=E)",
                         lambda: (torch.randn(5, 8), torch.randn(8, 4))),
    "softmax of a product": ("fn probe(x: [b D], w: [D E]) -> [b E] = softmax(x @ w, over=E)",
                             lambda: (torch.randn(5, 8), torch.randn(8, 4))),
    "exp of a product": ("fn probe(x: [b D], w: [D E]) -> [b E] = exp(x @ w)",
                         lambda: (torch.randn(5, 8), torch.randn(8, 4))),
    "layer_norm of a product": ("fn probe(x: [b D], w: [D E]) -> [b E] = layer_norm(x @ w, over=E)",
                                lambda: (torch.randn(5, 8), torch.randn(8, 4))),
    "cross_entropy of a product": ("fn probe(x: [b D], w: [D C], y: [b] Index[C]) -> [] = "
                                   "cross_entropy(x @ w, y, over=C)",
                                   lambda: (torch.randn(5, 8), torch.randn(8, 3), torch.randint(0, 3, (5,)))),
    "a product plus an f32 tensor": ("fn probe(x: [b D], w: [D E], c: [E]) -> [b E] = x @ w + c",
                                     lambda: (torch.randn(5, 8), torch.randn(8, 4), torch.randn(4))),
    "mean of a product": ("fn probe(x: [b D], w: [D E]) -> [b] = mean(x @ w, over=E)",
                          lambda: (torch.randn(5, 8), torch.randn(8, 4))),
    "no product": ("fn probe(x: [b D]) -> [b D] = gelu(x) * x", lambda: (torch.randn(5, 8),)),
}


@pytest.mark.parametrize("probe", list(PROBES))
def test_each_ops_compute_dtype_is_what_autocast_makes_of_its_lowering(probe: str) -> None:
    source, args = PROBES[probe]
    checked = check_source(HEADER + source + "\n", "probe.ss")
    fn = checked.module.function("probe")
    (ret,) = [s for s in fn.body if isinstance(s, N.Return)]
    assert ret.value is not None
    predicted = ComputeDtypes(checked.module).of(fn, ret.value)
    prog = ss.load(HEADER + source + "\n", devices="cpu", name="probe.ss")
    body = prog.namespace[py_name("probe")].__wrapped__  # the function's own code, without the casts back
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        got = body(*args())
    assert got.dtype == TORCH[predicted], probe
    assert prog.probe(*args()).dtype == torch.float32  # from Python, in the dtype its type writes


def test_a_variable_keeps_its_compute_dtype() -> None:
    checked = check_source(HEADER + "fn probe(x: [b D], w: [D E]) -> [b E]:\n    h = x @ w\n    return relu(h)\n",
                           "probe.ss")
    fn = checked.module.function("probe")
    ret = fn.body[-1]
    assert isinstance(ret, N.Return) and ret.value is not None
    assert ComputeDtypes(checked.module).of(fn, ret.value) == "bf16"


def _readme_mixed() -> str:
    return "precision mixed bf16\n\n" + README.replace("devices cuda[0 1 2]\n", "")


def test_the_readme_mlp_trains_as_torch_autocast_does() -> None:
    """Five AdamW steps of the README MLP, against a hand-written loop with torch.autocast: the
    products in bf16, the loss in f32, f32 params and AdamW state."""
    prog = ss.load(_readme_mixed(), devices="cpu", name="mlp.ss")
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-3)
    w1, w2 = (m.w1.detach().clone().requires_grad_(), m.w2.detach().clone().requires_grad_())
    ref = torch.optim.AdamW([w1, w2], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        x, y = torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)
        loss = prog.train_step(m, opt, {"img": x, "label": y})
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ref_loss = torch.nn.functional.cross_entropy(torch.relu(x @ w1) @ w2, y)
        ref.zero_grad()
        ref_loss.backward()
        ref.step()
        assert ref_loss.dtype == torch.float32 and loss.dtype == torch.float32
        assert float(loss) == pytest.approx(float(ref_loss.detach()), abs=1e-5)
    moments = [t for state in opt.torch_opt.state.values() for t in state.values() if t.dim() > 0]
    assert m.w1.dtype == torch.float32 and len(moments) == 4 and all(t.dtype == torch.float32 for t in moments)
    torch.testing.assert_close(m.w1, w1.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(m.w2, w2.detach(), atol=1e-5, rtol=0)
    # and not as f32 does: the products' rounding shows
    plain = ss.load(README.replace("devices cuda[0 1 2]\n", ""), devices="cpu", name="mlp.ss")
    x = torch.randn(64, 784, generator=g)
    assert not torch.equal(plain.forward(m, x), prog.forward(m, x))


@pytest.mark.parametrize("line,words", [
    ("precision mixed f32", "mixed precision computes in a float narrower than the f32 it keeps, not f32"),
    ("precision mixed f64", "mixed precision computes in a float narrower than the f32 it keeps, not f64"),
])
def test_a_mixed_precision_other_than_bf16_or_f16_is_refused(line: str, words: str) -> None:
    with pytest.raises(CompileError) as e:
        check_source(f"{line}\n\nfn f(x: [n]) -> [n] = x\n", "f.ss")
    assert e.value.diagnostics[0].code == "E0208" and words in str(e.value)


def test_tf32_is_allowed_while_a_function_on_the_devices_runs(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`precision tf32`: values stay f32; while a function on the devices runs, a GPU's products may use
    TF32 (torch's flags, read by an extern fn inside the call), and the flags are put back after it."""
    (tmp_path / "tf32_probe.py").write_text(
        "import torch\n\ndef flags(x):\n"
        "    return x + float(torch.backends.cuda.matmul.allow_tf32) + 2 * float(torch.backends.cudnn.allow_tf32)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    source = ("precision tf32\n\nextern fn flags(x: [n]) -> [n] = \"tf32_probe.flags\"\n\n"
              "fn probe(x: [n]) -> [n] = flags(x) * 1.0\n")
    prog = ss.load(source, devices="cpu", name="tf32.ss")
    was = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        out = prog.probe(torch.zeros(2))
        assert out.dtype == torch.float32 and out.tolist() == [3.0, 3.0]  # both flags on inside the call
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32  # put back
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = was


def test_the_table_and_hovers_show_a_value_in_its_compute_dtype() -> None:
    source = _readme_mixed().replace("devices cpu\n", "").replace(
        "    return relu(x @ m.w1) @ m.w2", "    h = relu(x @ m.w1)\n    return h @ m.w2")
    source = "devices cpu[0 1]\n" + source
    checked = check_source(source, "mlp.ss")
    table = device_table(checked)
    h = next(v for v in table.values if v.fn == "forward" and v.name == "h")
    x = next(v for v in table.values if v.fn == "forward" and v.name == "x")
    assert (h.type, h.per_example_text) == ("[b Hd] bf16", "512 bytes")  # 256 bf16 values an example
    assert (x.type, x.per_example_text) == ("[b D]", "3,136 bytes (3.06 KiB)")  # an argument, as written: f32
    line = next(i for i, text in enumerate(source.splitlines(), 1) if text.strip().startswith("h = relu"))
    assert "bf16" in (hover_text(checked, line, 5) or "")


def test_f16_scales_the_loss_and_skips_the_steps_that_overflow_as_grad_scaler_does() -> None:
    assert "* 100.0" in F16_OVERFLOWING
    prog = ss.load(F16_OVERFLOWING, devices="cpu", name="mlp.ss")
    m = prog.Mlp.init(seed=0)
    opt = ss.adamw(m, lr=1e-3)
    w1, w2 = (m.w1.detach().clone().requires_grad_(), m.w2.detach().clone().requires_grad_())
    ref = torch.optim.AdamW([w1, w2], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    scaler = torch.amp.GradScaler("cpu")
    g = torch.Generator().manual_seed(0)
    skipped = 0
    for _ in range(12):
        x, y = torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)
        loss = prog.train_step(m, opt, {"img": x, "label": y})
        with torch.autocast("cpu", dtype=torch.float16):
            ref_loss = torch.nn.functional.cross_entropy(torch.relu(x @ w1) @ w2, y) * 100.0
        ref.zero_grad()
        scaler.scale(ref_loss).backward()
        before = scaler.get_scale()
        scaler.step(ref)
        scaler.update()
        skipped += scaler.get_scale() < before
        assert float(loss) == pytest.approx(float(ref_loss.detach()), rel=1e-6)
    assert 0 < skipped < 12  # some steps overflowed, and then they fit
    assert opt.steps == 12 - skipped  # the same steps skipped
    torch.testing.assert_close(m.w1, w1.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(m.w2, w2.detach(), atol=1e-5, rtol=0)
