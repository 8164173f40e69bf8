"""The elementwise functions sin, cos, softplus, log1p, expm1, erf and sign, the losses mse_loss,
l1_loss, smooth_l1_loss, binary_cross_entropy_with_logits, nll_loss and kl_div, and
cosine_similarity, each against PyTorch written by hand in f64 (values and gradients, to 1e-12 or
exactly); the codes of their misuses; and what each does across the batch axis and under the
layout options, as the DeviceTable says before anything runs. (tests/several/test_more_losses.py
runs the losses on several devices.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import shapescript as ss
from shapescript.errors import CompileError
from shapescript.pipeline import compile_program
from shapescript.plan.comms import device_table

DIMS = "dim C = 4\ndim D = 3\ndim V = 5\n"
G = torch.Generator().manual_seed(0)


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=G, dtype=torch.float64)


def probs(*shape: int, dim: int = -1) -> torch.Tensor:
    return r(*shape).softmax(dim)


def labels(high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=G)


def against_torch(src: str, inputs: tuple[torch.Tensor, ...], reference, exact: bool = False) -> None:
    """`f` of the program `src` and `reference` on the same inputs: the same value (exactly, or to
    1e-12) and the same gradients of a random weighting of it with respect to the float inputs."""
    prog = ss.load(DIMS + src + "\n", name="more.ss")
    fn = prog.namespace["f"]  # the generated function itself, so that autograd sees through it
    args = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    ref_args = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in args]
    out, expected = fn(*args), reference(*ref_args)
    assert out.dtype == expected.dtype and out.shape == expected.shape

    def same(a: torch.Tensor, b: torch.Tensor) -> None:
        if exact:
            assert torch.equal(a, b), (a, b)
        else:
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12, equal_nan=True)  # d/dtarget at 0: nan in both

    same(out, expected)
    floats = [a for a in args if a.requires_grad]
    if out.is_floating_point() and floats:
        weight = torch.randn(out.shape, generator=G, dtype=out.dtype)
        grads = torch.autograd.grad((out * weight).sum(), floats)
        ref_grads = torch.autograd.grad((expected * weight).sum(), [a for a in ref_args if a.requires_grad])
        for g, rg in zip(grads, ref_grads):
            same(g, rg)
    same(prog.f(*[a.detach() for a in args]), expected.detach())  # through the API's guards too


# ---- elementwise ---------------------------------------------------------------------------------

UNARY = [("sin", torch.sin), ("cos", torch.cos), ("softplus", F.softplus), ("expm1", torch.expm1),
         ("erf", torch.erf), ("sign", torch.sign)]


@pytest.mark.parametrize("name, reference", UNARY, ids=[u[0] for u in UNARY])
def test_elementwise_functions_are_torchs(name: str, reference) -> None:
    x = r(5, 4) * 12.0  # softplus past its threshold of 20 too
    x[0, 0] = 0.0  # sign's 0
    against_torch(f"fn f(a: [b C] f64) -> [b C] f64 = {name}(a)", (x,), reference, exact=True)


def test_log1p_is_torchs_near_zero_and_far() -> None:
    x = torch.cat([r(4).abs() * 1e-10, r(4).abs() * 50.0]).reshape(2, 4)
    against_torch("fn f(a: [b C] f64) -> [b C] f64 = log1p(a)", (x,), torch.log1p, exact=True)


def test_the_functions_keep_f32_and_compose() -> None:
    x = torch.randn(3, 4, generator=G)
    prog = ss.load(DIMS + "fn f(a: [b C]) -> [b C] = sin(a) * cos(a) + erf(softplus(a)) - expm1(log1p(abs(a)))\n",
                   name="f32.ss")
    want = torch.sin(x) * torch.cos(x) + torch.erf(F.softplus(x)) - torch.expm1(torch.log1p(torch.abs(x)))
    out = prog.f(x)
    assert out.dtype == torch.float32 and torch.equal(out, want)


@pytest.mark.parametrize("dtype", ["i64", "i32", "bool"])
def test_sign_keeps_an_integer_or_bool_dtype(dtype: str) -> None:
    torch_dtype = {"i64": torch.int64, "i32": torch.int32, "bool": torch.bool}[dtype]
    x = torch.tensor([[-3, 0, 2, 7], [1, -1, 0, 0]]).to(torch_dtype)
    prog = ss.load(DIMS + f"fn f(a: [b C] {dtype}) -> [b C] {dtype} = sign(a)\n", name="sign.ss")
    out = prog.f(x)
    assert out.dtype == torch_dtype and torch.equal(out, torch.sign(x))


# ---- losses --------------------------------------------------------------------------------------

def kl_rows(logp: torch.Tensor, target: torch.Tensor, dim: int) -> torch.Tensor:
    """Each distribution's divergence along `dim`, written out (0 where the target is 0)."""
    return (torch.xlogy(target, target) - target * logp).sum(dim)


LOSSES = [
    ("mse", "fn f(a: [b C] f64, t: [b C] f64) -> [] f64 = mse_loss(a, t)", lambda: (r(5, 4), r(5, 4)), F.mse_loss),
    ("mse-3d", "fn f(a: [b n C] f64, t: [b n C] f64) -> [] f64 = mse_loss(a, t)", lambda: (r(2, 3, 4), r(2, 3, 4)),
     F.mse_loss),
    ("l1", "fn f(a: [b C] f64, t: [b C] f64) -> [] f64 = l1_loss(a, t)", lambda: (r(5, 4), r(5, 4)), F.l1_loss),
    ("smooth_l1", "fn f(a: [b C] f64, t: [b C] f64) -> [] f64 = smooth_l1_loss(a, t)", lambda: (r(5, 4), r(5, 4)),
     F.smooth_l1_loss),
    ("smooth_l1-beta", "fn f(a: [b C] f64, t: [b C] f64) -> [] f64 = smooth_l1_loss(a, t, beta=0.5)",
     lambda: (r(5, 4), r(5, 4)), lambda a, t: F.smooth_l1_loss(a, t, beta=0.5)),
    ("smooth_l1-beta-0", "fn f(a: [b C] f64, t: [b C] f64) -> [] f64 = smooth_l1_loss(a, t, beta=0)",
     lambda: (r(5, 4), r(5, 4)), F.l1_loss),
    ("bce", "fn f(a: [b C] f64, t: [b C] f64) -> [] f64 = binary_cross_entropy_with_logits(a, t)",
     lambda: (r(5, 4) * 5.0, torch.rand(5, 4, generator=G, dtype=torch.float64)), F.binary_cross_entropy_with_logits),
    ("nll", "fn f(a: [b C] f64, y: [b] Index[C]) -> [] f64 = nll_loss(a, y, over=C)",
     lambda: (r(5, 4).log_softmax(1), labels(4, 5)), F.nll_loss),
    ("nll-last", "fn f(a: [b n C] f64, y: [b n] Index[C]) -> [] f64 = nll_loss(a, y, over=C)",
     lambda: (r(2, 3, 4).log_softmax(2), labels(4, 2, 3)), lambda a, y: F.nll_loss(a.movedim(2, 1), y)),
    ("nll-first", "fn f(a: [C b] f64, y: [b] Index[C]) -> [] f64 = nll_loss(a, y, over=C)",
     lambda: (r(4, 5), labels(4, 5)), lambda a, y: F.nll_loss(a.T, y)),
    ("nll-is-cross_entropy", "fn f(a: [b C] f64, y: [b] Index[C]) -> [] f64 = nll_loss(log_softmax(a, over=C), y, "
     "over=C)", lambda: (r(5, 4), labels(4, 5)), F.cross_entropy),
    ("kl_div", "fn f(p: [b C] f64, t: [b C] f64) -> [] f64 = kl_div(p, t, over=C)",
     lambda: (r(5, 4).log_softmax(1), probs(5, 4)), lambda p, t: F.kl_div(p, t, reduction="batchmean")),
    ("kl_div-3d", "fn f(p: [b n C] f64, t: [b n C] f64) -> [] f64 = kl_div(p, t, over=C)",
     lambda: (r(2, 3, 4).log_softmax(2), probs(2, 3, 4)), lambda p, t: kl_rows(p, t, 2).mean()),
    ("kl_div-first", "fn f(p: [C b] f64, t: [C b] f64) -> [] f64 = kl_div(p, t, over=C)",
     lambda: (r(4, 5).log_softmax(0), probs(4, 5, dim=0)), lambda p, t: F.kl_div(p.T, t.T, reduction="batchmean")),
    ("kl_div-one", "fn f(p: [C] f64, t: [C] f64) -> [] f64 = kl_div(p, t, over=C)",
     lambda: (r(4).log_softmax(0), torch.tensor([0.5, 0.0, 0.25, 0.25], dtype=torch.float64)),
     lambda p, t: F.kl_div(p, t, reduction="sum")),
    ("cosine", "fn f(a: [b D] f64, c: [b D] f64) -> [b] f64 = cosine_similarity(a, c, over=D)",
     lambda: (r(5, 3), r(5, 3)), lambda a, c: F.cosine_similarity(a, c, dim=1)),
    ("cosine-over-b", "fn f(a: [b D] f64, c: [b D] f64) -> [D] f64 = cosine_similarity(a, c, over=b)",
     lambda: (r(5, 3), r(5, 3)), lambda a, c: F.cosine_similarity(a, c, dim=0)),
    ("cosine-middle", "fn f(a: [b D n] f64, c: [b D n] f64) -> [b n] f64 = cosine_similarity(a, c, over=D)",
     lambda: (r(2, 3, 4), r(2, 3, 4)), lambda a, c: F.cosine_similarity(a, c, dim=1)),
    ("cosine-eps", "fn f(a: [b D] f64, c: [b D] f64) -> [b] f64 = cosine_similarity(a, c, over=D, eps=0.5)",
     lambda: (r(5, 3) * 0.1, r(5, 3)), lambda a, c: F.cosine_similarity(a, c, dim=1, eps=0.5)),
]


@pytest.mark.parametrize("name, src, inputs, reference", LOSSES, ids=[c[0] for c in LOSSES])
def test_losses_and_cosine_similarity_are_torchs(name: str, src: str, inputs, reference) -> None:
    against_torch(src, inputs(), reference)


MASK = torch.tensor([True, False, True, True, False])
MASKED = [
    ("mse", "fn f(a: [b C] f64, t: [b C] f64, m: [b] bool) -> [] f64 = mse_loss(a, t, mask=m)",
     lambda: (r(5, 4), r(5, 4), MASK), lambda a, t, m: F.mse_loss(a[m], t[m])),
    ("l1-each-value", "fn f(a: [b C] f64, t: [b C] f64, m: [b C] bool) -> [] f64 = l1_loss(a, t, mask=m)",
     lambda: (r(5, 4), r(5, 4), r(5, 4) > 0), lambda a, t, m: F.l1_loss(a[m], t[m])),
    ("smooth_l1-by-class", "fn f(a: [b C] f64, t: [b C] f64, m: [C] bool) -> [] f64 = "
     "smooth_l1_loss(a, t, beta=2.0, mask=m)", lambda: (r(5, 4) * 3.0, r(5, 4), MASK[:4]),
     lambda a, t, m: F.smooth_l1_loss(a[:, m], t[:, m], beta=2.0)),
    ("bce", "fn f(a: [b C] f64, t: [b C] f64, m: [b] bool) -> [] f64 = binary_cross_entropy_with_logits(a, t, mask=m)",
     lambda: (r(5, 4), torch.rand(5, 4, generator=G, dtype=torch.float64), MASK),
     lambda a, t, m: F.binary_cross_entropy_with_logits(a[m], t[m])),
    ("nll", "fn f(a: [b n C] f64, y: [b n] Index[C], m: [b n] bool) -> [] f64 = nll_loss(a, y, over=C, mask=m)",
     lambda: (r(2, 5, 4), labels(4, 2, 5), MASK.repeat(2, 1)),
     lambda a, y, m: F.nll_loss(a[m], y[m])),
    ("kl_div", "fn f(p: [b C] f64, t: [b C] f64, m: [b] bool) -> [] f64 = kl_div(p, t, over=C, mask=m)",
     lambda: (r(5, 4).log_softmax(1), probs(5, 4), MASK),
     lambda p, t, m: F.kl_div(p[m], t[m], reduction="batchmean")),
]


@pytest.mark.parametrize("name, src, inputs, reference", MASKED, ids=[c[0] for c in MASKED])
def test_a_masked_loss_is_the_mean_where_the_mask_holds(name: str, src: str, inputs, reference) -> None:
    against_torch(src, inputs(), reference)


def test_a_loss_is_a_number_of_its_operands_dtype() -> None:
    prog = ss.load(DIMS + "fn f(a: [b C], t: [b C]) -> [] = mse_loss(a, t) + kl_div(a, softmax(t, over=C), over=C)\n",
                   name="f32.ss")
    a, t = torch.randn(3, 4, generator=G), torch.randn(3, 4, generator=G)
    out = prog.f(a, t)
    assert out.dtype == torch.float32 and out.shape == ()
    torch.testing.assert_close(out, F.mse_loss(a, t) + F.kl_div(a, t.softmax(1), reduction="batchmean"))


def test_the_lowering_is_torchs_function() -> None:
    source = ss.load(DIMS + "fn f(a: [b C], t: [b C], y: [b] Index[C]) -> [] = smooth_l1_loss(a, t, beta=0.5) + "
                     "nll_loss(a, y, over=C) + mean(cosine_similarity(a, t, over=C, eps=0.1))\n",
                     name="low.ss").python_source
    assert "_F.smooth_l1_loss(a, t, beta=0.5)" in source
    assert "_F.nll_loss(a, y)" in source
    assert "_F.cosine_similarity(a, t, dim=1, eps=0.1)" in source


# ---- misuses -------------------------------------------------------------------------------------

MISUSES = [
    ("fn f(x: [b C] i64) -> [b C] i64 = sin(x)", "E0308", "`sin` takes float tensors, not i64"),
    ("fn f(x: [b C] bool) -> [b C] bool = softplus(x)", "E0308", "`softplus` takes float tensors"),
    ("fn f(x: [b C] i32) -> [b C] i32 = erf(x)", "E0308", "`erf` takes float tensors"),
    ("fn f(x: [b C]) -> [b C] = cos(x, over=C)", "E0206", ""),
    ("fn f(x: [b C] f64, t: [b C]) -> [] f64 = mse_loss(x, t)", "E0308", "`mse_loss` of f64 and f32"),
    ("fn f(x: [b C] i64, t: [b C] i64) -> [] = l1_loss(x, t)", "E0308", "`l1_loss` takes float tensors"),
    ("fn f(x: [b C], t: [C b]) -> [] = mse_loss(x, t)", "E0301", "`mse_loss`'s target must be [b C]"),
    ("fn f(x: [b C], t: [C]) -> [] = smooth_l1_loss(x, t)", "E0301", "`smooth_l1_loss`'s target must be [b C]"),
    ("fn f(x: [b C], t: [b C] bool) -> [] = binary_cross_entropy_with_logits(x, t)", "E0308",
     "`binary_cross_entropy_with_logits`'s target takes float tensors"),
    ("fn f(x: [b C], t: [b C]) -> [] = mse_loss(x, t, mask=x)", "E0308", "a mask is bool"),
    ("fn f(x: [b C], t: [b C], m: [D] bool) -> [] = mse_loss(x, t, mask=m)", "E0301", "the mask is [D] bool"),
    ("fn f(x: [b C], t: [b C]) -> [] = smooth_l1_loss(x, t, beta=-1.0)", "E0310",
     "`smooth_l1_loss`'s beta is at least 0"),
    ("fn f(x: [b C], t: [b C]) -> [] = smooth_l1_loss(x, t, beta=x)", "E0401", "`smooth_l1_loss`'s beta is a number"),
    ("fn f(x: [b C], t: [b C]) -> [b C] = mse_loss(x, t)", "E0305", ""),
    ("fn f(x: [b C], y: [b] i64) -> [] = nll_loss(x, y, over=C)", "E0309", "`nll_loss`'s labels must be `Index[C]`"),
    ("fn f(x: [b C], y: [b] Index[V]) -> [] = nll_loss(x, y, over=C)", "E0309", "but the classes are C"),
    ("fn f(x: [b C], y: [C] Index[C]) -> [] = nll_loss(x, y, over=C)", "E0301",
     "the log-probabilities without C"),
    ("fn f(x: [b C], y: [b] Index[C]) -> [] = nll_loss(x, y, over=D)", "E0303", "[b C] has no axis D"),
    ("fn f(x: [b C] i64, y: [b] Index[C]) -> [] = nll_loss(x, y, over=C)", "E0308", "`nll_loss` takes float"),
    ("fn f(x: [b C], y: [b] Index[C]) -> [] = nll_loss(x, y)", "E0206", ""),
    ("fn f(p: [b C], t: [b C]) -> [] = kl_div(p, t, over=D)", "E0303", "`kl_div` over D"),
    ("fn f(p: [b C], t: [b D]) -> [] = kl_div(p, t, over=C)", "E0301", "`kl_div`'s target must be [b C]"),
    ("fn f(p: [b C], t: [b C] f64) -> [] = kl_div(p, t, over=C)", "E0308", "`kl_div` of f32 and f64"),
    ("fn f(p: [b C], t: [b C], m: [b C] bool) -> [] = kl_div(p, t, over=C, mask=m)", "E0301",
     "the mask is [b C] bool, which doesn't fit [b]"),
    ("fn f(a: [b D], c: [b D]) -> [b] = cosine_similarity(a, c, over=V)", "E0303", "has no axis V"),
    ("fn f(a: [b D], c: [b C]) -> [b] = cosine_similarity(a, c, over=D)", "E0301",
     "`cosine_similarity`'s second argument must be [b D]"),
    ("fn f(a: [b D], c: [b D]) -> [b D] = cosine_similarity(a, c, over=D)", "E0305", ""),
    ("fn f(a: [b D], c: [b D]) -> [b] = cosine_similarity(a, c, over=D, eps=-1e-8)", "E0310", "eps is at least 0"),
    ("fn f(a: [b D] i64, c: [b D] i64) -> [b] = cosine_similarity(a, c, over=D)", "E0308", "takes float tensors"),
    ("fn f(a: [b D], c: [b D]) -> [b] = cosine_similarity(a, c)", "E0206", ""),
    ("fn f(x: [b C], t: [b C]) -> [] = mse_loss(mut x, t)", "E0503", "doesn't change `x`"),
]


@pytest.mark.parametrize("src, code, message", MISUSES, ids=[f"{m[1]}-{m[0].split('= ', 1)[1][:36]}" for m in MISUSES])
def test_a_misuse_is_a_compile_error(src: str, code: str, message: str) -> None:
    with pytest.raises(CompileError) as info:
        ss.load(DIMS + src + "\n", name="bad.ss")
    assert set(info.value.codes) == {code}, str(info.value)  # an error in each argument that has one
    assert message in info.value.diagnostics[0].message, str(info.value)


def test_sign_and_abs_of_bool() -> None:
    """torch has sign of bool (each value itself) but no abs of it: the entry's refused dtypes."""
    ss.load(DIMS + "fn f(x: [b C] bool) -> [b C] bool = sign(x)\n", name="ok.ss")
    with pytest.raises(CompileError) as info:
        ss.load(DIMS + "fn f(x: [b C] bool) -> [b C] bool = abs(x)\n", name="bad.ss")
    assert info.value.codes == ["E0308"]


# ---- across the batch axis and under the layout options ------------------------------------------

BATCH = DIMS + """dim H = 4

data Ex:
    x: [C] f64
    y: [C] f64
    label: [] Index[C]
    keep: [] bool

"""


def sent(source: str, devices: str | None = "cpu[0 1]") -> list[tuple[int, str, str, object]]:
    """What the DeviceTable says each line sends: (line, what, operation, values), in line order."""
    table = device_table(compile_program(source, "t.ss", devices))
    return [(line, item.collective.what, item.collective.op, item.collective.count)
            for line, items in sorted(table.lines.items()) for item in items if item.collective]


@pytest.mark.parametrize("call, name", [
    ("mse_loss(batch.x, batch.y)", "mse_loss"),
    ("l1_loss(batch.x, batch.y, mask=batch.keep)", "l1_loss"),
    ("smooth_l1_loss(batch.x, batch.y, beta=0.5)", "smooth_l1_loss"),
    ("binary_cross_entropy_with_logits(batch.x, sigmoid(batch.y), mask=batch.x > 0.0)", "binary_cross_entropy_with_logits"),
    ("nll_loss(log_softmax(batch.x, over=C), batch.label, over=C, mask=batch.keep)", "nll_loss"),
    ("kl_div(log_softmax(batch.x, over=C), softmax(batch.y, over=C), over=C)", "kl_div"),
])
def test_a_loss_over_the_batch_sends_its_sum_and_count(call: str, name: str) -> None:
    """Two numbers of the operands' dtype in one all-reduce, as cross_entropy and mean send."""
    assert sent(BATCH + f"fn f(batch: [b] Ex) -> [] f64 = {call}\n") == [(12, f"{name}'s sum and count", "all-reduce", 2)]


def test_kl_div_along_the_batch_axis_sends_each_distributions_parts() -> None:
    source = BATCH + "fn f(batch: [b] Ex) -> [] f64 = kl_div(batch.x, exp(batch.y), over=b)\n"
    assert sent(source) == [(12, "kl_div's partial sums of each distribution over the batch axis", "all-reduce", 4)]
    worker = next(text for text in _modules(source) if "def f(" in text)
    assert "_rt.all_sum(_F.kl_div(batch.x, torch.exp(batch.y), reduction=\"none\").sum(0)" in worker


def _modules(source: str) -> list[str]:
    from shapescript.lower.targets import Target
    from shapescript.pipeline import python_modules
    return python_modules(compile_program(source, "t.ss", "cpu[0 1]"), (Target.WORKER,))


def test_cosine_similarity_works_on_each_example_and_is_refused_along_the_batch_axis() -> None:
    assert sent(BATCH + "fn f(batch: [b] Ex) -> [b] f64 = cosine_similarity(batch.x, batch.y, over=C)\n") == []
    with pytest.raises(CompileError) as info:
        compile_program(BATCH + "fn f(batch: [b] Ex) -> [C] f64 = cosine_similarity(batch.x, batch.y, over=b)\n",
                        "t.ss", "cpu[0 1]")
    assert info.value.codes == ["E1801"] and "`cosine_similarity` across the batch axis" in str(info.value)


def test_the_elementwise_functions_send_nothing() -> None:
    body = " + ".join(f"{name}(batch.x)" for name, _ in UNARY) + " + log1p(abs(batch.x))"
    assert sent(BATCH + f"fn f(batch: [b] Ex) -> [b C] f64 = {body}\n") == []


LAYOUT = """dim D = 3
dim H = 4
dim C = 2

data Ex:
    x: [D] f64
    y: [H] f64

model Net:
    param w: [D H] f64 = normal(std=0.5)
    param v: [D H C] f64 = normal(std=0.5)

fn loss(m: Net, batch: [b] Ex) -> [] f64 = mse_loss(batch.x @ m.w, batch.y)
fn along_h(m: Net, batch: [b] Ex) -> [b] f64 = cosine_similarity(batch.x @ m.w, batch.y, over=H)
fn along_c(m: Net, batch: [b] Ex) -> [b H] f64 = cosine_similarity(batch.x @ m.v, sin(batch.x @ m.v), over=C)
"""
GATHERED = "a [b H] f64 whole from every device's part along H"


def test_under_split_h_a_loss_gathers_its_operands_and_cosine_similarity_gathers_only_along_h() -> None:
    """The loss takes its operands whole: the product and the batch's field, each cut to its heads, are
    gathered again; so are cosine_similarity's along H; along C each device works on its own heads."""
    table = sent("devices cpu[0 1]\n    split H\n\n" + LAYOUT, None)
    assert [(line, what, op) for line, what, op, _ in table] == [(16, GATHERED, "all-gather")] * 2 + [
        (17, GATHERED, "all-gather")] * 2


def test_under_shard_params_a_loss_sends_only_its_sum_and_count() -> None:
    """Only its param's pieces are gathered: the loss itself sends what it sends without the option."""
    table = sent("devices cpu[0 1]\n    shard params\n\n" + LAYOUT, None)
    assert [(line, what) for line, what, op, _ in table if op == "all-reduce"] == [(16, "mse_loss's sum and count")]
    assert {op for *_, op, _ in table} == {"all-reduce", "all-gather"}
