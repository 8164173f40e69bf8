"""Each standard-library operation against PyTorch written by hand: values and gradients in f64 on
random inputs, and a compile error for a misuse."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from support import ROOT

import shapescript as ss
from shapescript.errors import CompileError
from shapescript.ir import nodes as N
from shapescript.ir.walk import walk
from shapescript.ops import OPS
from shapescript.pipeline import check_source, typed_ir

DIMS = "dim C = 4\ndim V = 7\ndim D = 3\ndim H = 2\ndim Dh = 3\n"
G = torch.Generator().manual_seed(0)


def r(*shape):
    return torch.randn(*shape, generator=G, dtype=torch.float64)


def idx(high, *shape):
    return torch.randint(0, high, shape, generator=G)


# (name, the function f in ShapeScript, inputs, the same in PyTorch)
CASES = [
    ("add", "fn f(a: [b C] f64, x: [C] f64) -> [b C] f64 = a + x", lambda: (r(5, 4), r(4)), lambda a, x: a + x),
    ("sub-by-name", "fn f(a: [b C] f64, x: [b] f64) -> [b C] f64 = a - x", lambda: (r(5, 4), r(5)),
     lambda a, x: a - x[:, None]),
    ("mul-div-pow", "fn f(a: [b C] f64, x: [b C] f64) -> [b C] f64 = a * x / (x * x + 1.0) ** 2",
     lambda: (r(3, 4), r(3, 4)), lambda a, x: a * x / (x * x + 1.0) ** 2),
    ("neg", "fn f(a: [b] f64) -> [b] f64 = -a", lambda: (r(3),), lambda a: -a),
    ("matmul", "fn f(a: [b D] f64, w: [D C] f64) -> [b C] f64 = a @ w", lambda: (r(5, 3), r(3, 4)), lambda a, w: a @ w),
    ("matmul-3d", "fn f(a: [b D] f64, w: [D C H] f64) -> [b C H] f64 = a @ w", lambda: (r(5, 3), r(3, 4, 2)),
     lambda a, w: torch.tensordot(a, w, dims=1)),
    *[(op, f"fn f(a: [b C] f64) -> [b C] f64 = {op}(a)", lambda: (r(3, 4),), ref) for op, ref in [
        ("exp", torch.exp), ("tanh", torch.tanh), ("sigmoid", torch.sigmoid), ("relu", torch.relu),
        ("gelu", F.gelu), ("silu", F.silu), ("abs", torch.abs)]],
    ("log-sqrt", "fn f(a: [b C] f64) -> [b C] f64 = log(a * a + 1.0) + sqrt(a * a + 1.0)", lambda: (r(3, 4),),
     lambda a: torch.log(a * a + 1) + torch.sqrt(a * a + 1)),
    ("maximum", "fn f(a: [b C] f64, x: [C] f64) -> [b C] f64 = maximum(a, x)", lambda: (r(3, 4), r(4)), torch.maximum),
    ("minimum", "fn f(a: [b C] f64, x: [b C] f64) -> [b C] f64 = minimum(a, x)", lambda: (r(3, 4), r(3, 4)),
     torch.minimum),
    ("clamp", "fn f(a: [b C] f64) -> [b C] f64 = clamp(a, min=-0.3, max=0.4)", lambda: (r(3, 4),),
     lambda a: a.clamp(-0.3, 0.4)),
    ("where", "fn f(a: [b C] f64, x: [b C] f64) -> [b C] f64 = where(a > x, a, x * 2.0)",
     lambda: (r(3, 4), r(3, 4)), lambda a, x: torch.where(a > x, a, x * 2)),
    *[(f"{op}-over", f"fn f(a: [b C] f64) -> [b] f64 = {op}(a, over=C)", lambda: (r(3, 4),), ref) for op, ref in [
        ("sum", lambda a: a.sum(1)), ("mean", lambda a: a.mean(1)), ("max", lambda a: a.amax(1)),
        ("min", lambda a: a.amin(1)), ("prod", lambda a: a.prod(1)), ("logsumexp", lambda a: a.logsumexp(1)),
        ("std", lambda a: a.std(1)), ("var", lambda a: a.var(1)), ("norm", lambda a: a.norm(dim=1))]],
    ("sum-all", "fn f(a: [b C] f64) -> [] f64 = sum(a)", lambda: (r(3, 4),), torch.sum),
    ("mean-over-b", "fn f(a: [b C] f64) -> [C] f64 = mean(a, over=b)", lambda: (r(3, 4),), lambda a: a.mean(0)),
    ("argmax", "fn f(a: [b C] f64) -> [b] Index[C] = argmax(a, over=C)", lambda: (r(3, 4),), lambda a: a.argmax(1)),
    ("argmin", "fn f(a: [b C] f64) -> [b] Index[C] = argmin(a, over=C)", lambda: (r(3, 4),), lambda a: a.argmin(1)),
    ("matmul-call", "fn f(a: [b D] f64, w: [D C] f64) -> [b C] f64 = matmul(a, w)", lambda: (r(5, 3), r(3, 4)),
     torch.matmul),
    ("any-all", "fn f(a: [b C] f64) -> [b] bool = any(a > 0.0, over=C) and all(a > -5.0, over=C)",
     lambda: (r(3, 4),), lambda a: (a > 0).any(1) & (a > -5).all(1)),
    ("softmax", "fn f(a: [b C] f64) -> [b C] f64 = softmax(a, over=C)", lambda: (r(3, 4),), lambda a: a.softmax(1)),
    ("log_softmax", "fn f(a: [b C] f64) -> [b C] f64 = log_softmax(a, over=b)", lambda: (r(3, 4),),
     lambda a: a.log_softmax(0)),
    ("cumsum", "fn f(a: [b C] f64) -> [b C] f64 = cumsum(a, over=C)", lambda: (r(3, 4),), lambda a: a.cumsum(1)),
    ("sort", "fn f(a: [b C] f64) -> [b C] f64 = sort(a, over=C)", lambda: (r(3, 4),), lambda a: a.sort(1).values),
    ("topk", "fn f(a: [b C] f64) -> [b 2] f64:\n    v, i = topk(a, 2, over=C)\n    return v",
     lambda: (r(3, 4),), lambda a: a.topk(2, dim=1).values),
    ("gather", "fn f(a: [b C] f64, i: [b k] Index[C]) -> [b k] f64 = gather(a, i, over=C)",
     lambda: (r(3, 4), idx(4, 3, 2)), lambda a, i: a.gather(1, i)),
    ("scatter", "fn f(a: [b C] f64, i: [b k] Index[C], s: [b k] f64) -> [b C] f64 = scatter(a, i, s, over=C)",
     lambda: (r(3, 4), torch.stack([torch.randperm(4, generator=G)[:2] for _ in range(3)]), r(3, 2)),
     lambda a, i, s: a.scatter(1, i, s)),
    ("cross_entropy", "fn f(a: [b C] f64, y: [b] Index[C]) -> [] f64 = cross_entropy(a, y, over=C)",
     lambda: (r(5, 4), idx(4, 5)), F.cross_entropy),
    ("cross_entropy-3d", "fn f(a: [b n C] f64, y: [b n] Index[C]) -> [] f64 = cross_entropy(a, y, over=C)",
     lambda: (r(2, 3, 4), idx(4, 2, 3)), lambda a, y: F.cross_entropy(a.transpose(1, 2), y)),
    ("masked_fill-causal", "fn f(s: [h i j] f64) -> [h i j] f64 = masked_fill(s, causal(i, j), -1e9)",
     lambda: (r(2, 3, 3),), lambda s: s.masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), -1e9)),
    ("one_hot", "fn f(y: [b] Index[C]) -> [b C] = one_hot(y)", lambda: (idx(4, 5),),
     lambda y: F.one_hot(y, 4).float()),
    ("embedding", "fn f(t: [V D] f64, ids: [b n] Index[V]) -> [b n D] f64 = embedding(t, ids)",
     lambda: (r(7, 3), idx(7, 2, 5)), lambda t, ids: F.embedding(ids, t)),
    ("first", "fn f(t: [V D] f64, x: [b n D] f64) -> [b n D] f64 = x + first(t, n)", lambda: (r(7, 3), r(2, 5, 3)),
     lambda t, x: x + t[:5]),
    ("first-over", "fn f(x: [b C] f64) -> [b 2] f64 = first(x, 2, over=C)", lambda: (r(3, 4),), lambda x: x[:, :2]),
    ("first-all", "fn f(t: [V D] f64, x: [V] f64) -> [V D] f64 = first(t, V) * first(x, V)",
     lambda: (r(7, 3), r(7)), lambda t, x: t * x[:, None]),
    ("positions", "fn f(x: [b n] f64) -> [n] Index[n] = positions(n)", lambda: (r(3, 5),), lambda x: torch.arange(5)),
    ("positions-float", "fn f(x: [b n] f64) -> [b n] f64 = x * to(positions(n), f64)", lambda: (r(3, 5),),
     lambda x: x * torch.arange(5, dtype=torch.float64)),
    ("positions-embedding", "fn f(t: [V D] f64, x: [b n D] f64) -> [b n D] f64 = x + embedding(first(t, n), "
     "positions(n))", lambda: (r(7, 3), r(2, 4, 3)), lambda t, x: x + F.embedding(torch.arange(4), t[:4])),
    ("rearrange", "fn f(x: [b n (H Dh)] f64) -> [b H n Dh] f64 = rearrange(x, b n (H Dh) -> b H n Dh)",
     lambda: (r(2, 5, 6),), lambda x: x.reshape(2, 5, 2, 3).permute(0, 2, 1, 3)),
    ("rearrange-merge", "fn f(x: [b H n Dh] f64) -> [b n (H Dh)] f64 = rearrange(x, b h n d -> b n (h d))",
     lambda: (r(2, 2, 5, 3),), lambda x: x.permute(0, 2, 1, 3).reshape(2, 5, 6)),
    ("split", "fn f(x: [b (3 D)] f64) -> [b D] f64:\n    q, k, v = split(x, b (3 D) -> b D)\n    return q * k + v",
     lambda: (r(4, 9),), lambda x: x[:, :3] * x[:, 3:6] + x[:, 6:]),
    ("repeat", "fn f(x: [b D] f64) -> [b C D] f64 = repeat(x, b d -> b c d, c=C)", lambda: (r(2, 3),),
     lambda x: x[:, None, :].expand(2, 4, 3)),
    ("reduce", "fn f(x: [b (H Dh)] f64) -> [Dh b] f64 = reduce(x, b (h d) -> d b, max, h=H)", lambda: (r(4, 6),),
     lambda x: x.reshape(4, 2, 3).amax(1).T),
    ("einsum", "fn f(q: [b i D] f64, k: [b j D] f64) -> [b i j] f64 = einsum(q, k, b i d, b j d -> b i j)",
     lambda: (r(2, 3, 3), r(2, 5, 3)), lambda q, k: q @ k.transpose(1, 2)),
    ("std-layer_norm", 'extern fn ln(x: [b n D] f64, over: Axis[D]) -> [b n D] f64 = "shapescript.std.layer_norm"\n'
     "fn f(x: [b n D] f64) -> [b n D] f64 = ln(x, over=D)", lambda: (r(2, 4, 3),),
     lambda x: F.layer_norm(x, (3,))),
    ("std-layer_norm-middle", 'extern fn ln(x: [b D n] f64, over: Axis[D]) -> [b D n] f64 = "shapescript.std.layer_norm"\n'
     "fn f(x: [b D n] f64) -> [b D n] f64 = ln(x, over=D)", lambda: (r(2, 3, 4),),
     lambda x: F.layer_norm(x.transpose(1, 2), (3,)).transpose(1, 2)),
    ("std-rms_norm", 'extern fn rn(x: [b D] f64, over: Axis[D]) -> [b D] f64 = "shapescript.std.rms_norm"\n'
     "fn f(x: [b D] f64) -> [b D] f64 = rn(x, over=D)", lambda: (r(5, 3),), lambda x: F.rms_norm(x, (3,), eps=1e-6)),
    ("compare-logic", "fn f(a: [b C] f64, x: [b C] f64) -> [b C] bool = not (a < x) or a == x and a != 0.0",
     lambda: (r(3, 4), r(3, 4)), lambda a, x: ~(a < x) | ((a == x) & (a != 0))),
]


@pytest.mark.parametrize("name, src, inputs, reference", CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients_match_pytorch(name, src, inputs, reference) -> None:
    prog = ss.load(DIMS + src + "\n", name=f"{name}.ss")
    fn = prog.namespace["f"]  # the generated function itself, so autograd sees through it
    args = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs()]
    ref_args = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in args]
    out, expected = fn(*args), reference(*ref_args)
    assert out.dtype == expected.dtype and out.shape == expected.shape
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)
    if out.is_floating_point() and any(a.requires_grad for a in args):
        weight = torch.randn(out.shape, generator=G, dtype=out.dtype)
        grads = torch.autograd.grad((out * weight).sum(), [a for a in args if a.requires_grad])
        ref_grads = torch.autograd.grad((expected * weight).sum(), [a for a in ref_args if a.requires_grad])
        for g, rg in zip(grads, ref_grads):
            torch.testing.assert_close(g, rg, atol=1e-10, rtol=1e-10)
    # And through the Python API, which checks the arguments and runs without autograd.
    result = prog.f(*[a.detach() for a in args])
    torch.testing.assert_close(result, expected.detach(), atol=1e-10, rtol=1e-10)


def test_dropout_draws_from_the_mode() -> None:
    prog = ss.load(DIMS + "fn f(x: [b C], mode: Mode) -> [b C] = dropout(x, 0.25, mode)\n", name="d.ss")
    x = torch.ones(200, 4)
    assert torch.equal(prog.f(x, ss.Eval), x)
    a, b = prog.f(x, ss.Train(seed=3)), prog.f(x, ss.Train(seed=3))
    assert torch.equal(a, b) and not torch.equal(a, prog.f(x, ss.Train(seed=4)))
    kept = a != 0
    assert torch.allclose(a[kept], torch.full_like(a[kept], 1 / 0.75))
    assert 0.15 < 1 - kept.float().mean() < 0.35
    mode = ss.Train(seed=3)
    first, second = prog.f(x, mode), prog.f(x, mode)  # one mode continues its stream
    assert torch.equal(first, a) and not torch.equal(second, a)


def test_gradient_norm_and_clipping_match_torch() -> None:
    prog = ss.load(DIMS + """
model M:
    param w: [D C] f64 = normal(std=1.0)
    param v: [C] f64 = normal(std=1.0)

fn loss(m: M, x: [b D] f64) -> [] f64 = sum((x @ m.w + m.v) ** 2)

fn g_norm(m: M, x: [b D] f64) -> [] f64:
    l, g = value_and_grad(loss, m, x)
    return norm(g)

fn clipped_step(mut m: M, mut opt: Sgd[M], x: [b D] f64) -> [] f64:
    l, g = value_and_grad(loss, m, x)
    update(mut m, mut opt, clip_norm(g, 1.5))
    return norm(clip_norm(g, 1.5))
""", name="g.ss")
    m = prog.M.init(seed=0)
    x = r(5, 3)
    w, v = m.w.detach().clone().requires_grad_(), m.v.detach().clone().requires_grad_()
    ((x @ w + v) ** 2).sum().backward()
    total = torch.linalg.vector_norm(torch.stack([w.grad.norm(), v.grad.norm()]))
    torch.testing.assert_close(prog.g_norm(m, x), total)
    clipped = prog.clipped_step(m, ss.sgd(m, lr=1.0), x)
    assert float(clipped) == pytest.approx(1.5, rel=1e-5)
    torch.nn.utils.clip_grad_norm_([w, v], 1.5)
    torch.testing.assert_close(m.w.detach(), (w - w.grad).detach())


MISUSES = [
    ("fn f(a: [b C]) -> [b] = sum(a, over=D)", "E0303"),
    ("fn f(a: [b C]) -> [b C] = softmax(a, over=V)", "E0303"),
    ("fn f(a: [b C], y: [b] Index[V]) -> [] = cross_entropy(a, y, over=C)", "E0309"),
    ("fn f(a: [b C], x: [D]) -> [b C] = maximum(a, x)", "E0301"),
    ("fn f(a: [b C]) -> [b C] = where(a, a, a)", "E0308"),
    ("fn f(a: [b C], m: [C b] bool) -> [b C] = masked_fill(a, m, 0.0)", "E0301"),
    ("fn f(t: [V D], ids: [b] Index[C]) -> [b D] = embedding(t, ids)", "E0309"),
    ("fn f(a: [b C]) -> [b 9] = cumsum(a, over=C)", "E0305"),
    ("fn f(a: [b C], i: [b k]) -> [b k] = gather(a, i, over=C)", "E0309"),
    ("fn f(a: [b C]) -> [b 9]:\n    v, i = topk(a, 9, over=C)\n    return v", "E0310"),
    ("fn f(a: [b C]) -> [b] = argmax(a)", "E0206"),
    ("fn f(y: [b] i64) -> [b C] = one_hot(y)", "E0309"),
    ("fn f(x: [b D]) -> [b D] = rearrange(x, b (h w) -> b h w)", "E0307"),
    ("fn f(x: [b D]) -> [D] = reduce(x, b d -> d, median)", "E0307"),
    ("fn f(q: [i D], k: [j C]) -> [i j] = einsum(q, k, i d, j d -> i j)", "E0307"),
    ("fn f(x: [b C], mode: Mode) -> [b C] = dropout(x, 1.5, mode)", "E0310"),
    ("fn f(x: [b C]) -> [b C] = dropout(x, 0.1, 3)", "E0401"),
    ("fn f(x: [b C]) -> [] = norm(x, over=D)", "E0303"),
    ("fn f(x: [b C]) -> [b C] = clamp(x)", "E0206"),
    ("fn f(x: [b C]) -> [b b] bool = causal(b, k)", "E0303"),
    ("fn f(x: [b C] i64) -> [b C] i64 = exp(x)", "E0308"),
    ("fn f(x: [b C] i64) -> [b C] i64 = relu(x)", "E0308"),
    ("fn f(x: [b C]) -> [b C] = not x", "E0308"),
    ("fn f(x: [b C]) -> [b C] bool = x and x", "E0308"),
    ("fn f(x: [b C] bool) -> [b C] bool = x + x", "E0308"),
    ("fn f(x: [b C] f64, y: [b C]) -> [b C] bool = x < y", "E0308"),
    ("fn f(x: [b C]) -> [b] = any(x, over=C)", "E0308"),
    ("fn f(x: [b C] i64) -> [b] = logsumexp(x, over=C)", "E0308"),
    ("fn f(x: [b C]) -> [b] = prod(x, over=D)", "E0303"),
    ("fn f(x: [b C]) -> [b C] = log_softmax(x, over=D)", "E0303"),
    ("fn f(x: [b C]) -> [b C] = sort(x, over=V)", "E0303"),
    ("fn f(a: [b C], i: [b k] Index[C], s: [b k] f64) -> [b C] = scatter(a, i, s, over=C)", "E0301"),
    ("fn f(x: [b (H Dh)]) -> [b Dh] = split(x, b (h d) -> b d, h=H)", "E0307"),
    ("fn f(x: [D]) -> [C D] = repeat(x, d -> n d)", "E0307"),
    ("fn f(x: [b C]) -> [b C] = minimum(x, 2.0)", "E0401"),
    ("fn f(x: [b C], y: [b D]) -> [b C] = x @ y", "E0304"),
    ("fn f(x: [b C]) -> [b C] = clip_norm(x, 1.0)", "E0401"),
    ('extern fn ln(x: [n D], over: Axis[D]) -> [n D] = "shapescript.std.layer_norm"\n'
     "fn f(x: [n D]) -> [n D] = ln(x, over=n)", "E0303"),
    ("fn f(x: [b C], m: Mode) -> [b C] = batch_norm(x, x, m, over=C)", "E0401"),
    ("fn f(x: [b C]) -> [b C] = abs(x, x)", "E0206"),
    ("fn f(t: [V D]) -> [9 D] = first(t, 9)", "E0310"),
    ("fn f(t: [V D]) -> [] = sum(first(t, 0))", "E0310"),
    ("fn f(t: [V D]) -> [] = sum(first(t, 1.5))", "E0310"),
    ("fn f(t: [V D]) -> [] = sum(first(t, k))", "E0303"),
    ("fn f(t: [V D]) -> [] = sum(first(t, 2, over=C))", "E0303"),
    ("fn f(t: [V D]) -> [] = sum(first(2.0, 2))", "E0401"),
    ("fn f(t: [] f64) -> [] f64 = first(t, 1)", "E0302"),
    ("fn f(t: [V D]) -> [] = sum(first(t))", "E0206"),
    ("fn f(x: [b C]) -> [b] Index[b] = positions(k)", "E0303"),
    ("fn f(x: [b C]) -> [b] Index[b] = positions(-2)", "E0310"),
    ("fn f(x: [b C]) -> [b] Index[C] = positions(b)", "E0309"),
    ("fn f(x: [b C]) -> [b C] = sqrt(tanh(sigmoid(gelu(silu(x)))), over=C)", "E0206"),
]


@pytest.mark.parametrize("src, code", MISUSES, ids=[m[1] + "-" + m[0].split("=")[-1].strip()[:20] for m in MISUSES])
def test_misuse_is_a_compile_error(src: str, code: str) -> None:
    with pytest.raises(CompileError) as info:
        ss.load(DIMS + src + "\n", name="bad.ss")
    assert set(info.value.codes) == {code}, str(info.value)


BATCH_NORM = DIMS + """
model Stats:
    buffer mean: [C] f64 = zeros()
    buffer var: [C] f64 = ones()

fn f(s: Stats, x: [b n C] f64, mode: Mode) -> [b n C] f64 = batch_norm(x, s, mode, over=C)
"""


def test_batch_norm_matches_torch_in_train_and_eval() -> None:
    prog = ss.load(BATCH_NORM, name="bn.ss")
    stats = prog.Stats.init(seed=0)
    ref = torch.nn.BatchNorm1d(4, affine=False, dtype=torch.float64)
    for _ in range(3):  # Train: batch statistics, and the running ones move
        x = r(2, 5, 4)
        torch.testing.assert_close(prog.namespace["f"](stats, x, ss.Train(seed=0)),
                                   ref(x.transpose(1, 2)).transpose(1, 2))
    torch.testing.assert_close(stats.mean, ref.running_mean)
    torch.testing.assert_close(stats.var, ref.running_var)
    ref.eval()
    x = r(3, 2, 4).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    out, expected = prog.namespace["f"](stats, x, ss.Eval), ref(xr.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)


def test_batch_norm_needs_its_statistics() -> None:
    with pytest.raises(CompileError) as info:
        ss.load(BATCH_NORM.replace("buffer var: [C] f64 = ones()", "buffer var: [D] f64 = ones()"), name="bn.ss")
    assert info.value.codes == ["E0401"] and "buffers `mean: [C] f64`" in str(info.value)


FIRST = DIMS + "fn f(t: [V D] f64, x: [b n D] f64) -> [b n D] f64 = x + first(t, n)\n" \
    "fn g(x: [m D] f64, y: [n] f64) -> [n D] f64 = first(x, n)\n"


def test_first_checks_a_generic_count_when_it_runs() -> None:
    """n <= V is known only when f runs: too many is a ShapeError naming the call, never torch's error."""
    prog = ss.load(FIRST, name="first.ss")
    f_col, g_col = (FIRST.splitlines()[k].index("first(") + 1 for k in (5, 6))
    with pytest.raises(ss.ShapeError) as info:
        prog.f(r(7, 3), r(2, 9, 3))
    assert str(info.value).startswith(f"first.ss:6:{f_col}: `first` takes n = 9 entries along V, which has only 7")
    with pytest.raises(ss.ShapeError) as info:
        prog.g(r(3, 3), r(4))
    assert str(info.value).startswith(f"first.ss:7:{g_col}: `first` takes n = 4 entries along m, which has only 3")
    x = r(3, 3)
    assert torch.equal(prog.g(x, r(3)), x) and torch.equal(prog.g(x, r(2)), x[:2])


SEVERAL = """devices cpu[0 1]
dim T = 8
dim D = 3

data Ex:
    x: [n D]

model M:
    param wpe: [T D] = normal(std=0.02)

"""


@pytest.mark.parametrize("body", [
    "fn f(m: M, batch: [b] Ex) -> [2 n D] = first(batch.x, 2, over=b)",
    "fn f(m: M, batch: [b] Ex) -> [] = sum(first(batch.x, 1))",
    "fn f(m: M, x: [b n D]) -> [b D] = first(m.wpe, b)\nfn g(m: M, batch: [b] Ex) -> [] = sum(f(m, batch.x))",
    "fn f(x: [b n D]) -> [b] Index[b] = positions(b)\nfn g(batch: [b] Ex) -> [] = sum(to(f(batch.x), f32))",
])
def test_first_and_positions_along_the_batch_axis_are_E1801_on_several_devices(body: str) -> None:
    """Each device holds a part of the batch: its first rows or positions are not the whole batch's."""
    with pytest.raises(CompileError) as info:
        ss.load(SEVERAL + body + "\n", name="split.ss")
    assert info.value.codes == ["E1801"], str(info.value)
    ss.load(SEVERAL + body + "\n", name="split.ss", devices="cpu")  # one device: the whole batch


def test_first_and_positions_along_other_axes_are_per_example_on_several_devices() -> None:
    body = ("fn f(m: M, x: [b n D]) -> [b n D] = x + first(m.wpe, n) * to(positions(n), f32)\n"
            "fn g(m: M, batch: [b] Ex) -> [] = sum(f(m, batch.x)) + sum(first(batch.x, 2, over=n))\n")
    prog = ss.load(SEVERAL + body, name="split.ss")
    assert prog.checked.placement("g").where == "workers"


def test_positions_and_first_of_a_dim_sized_when_loading() -> None:
    """`dim V` without a size: the program checks, and runs with the size given at load."""
    src = "dim V\ndim D = 3\nfn f(t: [V D] f64) -> [V D] f64 = first(t, V) * to(positions(V), f64)\n"
    with pytest.raises(CompileError) as info:  # built without V's size: E0313, not an error of positions
        ss.load(src, name="v.ss")
    assert info.value.codes == ["E0313"]
    t = r(5, 3)
    expected = t * torch.arange(5.0, dtype=torch.float64)[:, None]
    torch.testing.assert_close(ss.load(src, name="v.ss", dims={"V": 5}).f(t), expected)


# The ops whose reference test isn't a case above (they change a model, run in the controller, or
# draw at random), and the test file under tests/ that runs each against torch or Python.
TESTED_ELSEWHERE = {
    "dropout": "compiler/test_stdlib.py", "Train": "compiler/test_stdlib.py", "Eval": "compiler/test_stdlib.py",
    "batch_norm": "compiler/test_stdlib.py", "clip_norm": "compiler/test_stdlib.py",
    "value_and_grad": "runtime/test_runtime_optim.py", "update": "runtime/test_runtime_optim.py",
    "ema": "several/test_accumulation.py",
    "valid": "runtime/test_padding.py", "save": "runtime/test_runtime_checkpoint.py",
    "load": "runtime/test_runtime_checkpoint.py", "shuffle": "runtime/test_controller.py",
    "batches": "runtime/test_controller.py", "logs": "runtime/test_controller.py",
    "write": "runtime/test_controller.py", "print": "runtime/test_controller.py",
    **dict.fromkeys(("sin", "cos", "softplus", "log1p", "expm1", "erf", "sign", "mse_loss", "l1_loss", "smooth_l1_loss",
                     "binary_cross_entropy_with_logits", "nll_loss", "kl_div", "cosine_similarity"),
                    "compiler/test_more_ops.py"),
    **dict.fromkeys(("take", "window", "cat", "stack", "pad"), "compiler/test_selecting_ops.py"),
    **dict.fromkeys(("range", "last", "put"), "compiler/test_control_flow.py"),
    **dict.fromkeys(("conv1d", "conv2d", "max_pool2d", "avg_pool2d", "conv_transpose2d", "adaptive_avg_pool2d",
                     "adaptive_max_pool2d"), "compiler/test_convolution.py"),
    **dict.fromkeys(("random_normal", "random_uniform", "bernoulli", "randint", "categorical"),
                    "compiler/test_random_ops.py"),
    **dict.fromkeys(("layer_norm", "rms_norm", "group_norm"), "compiler/test_norms.py"),
}


def test_every_op_of_the_table_has_a_reference_test() -> None:
    """The ops the cases above call, read off their typed IR, and those tested elsewhere: every op
    of the table, so that an op added without a test against torch fails here."""
    called: set[str] = set()
    for _, src, *_ in CASES:
        module = typed_ir(check_source(DIMS + src + "\n", "case.ss"), fused=False)
        called |= {e.op for f in module.functions for e in walk(f.body) if isinstance(e, (N.OpCall, N.GradCall))}
    untested = sorted(set(OPS) - called - set(TESTED_ELSEWHERE))
    assert not untested, f"ops of the table with no reference test: {untested}"
    for op, file in TESTED_ELSEWHERE.items():
        assert op in OPS and op not in called, op  # a stale entry, or one the cases now cover
        assert re.search(rf"\b{op}\b", (ROOT / "tests" / file).read_text()), (op, file)

