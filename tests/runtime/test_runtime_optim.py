"""value_and_grad / update against hand-written torch training loops."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from shapescript.errors import DomainError, ShapeError
from shapescript.runtime.autodiff import value_and_grad
from shapescript.runtime.model import Model, ModelSpec
from shapescript.runtime.optim import Grads, adamw, sgd, update


def mlp_loss(m: Model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # As generated code reads a model: the live params (`m.w1` from Python is a copy).
    return F.cross_entropy(torch.relu(x @ m._m_w1) @ m._m_w2, y)


def data(steps: int, b: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(123)
    return [(torch.randn(b, 784, generator=g), torch.randint(0, 10, (b,), generator=g))
            for _ in range(steps)]


def reference_run(mlp: ModelSpec, make_opt: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
                  steps: int) -> tuple[list[float], list[torch.Tensor]]:
    """The textbook loop on independent copies of the same initial weights."""
    init = Model.init(mlp, seed=0)
    w1 = init.w1.detach().clone().requires_grad_(True)
    w2 = init.w2.detach().clone().requires_grad_(True)
    opt = make_opt([w1, w2])
    losses = []
    for x, y in data(steps):
        loss = F.cross_entropy(torch.relu(x @ w1) @ w2, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [w1.detach(), w2.detach()]


def shapescript_run(mlp: ModelSpec, make_opt: Callable[[Model], object], steps: int
                    ) -> tuple[list[float], list[torch.Tensor]]:
    m = Model.init(mlp, seed=0)
    opt = make_opt(m)
    losses = []
    for x, y in data(steps):
        loss, g = value_and_grad(mlp_loss, m, x, y)
        update(m, opt, g)  # type: ignore[arg-type]
        losses.append(loss.item())
    return losses, [p.detach() for p in m.params()]


CASES = {
    "adamw": (lambda ps: torch.optim.AdamW(ps, lr=1e-3),
              lambda m: adamw(m, lr=1e-3)),
    "adamw-hyper": (lambda ps: torch.optim.AdamW(ps, lr=3e-3, betas=(0.8, 0.99), eps=1e-6,
                                                 weight_decay=0.1),
                    lambda m: adamw(m, lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    "sgd-momentum": (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
                     lambda m: sgd(m, lr=0.05, momentum=0.9)),
    "sgd-nesterov-wd": (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True,
                                                   weight_decay=1e-3),
                        lambda m: sgd(m, lr=0.05, momentum=0.9, weight_decay=1e-3,
                                      nesterov=True)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_training_matches_hand_written_torch_loop(mlp: ModelSpec, case: str) -> None:
    ref_opt, our_opt = CASES[case]
    ref_losses, ref_params = reference_run(mlp, ref_opt, 10)
    losses, params = shapescript_run(mlp, our_opt, 10)
    assert losses == pytest.approx(ref_losses, abs=1e-6)
    init = Model.init(mlp, seed=0).params()
    assert not any(torch.equal(a, b) for a, b in zip(params, init))  # it did train
    for a, b in zip(params, ref_params):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_value_and_grad_against_autograd(mlp: ModelSpec) -> None:
    m = Model.init(mlp, seed=0)
    x, y = data(1)[0]
    v, g = value_and_grad(mlp_loss, m, x, y)
    assert v.ndim == 0 and not v.requires_grad
    ref = mlp_loss(m, x, y)
    ref_g = torch.autograd.grad(ref, m.params())
    assert torch.equal(v, ref.detach())
    assert isinstance(g, Grads) and g.model_spec is mlp
    assert all(torch.equal(a, b) for a, b in zip(g.tensors, ref_g))
    assert list(g.named()) == ["w1", "w2"] and g.named()["w2"] is g.tensors[1]
    assert m.params()[0].grad is None  # value_and_grad leaves no .grad behind


def test_value_and_grad_works_under_no_grad(mlp: ModelSpec) -> None:
    m = Model.init(mlp, seed=0)
    x, y = data(1)[0]
    with torch.no_grad():
        _, g = value_and_grad(mlp_loss, m, x, y)
    assert g.tensors[0].abs().sum() > 0


def test_unused_params_get_zero_grads(mlp: ModelSpec) -> None:
    m = Model.init(mlp, seed=0)
    _, g = value_and_grad(lambda m: (m._m_w2 ** 2).sum(), m)
    assert torch.equal(g.tensors[0], torch.zeros(784, 256))
    assert torch.equal(g.tensors[1], 2 * m.w2.detach())
    v, g = value_and_grad(lambda m: torch.tensor(3.0), m)  # depends on no param at all
    assert v.item() == 3.0 and all(t.abs().sum() == 0 for t in g.tensors)


def test_value_and_grad_refuses_a_non_scalar(mlp: ModelSpec) -> None:
    def per_row(m: Model) -> torch.Tensor:
        return m._m_w2.sum(0)
    with pytest.raises(ShapeError, match=r"per_row returned a \[10\] f32 tensor, expected a float "
                                         r"scalar \[\]"):
        value_and_grad(per_row, Model.init(mlp, seed=0))


def test_update_clears_grads_and_checks_the_model(mlp: ModelSpec) -> None:
    m, other = Model.init(mlp, seed=0), Model.init(mlp, seed=1)
    opt = adamw(m)
    _, g = value_and_grad(lambda m: m._m_w2.sum(), m)
    before = m.w2.detach().clone()
    update(m, opt, g)
    assert all(p.grad is None for p in m.params())
    assert not torch.equal(m.w2, before)
    with pytest.raises(ShapeError, match="optimizer was made for another Mlp model"):
        update(other, opt, g)


def test_optimizer_records_kind_and_hyper(mlp: ModelSpec) -> None:
    m = Model.init(mlp, seed=0)
    opt = adamw(m, lr=0.01)
    assert opt.kind == "AdamW" and opt.model is m and isinstance(opt.torch_opt, torch.optim.AdamW)
    assert opt.hyper == {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2, "no_decay": []}
    s = sgd(m)
    assert s.kind == "Sgd" and isinstance(s.torch_opt, torch.optim.SGD)
    assert s.torch_opt.param_groups[0]["params"][0] is m._leaf("w1")


def test_every_public_attribute_of_an_optimizer_is_documented(mlp: ModelSpec) -> None:
    """docs/api.md's Optimizers section names each (`opt.torch_opt`, `opt.hyper`, ...), and its
    example of `opt.hyper` is what ss.adamw(m) has."""
    import ast
    import re

    from support import ROOT

    from shapescript.parallel.remote import RemoteOptimizer
    from shapescript.runtime.optim import Optimizer

    api = (ROOT / "docs" / "api.md").read_text()
    section = " ".join(api.split("## Optimizers")[1].split("\n## ")[0].split())
    internal = {"param_order", "replace_settings"}  # what restores and checkpoints use
    public = {n for n in dir(Optimizer) if not n.startswith("_")} - internal
    assert {"torch_opt", "hyper", "kind", "model"} <= public
    assert [n for n in sorted(public) if f"`opt.{n}" not in section] == []
    shown = re.search(r"\(`(\{\"lr\": 0\.001.*?\})` for `ss\.adamw\(m\)`\)", section)
    assert shown is not None
    assert ast.literal_eval(shown.group(1)) == dict(adamw(Model.init(mlp, seed=0)).hyper)
    assert not hasattr(RemoteOptimizer, "torch_opt")  # as the section says: each worker holds its own


@pytest.mark.parametrize("ours, torchs", [(adamw, torch.optim.AdamW), (sgd, torch.optim.SGD)])
def test_a_broadcast_gradient_updates_every_element(mlp: ModelSpec, ours: Callable, torchs: type) -> None:
    """On cpu our optimizers run torch's fused kernels, which read a gradient whose strides are 0 (the
    gradient of a sum, as autograd.grad gives it) as if only its first element were set; `update`
    gives them the param's layout. Against torch's own loop (backward(), the default kernels)."""
    m = Model.init(mlp, seed=0)
    opt = ours(m, lr=0.05)
    assert opt.torch_opt.defaults["fused"]  # the kernels this test is about
    ref = [p.detach().clone().requires_grad_(True) for p in m.params()]
    ref_opt = torchs(ref, lr=0.05)
    for _ in range(3):
        _, g = value_and_grad(lambda m: (m._m_w1.sum() + m._m_w2.sum()) ** 2, m)
        assert g.tensors[0].stride() == (0, 0)  # what the kernels misread
        update(m, opt, g)
        ((ref[0].sum() + ref[1].sum()) ** 2).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    for a, b in zip(m.params(), ref):
        torch.testing.assert_close(a.detach(), b.detach(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("ours, torchs", [(adamw, torch.optim.AdamW), (sgd, torch.optim.SGD)])
def test_defaults_are_torchs(ours: Callable, torchs: type) -> None:
    """docs/api.md promises torch's defaults: each setting ss.adamw / ss.sgd take defaults to what
    the installed torch's optimizer does (sgd's lr was once 1e-2, torch's 1e-3)."""
    theirs = inspect.signature(torchs).parameters
    for name, param in inspect.signature(ours).parameters.items():
        if name not in ("m", "no_decay"):  # no_decay: ours, as param groups (None: one group)
            assert param.default == theirs[name].default, (ours.__name__, name)


@pytest.mark.parametrize("make,message", [
    (lambda m: adamw(m, lr=-1.0), "adamw: lr must be a finite number >= 0, not -1.0"),
    (lambda m: adamw(m, lr="fast"), "adamw: lr must be a finite number >= 0, not 'fast'"),
    (lambda m: adamw(m, lr=float("nan")), "adamw: lr must be a finite number >= 0, not nan"),
    (lambda m: adamw(m, eps=True), "adamw: eps must be a finite number >= 0, not True"),
    (lambda m: sgd(m, momentum=-0.5), "sgd: momentum must be a finite number >= 0, not -0.5"),
    (lambda m: adamw(m, betas=(1.5, 0.9)), "adamw: betas must be two numbers in [0, 1), not (1.5, 0.9)"),
    (lambda m: adamw(m, betas=(0.9,)), "adamw: betas must be two numbers in [0, 1), not (0.9,)"),
    (lambda m: sgd(m, nesterov=True), "sgd: nesterov can be True only with a momentum > 0 and no dampening"),
])
def test_bad_hyperparameters_are_domain_errors(mlp: ModelSpec, make: Callable, message: str) -> None:
    """Checked before torch sees them (torch lets a string or a betas of one number through to a raw
    TypeError or IndexError), by the same rules as a checkpoint's header."""
    with pytest.raises(DomainError) as info:
        make(Model.init(mlp, seed=0))
    assert str(info.value) == message


def test_ctrl_c_during_a_step_waits_for_its_end(mlp: ModelSpec) -> None:
    import os
    import signal
    import time

    m = Model.init(mlp, seed=0)
    opt = adamw(m, lr=0.1)
    x, y = data(1)[0]
    _, g = value_and_grad(mlp_loss, m, x, y)
    before = [p.detach().clone() for p in m.params()]
    step = opt.torch_opt.step

    def interrupted_step() -> None:  # Ctrl-C arrives after the first param's update, before the second's
        with torch.no_grad():
            m.params()[0].sub_(1.0)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the signal is handled here, between bytecodes
        with torch.no_grad():
            m.params()[1].sub_(1.0)

    opt.torch_opt.step = interrupted_step  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        update(m, opt, g)
    opt.torch_opt.step = step  # type: ignore[method-assign]
    assert all(torch.equal(p.detach(), b - 1.0) for p, b in zip(m.params(), before))  # both, not one
    with pytest.raises(KeyboardInterrupt):  # after the step, Ctrl-C is Python's own again
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
