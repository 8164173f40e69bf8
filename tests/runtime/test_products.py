"""runtime/products.py: `@` between a stack of rows and a matrix, sent to oneDNN where the rule says.
Each product, and the gradients of both operands, agree with a float64 reference within float32
rounding; the products the rule keeps for torch are torch's to the bit and never reach oneDNN; and
turned off (or with torch's oneDNN disabled) `matmul` is `@`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from shapescript.runtime import products
from shapescript.runtime.products import choose, matmul, onednn_for, onednn_for_weight_grad

needs_onednn = pytest.mark.skipif(products._LINEAR is None, reason="this torch has no oneDNN linear kernel here")


@pytest.fixture
def onednn_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The rule on whatever the CPU, and every call of oneDNN's kernel recorded (its input's shape)."""
    calls: list[tuple[int, ...]] = []
    kernel: Callable[..., Any] = products._LINEAR  # type: ignore[assignment]

    def counted(x: torch.Tensor, *rest: Any) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return kernel(x, *rest)

    monkeypatch.setattr(products, "ENABLED", True)
    monkeypatch.setattr(products, "_LINEAR", counted)
    return calls


def reference(a: torch.Tensor, b: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """a @ b and the gradients of a and b for `grad`, in float64 by torch's own autograd."""
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    out = a64 @ b64
    ga, gb = torch.autograd.grad(out, (a64, b64), grad.double())
    return out, ga, gb


def assert_near(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal within float32 rounding of sums of a few hundred terms, relative to the largest value."""
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert (got.double() - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def assert_torchs_to_the_bit(a: torch.Tensor, b: torch.Tensor) -> None:
    """matmul(a, b) and both its gradients are exactly what torch's `@` and autograd give."""
    out = matmul(a, b)
    ga, gb = torch.autograd.grad(out, (a, b), torch.ones_like(out))
    a2, b2 = a.detach().requires_grad_(), b.detach().requires_grad_()
    want = a2 @ b2
    want_ga, want_gb = torch.autograd.grad(want, (a2, b2), torch.ones_like(want))
    assert torch.equal(out, want) and torch.equal(ga, want_ga) and torch.equal(gb, want_gb)


CASES = {  # a's shape, b's shape, what oneDNN runs: the product, and the gradients' products
    "layer": ((512, 784), (784, 256)),  # as the README MLP's first layer: product, a's gradient
    "narrow": ((1024, 256), (256, 10)),  # a classifier's head: product and b's gradient (n = 10)
    "rows of a stack": ((4, 128, 512), (512, 300)),  # [b t D] @ [D H]: the rows of every item
}


@needs_onednn
@pytest.mark.parametrize("case", list(CASES))
def test_products_and_their_gradients_agree_with_a_float64_reference(case: str, onednn_calls: list) -> None:
    torch.manual_seed(0)
    shape_a, shape_b = CASES[case]
    a = torch.randn(shape_a, requires_grad=True)
    b = (torch.randn(shape_b) / shape_b[0] ** 0.5).requires_grad_()
    out = matmul(a, b)
    grad = torch.randn_like(out)
    ga, gb = torch.autograd.grad(out, (a, b), grad)
    want, want_ga, want_gb = reference(a, b, grad)
    for got, expected in ((out, want), (ga, want_ga), (gb, want_gb)):
        assert_near(got, expected)
    assert gb.is_contiguous() and ga.shape == a.shape  # laid out as the operands: the optimizer's kernels need it
    rows = a.numel() // shape_a[-1]
    assert onednn_calls[0] == (rows, shape_a[-1])  # the product itself
    # a's gradient [rows n] @ [n k], and b's (as the rule says for its sizes), by oneDNN too
    k, n = shape_b
    assert ((rows, n) in onednn_calls) == onednn_for(rows, n, k)
    assert ((n, rows) in onednn_calls) == onednn_for_weight_grad(rows, k, n)


@needs_onednn
def test_a_gradient_of_a_gradient_is_torchs(onednn_calls: list) -> None:
    torch.manual_seed(1)
    a = torch.randn(512, 300, requires_grad=True)
    b = torch.randn(300, 20, requires_grad=True)

    def second(product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        (gb,) = torch.autograd.grad(product(torch.tanh(a), b).pow(2).sum(), b, create_graph=True)
        (gaa,) = torch.autograd.grad(gb.pow(2).sum(), a)
        return gaa

    got = second(matmul)
    assert onednn_calls  # the first product was oneDNN's
    want = second(lambda x, y: x.double() @ y.double())
    assert_near(got, want)


@needs_onednn
@pytest.mark.parametrize("shape_a, shape_b", [
    ((64, 784), (784, 256)),  # few rows (a batch of 64 on one device): MKL is as quick
    ((4096, 12), (12, 32)),  # a short inner axis: oneDNN's call costs more than the product
    ((300, 256), (256, 10)),  # under 2**21 multiply-adds
])
def test_products_the_rule_keeps_for_torch_are_torchs_to_the_bit(shape_a: tuple, shape_b: tuple,
                                                                  onednn_calls: list) -> None:
    torch.manual_seed(2)
    a, b = torch.randn(shape_a, requires_grad=True), torch.randn(shape_b, requires_grad=True)
    assert_torchs_to_the_bit(a, b)
    assert onednn_calls == []


@needs_onednn
@pytest.mark.parametrize("why", ["float64", "an int tensor", "a batched matrix", "oneDNN disabled", "turned off"])
def test_matmul_is_torchs_product_outside_the_rule(why: str, onednn_calls: list,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(3)
    a, b = torch.randn(1024, 512), torch.randn(512, 512)
    if why == "float64":
        a, b = a.double(), b.double()
    elif why == "an int tensor":
        a, b = a.long(), b.long()
    elif why == "a batched matrix":  # b of rank 3: torch's batched product
        a, b = a.view(2, 512, 512), b.expand(2, 512, 512)
    elif why == "turned off":
        monkeypatch.setattr(products, "ENABLED", False)
    if why == "oneDNN disabled":  # torch.backends.mkldnn.enabled = False: the user's word for every op
        monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    assert torch.equal(matmul(a, b), a @ b)
    assert onednn_calls == []


@needs_onednn
def test_without_autograd_and_in_inference_mode_the_product_is_oneDNNs(onednn_calls: list) -> None:
    torch.manual_seed(4)
    a, b = torch.randn(512, 784), torch.randn(784, 256)
    want, _, _ = reference(a, b, torch.zeros(512, 256))
    with torch.inference_mode():
        got = matmul(a, b)
    assert_near(got, want)
    assert_near(matmul(a.t().contiguous().t(), b), want)  # a non-contiguous a: made contiguous first
    assert len(onednn_calls) == 2


def test_the_rule_is_the_documented_one() -> None:
    """The boundaries runtime/products.py's note states: m >= 256, k >= 256, m k n >= 2**21 for a
    product; n <= 16, m >= 256, m k >= 2**16 for a weight's gradient."""
    assert onednn_for(256, 256, 32) and not onednn_for(255, 256, 64) and not onednn_for(256, 255, 64)
    assert not onednn_for(256, 256, 31)  # 2,031,616 multiply-adds
    assert onednn_for(3072, 784, 256) and onednn_for(3072, 256, 10) and not onednn_for(32, 784, 256)
    assert onednn_for_weight_grad(256, 256, 10) and not onednn_for_weight_grad(256, 256, 17)
    assert not onednn_for_weight_grad(255, 1024, 10) and not onednn_for_weight_grad(256, 255, 10)


def test_the_choice_follows_the_setting_and_the_vendor() -> None:
    """Auto: AMD CPUs only (where it was measured); `onednn` and `torch` whatever the CPU; never
    without the kernel."""
    assert choose("auto", "AuthenticAMD", True) and not choose("auto", "GenuineIntel", True)
    assert choose("onednn", "GenuineIntel", True) and not choose("torch", "AuthenticAMD", True)
    assert not choose("onednn", "AuthenticAMD", False) and not choose("auto", "", True)


@needs_onednn
def test_a_product_oneDNN_refuses_is_torchs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should oneDNN's kernel raise for some layout or size, the product (and its gradients) are
    torch's, not an error from inside the runtime."""
    def refusing(*_: Any) -> torch.Tensor:
        raise RuntimeError("oneDNN: unsupported")

    monkeypatch.setattr(products, "ENABLED", True)
    monkeypatch.setattr(products, "_LINEAR", refusing)
    torch.manual_seed(5)
    a, b = torch.randn(1024, 256, requires_grad=True), torch.randn(256, 10, requires_grad=True)
    assert_torchs_to_the_bit(a, b)
