"""AdamW's fused kernel called without torch.optim's step() (runtime/fused_step.py): the same bits
as step(), step() itself wherever it would do more, and update() taking the short way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from shapescript.runtime import fused_step
from shapescript.runtime.autodiff import value_and_grad
from shapescript.runtime.model import Model, ModelSpec
from shapescript.runtime.optim import adamw, update


def counted(opt: torch.optim.Optimizer) -> list[int]:
    """Count the calls of this optimizer's own step() (an attribute of the instance shadows the class's)."""
    calls = [0]
    step = opt.step

    def counting(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        return step(*args, **kw)
    opt.step = counting  # type: ignore[method-assign]
    return calls


def twins(groups: Callable[[list[torch.Tensor]], list[dict[str, Any]]], dtypes: tuple[torch.dtype, ...] = (torch.float32,) * 3,
          **settings: Any) -> tuple[list[torch.Tensor], torch.optim.AdamW, list[torch.Tensor], torch.optim.AdamW]:
    """The same params twice, each with its own fused AdamW."""
    g = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    base = [torch.randn(s, generator=g).to(d) for s, d in zip(shapes, dtypes)]
    ours = [t.clone().requires_grad_(True) for t in base]
    theirs = [t.clone().requires_grad_(True) for t in base]
    return (ours, torch.optim.AdamW(groups(ours), fused=True, **settings),
            theirs, torch.optim.AdamW(groups(theirs), fused=True, **settings))


def run(ours: list[torch.Tensor], opt: torch.optim.AdamW, theirs: list[torch.Tensor], ref: torch.optim.AdamW,
        steps: int = 6) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for a, b in zip(ours, theirs):
            a.grad = torch.randn(a.shape, generator=g).to(a.dtype)
            b.grad = a.grad.clone()
        fused_step.optimizer_step(opt)
        ref.step()


def assert_same_bits(ours: list[torch.Tensor], opt: torch.optim.AdamW, theirs: list[torch.Tensor],
                     ref: torch.optim.AdamW) -> None:
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
        assert not torch.equal(a, b.new_zeros(b.shape))
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[a][key], ref.state[b][key]), key
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == \
           [{k: v for k, v in g.items() if k != "params"} for g in ref.param_groups]


ONE_GROUP = lambda ps: [{"params": ps}]  # noqa: E731
TWO_GROUPS = lambda ps: [{"params": ps[:2]}, {"params": ps[2:], "weight_decay": 0.0, "lr": 3e-3}]  # noqa: E731


@pytest.mark.parametrize("groups", [ONE_GROUP, TWO_GROUPS], ids=["one group", "two groups"])
def test_the_kernel_alone_gives_steps_bits(groups: Callable) -> None:
    ours, opt, theirs, ref = twins(groups, lr=2e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    calls = counted(opt)
    run(ours, opt, theirs, ref)
    assert calls == [1]  # the first step makes the state; the rest are the kernel's alone
    assert_same_bits(ours, opt, theirs, ref)
    assert opt.state[ours[0]]["step"].item() == 6


@pytest.mark.parametrize("why", ["a step hook", "amsgrad", "maximize", "two dtypes in a group", "a param without a gradient"])
def test_step_runs_wherever_it_would_do_more(why: str) -> None:
    settings = {"amsgrad": True} if why == "amsgrad" else {"maximize": True} if why == "maximize" else {}
    dtypes = (torch.float32, torch.float64, torch.float32) if why == "two dtypes in a group" else (torch.float32,) * 3
    ours, opt, theirs, ref = twins(ONE_GROUP, dtypes, **settings)
    hooked: list[int] = []
    if why == "a step hook":
        opt.register_step_pre_hook(lambda *_: hooked.append(1))
    calls = counted(opt)
    run(ours, opt, theirs, ref, steps=2)
    if why == "a param without a gradient":
        ours[1].grad = theirs[1].grad = None
        for a, b in zip(ours, theirs):
            if a.grad is not None:
                b.grad = a.grad.clone()
        fused_step.optimizer_step(opt)  # its second step went the short way; this one can't
        ref.step()
    assert calls == [2]
    assert hooked == ([1, 1] if why == "a step hook" else [])
    assert_same_bits(ours, opt, theirs, ref)


def test_update_takes_the_kernel_alone_and_trains_as_torch_does(mlp: ModelSpec) -> None:
    m = Model.init(mlp, seed=0)
    opt = adamw(m, lr=1e-3)
    calls = counted(opt.torch_opt)
    w1, w2 = (p.detach().clone().requires_grad_(True) for p in m.params())
    ref = torch.optim.AdamW([w1, w2], lr=1e-3, fused=True)
    g = torch.Generator().manual_seed(2)
    for _ in range(4):
        x, y = torch.randn(16, 784, generator=g), torch.randint(0, 10, (16,), generator=g)
        _, grads = value_and_grad(lambda m, x, y: F.cross_entropy(torch.relu(x @ m._m_w1) @ m._m_w2, y), m, x, y)
        update(m, opt, grads)
        F.cross_entropy(torch.relu(x @ w1) @ w2, y).backward()
        ref.step()
        ref.zero_grad()
    assert calls == [1]
    assert all(p.grad is None for p in m.params())
    for a, b in zip(m.params(), (w1, w2)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)  # autograd.grad against backward(): rounding
