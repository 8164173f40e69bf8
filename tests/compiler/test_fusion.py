"""ir/fuse.py: spans with one torch kernel (causal attention, affine layer_norm, of the built-in and
of the std library's extern fn, a shared causal mask) give what the program computes written out. The reference is the same program built without
fusion: the debug build (`check_types=True`) keeps every value the program names."""

from __future__ import annotations

import pytest
import torch
from programs import GPT, GPT_FILE
from support import ROOT

import shapescript as ss
from shapescript.pipeline import check_source, python_module

# The examples declare full-size dims; these tests load them small, on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:.*sizes given when loading replace")

NANOGPT = ROOT / "examples" / "nanogpt" / "gpt.ss"
SMALL = {"V": 11, "D": 16, "H": 2, "Dh": 8, "F": 32, "L": 2}
NANO = {"V": 11, "T": 8, "H": 2, "Dh": 8, "L": 2}


def source_of(path, dims: dict[str, int]) -> str:
    return python_module(check_source(path.read_text(), path.name, None, dims))


def test_the_attention_example_uses_torchs_kernels() -> None:
    text = source_of(GPT_FILE, SMALL)
    assert "_F.scaled_dot_product_attention(q, k, v, is_causal=True" in text
    assert "_rt.layer_norm(x, 2, m._m_gain, m._m_bias, 1e-05)" in text
    assert "torch.softmax" not in text and "masked_fill" not in text  # the written-out form is gone


def test_attention_with_dropout_keeps_its_form_but_shares_the_mask() -> None:
    text = source_of(NANOGPT, NANO)
    assert "scaled_dot_product_attention" not in text  # its weights go through dropout
    assert "_rt.causal_mask(" in text and "_rt.causal(" not in text


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_fused_attention_example_equals_the_written_out_program(dtype: str) -> None:
    source = GPT
    if dtype == "f64":  # every param and value f64: equal within 1e-12 rather than f32's rounding
        source = source.replace("= normal(", "f64 = normal(").replace("= ones()", "f64 = ones()")
        source = source.replace("= zeros()", "f64 = zeros()").replace("[b n D]", "[b n D] f64")
        source = source.replace("[b H i Dh]", "[b H i Dh] f64").replace("[b H j Dh]", "[b H j Dh] f64")
        source = source.replace("-> [b T V]", "-> [b T V] f64").replace("-> []:", "-> [] f64:")
        source = source.replace("-> [] =", "-> [] f64 =").replace("to(0.0, f32)", "to(0.0, f64)")
    fused = ss.load(source, dims=SMALL)
    written_out = ss.load(source, dims=SMALL, check_types=True)
    assert "scaled_dot_product_attention" in fused.python_source
    assert "scaled_dot_product_attention" not in written_out.python_source
    a, b = fused.Gpt.init(seed=0), written_out.Gpt.init(seed=0)
    opt_a, opt_b = ss.adamw(a, lr=1e-2), ss.adamw(b, lr=1e-2)
    g = torch.Generator().manual_seed(3)
    tol = 1e-12 if dtype == "f64" else 1e-6
    for _ in range(3):
        batch = {"tokens": torch.randint(0, 11, (4, 64), generator=g),
                 "targets": torch.randint(0, 11, (4, 64), generator=g)}
        la = fused.train_step(a, opt_a, batch, ss.Eval)
        lb = written_out.train_step(b, opt_b, batch, ss.Eval)
        assert float(la) == pytest.approx(float(lb), abs=tol)
    for name in ("emb", "head"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=tol * 10, rtol=0)
    torch.testing.assert_close(a.blocks[1].attn.w_qkv, b.blocks[1].attn.w_qkv, atol=tol * 10, rtol=0)


FUSABLE = """\
dim T = 6
dim D = 4

fn att(q: [h i D], k: [h j D], v: [h j D]) -> [h i D]:
    s = einsum(q, k, h i d, h j d -> h i j) * 0.5
    a = softmax(masked_fill(s, causal(i, j), -1e9), over=j)
    return einsum(a, v, h i j, h j d -> h i d)

fn normed(x: [n D], g: [D], b: [D]) -> [n D] = layer_norm(x, over=D) * g + b
"""


def test_a_fused_span_equals_torch_written_out_by_hand() -> None:
    prog = ss.load(FUSABLE)
    assert "scaled_dot_product_attention" in prog.python_source and "_rt.layer_norm(x, 1, g, b, 1e-05)" in prog.python_source
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 6, 4, generator=g) for _ in range(3))
    scores = (q @ k.transpose(1, 2)) * 0.5
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    expected = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v
    torch.testing.assert_close(prog.att(q, k, v), expected, atol=1e-6, rtol=0)
    x, gain, bias = (torch.randn(s, generator=g) for s in ((5, 4), (4,), (4,)))
    by_hand = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    torch.testing.assert_close(prog.normed(x, gain, bias), by_hand * gain + bias, atol=1e-6, rtol=0)


DERIVED = """\
dim H = 2
dim Dh = 2
dim D = H * Dh

fn normed(x: [n X], g: [G], b: [D]) -> [n D] = layer_norm(x, over=D) * g + b
"""
# The std library's extern fn, as programs declared it before layer_norm was a built-in: still fused.
STD_EXTERN = 'extern fn std_layer_norm(x: [n D], over: Axis[D]) -> [n D] = "shapescript.std.layer_norm"\n'


@pytest.mark.parametrize("extern", [False, True], ids=["built-in", "std-extern"])
@pytest.mark.parametrize("x, gain", [("D", "D"), ("D", "(H Dh)"), ("(H Dh)", "D"), ("(H Dh)", "(H Dh)")])
def test_a_derived_dim_fuses_however_it_is_spelled(x: str, gain: str, extern: bool) -> None:
    """`[n D]` and `[n (H Dh)]` with `dim D = H * Dh` are one type, to fusion as to the checker, which
    read the derived dims from a context only it set: three of these spellings were left unfused."""
    source = DERIVED.replace("[n X]", f"[n {x}]").replace("g: [G]", f"g: [{gain}]")
    if extern:
        source = source.replace("fn normed", STD_EXTERN + "\nfn normed").replace("= layer_norm(", "= std_layer_norm(")
    prog = ss.load(source)
    assert ("_rt.affine_layer_norm(x, g, b)" if extern else "_rt.layer_norm(x, 1, g, b, 1e-05)") in prog.python_source
    g = torch.Generator().manual_seed(0)
    rows, weight, bias = (torch.randn(s, generator=g, dtype=torch.float64) for s in ((5, 4), (4,), (4,)))
    expected = torch.nn.functional.layer_norm(rows, (4,), weight, bias, eps=1e-5)
    torch.testing.assert_close(prog.normed(rows.float(), weight.float(), bias.float()).double(), expected,
                               atol=1e-6, rtol=0)


@pytest.mark.parametrize("change, why", [
    ("    return einsum(a, v, h i j, h j d -> h i d)",
     "    return einsum(a, v, h i j, h j d -> h i d) + einsum(s, v, h i j, h j d -> h i d)"),  # s read twice
    ("-1e9", "-1e4"),  # a fill that doesn't hide the future exactly
    ("over=j", "over=i"),  # softmax over the queries: not attention
    ("    a = softmax", "    q = q * 2.0\n    a = softmax"),  # q changes between the scores and their use
])
def test_spans_that_are_not_attention_keep_their_form(change: str, why: str) -> None:
    source = FUSABLE.replace(change, why)
    prog = ss.load(source)
    assert "scaled_dot_product_attention" not in prog.python_source
    written_out = ss.load(source, check_types=True)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 6, 4, generator=g) for _ in range(3))
    torch.testing.assert_close(prog.att(q, k, v), written_out.att(q, k, v), atol=0, rtol=0)


def test_the_shared_mask_is_made_once_per_size() -> None:
    from shapescript.runtime import ops
    ops._shared_causal_mask.cache_clear()
    prog = ss.load(NANOGPT, dims=NANO)
    m = prog.Gpt.init(seed=0)
    tokens = torch.randint(0, 11, (2, 8))
    prog.logits(m, tokens, ss.Eval)
    prog.logits(m, tokens, ss.Eval)
    info = ops._shared_causal_mask.cache_info()
    assert info.misses == 1 and info.hits == 2 * 2 - 1  # L = 2 layers, two calls: one mask made


@pytest.mark.parametrize("x, body, fused", [
    ("[n D]", "layer_norm(x, over=D, eps=0.5) * g + b", "_rt.layer_norm(x, 1, g, b, 0.5)"),  # its eps kept
    ("[n D]", "layer_norm(x, g, over=D) * g + b", None),  # a weight of its own already
    ("[n D]", "layer_norm(x, over=D) * (g * 2.0) + b", None),  # a gain computed there
    ("[D n]", "layer_norm(x, over=D) * g + b", None),  # not the last axis: g and b placed by an index
])
def test_the_built_in_layer_norm_fuses_a_gain_and_a_bias(x: str, body: str, fused: str | None) -> None:
    source = f"dim D = 4\n\nfn f(x: {x} f64, g: [D] f64, b: [D] f64) -> {x} f64 = {body}\n"
    prog, written_out = ss.load(source), ss.load(source, check_types=True)
    if fused is not None:
        assert fused in prog.python_source and "+ b" not in prog.python_source
    else:
        assert "+ b" in prog.python_source
    g = torch.Generator().manual_seed(0)
    rows, weight, bias = (torch.randn(s, generator=g, dtype=torch.float64) for s in ((5, 4), (4,), (4,)))
    if x == "[D n]":
        rows = rows.T.contiguous()
    torch.testing.assert_close(prog.f(rows, weight, bias), written_out.f(rows, weight, bias), atol=1e-12, rtol=0)
    if fused is not None:
        expected = torch.nn.functional.layer_norm(rows, (4,), weight, bias, eps=0.5)
        torch.testing.assert_close(prog.f(rows, weight, bias), expected, atol=1e-12, rtol=0)
