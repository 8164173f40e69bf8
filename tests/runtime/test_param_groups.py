"""`no_decay=`: AdamW and SGD with two param groups, against torch's own param groups written by
hand as nanoGPT writes them (weight decay on the 2-D params only), and through a checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from shapescript.errors import DomainError, ShapeError
from shapescript.runtime import checkpoint
from shapescript.runtime.autodiff import value_and_grad
from shapescript.runtime.model import Model, ModelSpec
from shapescript.runtime.optim import Optimizer, adamw, sgd, update

STEPS = 4


def loss_of(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """A loss that reads every param of the fixture NET (the f64 one too)."""
    h = ((x @ p["w0"]) @ p["enc.w"] + p["enc.b"]) * p["scale"]
    return h.pow(2).mean() + (p["w64"].sum() ** 2).float()


def inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(6, 5, generator=g) for _ in range(STEPS)]


def ours(spec: ModelSpec, make: Callable[[Model], Optimizer], xs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    m = Model.init(spec, seed=3)
    opt = make(m)
    for x in xs:
        _, g = value_and_grad(lambda m, x: loss_of(dict(m.named_params()), x), m, x)
        update(m, opt, g)
    return {n: t.detach().clone() for n, t in m.named_params()}


def by_hand(spec: ModelSpec, make: Callable[[list[dict]], torch.optim.Optimizer],
            xs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """nanoGPT's configure_optimizers: decay the params with 2 or more dims, not the others."""
    start = Model.init(spec, seed=3)
    p = {n: t.detach().clone().requires_grad_(True) for n, t in start.named_params()}
    decay = [t for t in p.values() if t.dim() >= 2]
    nodecay = [t for t in p.values() if t.dim() < 2]
    opt = make([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}])
    for x in xs:
        loss_of(p, x).backward()
        opt.step()
        opt.zero_grad()
    return {n: t.detach() for n, t in p.items()}


# The references use torch's fused kernels, as ours do on cpu (runtime/optim.py): the same
# arithmetic, so the params must agree to the bit.
KINDS = {
    "adamw": (lambda m, nd: adamw(m, lr=0.05, weight_decay=0.1, no_decay=nd),
              lambda groups: torch.optim.AdamW(groups, lr=0.05, fused=True)),
    "sgd": (lambda m, nd: sgd(m, lr=0.05, momentum=0.9, weight_decay=0.1, no_decay=nd),
            lambda groups: torch.optim.SGD(groups, lr=0.05, momentum=0.9, fused=True)),
}


@pytest.mark.parametrize("kind", KINDS)
def test_no_decay_is_torchs_param_groups(net: ModelSpec, kind: str) -> None:
    make, reference = KINDS[kind]
    xs = inputs()
    want = by_hand(net, reference, xs)
    by_function = ours(net, lambda m: make(m, lambda name, p: p.ndim < 2), xs)
    by_names = ours(net, lambda m: make(m, ["enc.b", "scale"]), xs)
    everything = ours(net, lambda m: make(m, None), xs)  # one group: every param decays
    for name, t in want.items():
        torch.testing.assert_close(by_function[name], t, rtol=0, atol=0)
        torch.testing.assert_close(by_names[name], t, rtol=0, atol=0)
    assert not torch.equal(everything["enc.b"], want["enc.b"])  # the groups made a difference


def test_the_function_sees_each_params_shape_without_values(net: ModelSpec) -> None:
    seen: list[tuple[str, tuple[int, ...], torch.dtype, str]] = []
    m = Model.init(net, seed=0)
    opt = adamw(m, no_decay=lambda name, p: seen.append((name, tuple(p.shape), p.dtype, p.device.type)) or False)
    assert seen == [(n, tuple(t.shape), t.dtype, "meta") for n, t in m.named_params()]
    assert opt.hyper["no_decay"] == [] and len(opt.torch_opt.param_groups) == 1


@pytest.mark.parametrize("no_decay, message", [
    (["scael"], "no_decay names 'scael', which is no trained param of Net (declared at mlp.ss:11:1); "
                "did you mean `scale`?"),
    # no name close: the params it has, rather than nothing (or a guess that isn't near)
    (["w9"], "no_decay names 'w9', which is no trained param of Net (declared at mlp.ss:11:1); "
             "its trained params are w0, enc.w, enc.b, scale, w64"),
    (lambda name, p: "yes", "no_decay('w0', p) must return True or False, not 'yes'"),
    ("scale", "no_decay must be a function (name, param) -> bool or a list of param names, not str"),
])
def test_a_wrong_no_decay_says_what_is_wrong(net: ModelSpec, no_decay: object, message: str) -> None:
    m = Model.init(net, seed=0)
    with pytest.raises(DomainError) as info:
        adamw(m, no_decay=no_decay)
    assert str(info.value) == f"adamw: {message}"


def test_with_no_close_name_the_hint_lists_the_params() -> None:
    from shapescript.runtime.optim import param_hint

    names = [f"p{k}" for k in range(8)]
    assert param_hint("zz", names) == "its trained params are p0, p1, p2, p3, p4, p5 and 2 more"
    assert param_hint("P3", names) == "did you mean `p3`?"  # names.similar, as every name lookup


def test_a_checkpoint_keeps_the_groups(net: ModelSpec, tmp_path: Path) -> None:
    """Save after two steps, restore into an optimizer made without groups, take two more: the
    same params as four steps without a break."""
    xs = inputs()
    straight = ours(net, lambda m: adamw(m, lr=0.05, weight_decay=0.1, no_decay=["enc.b", "scale"]), xs)
    m = Model.init(net, seed=3)
    opt = adamw(m, lr=0.05, weight_decay=0.1, no_decay=["enc.b", "scale"])
    step = lambda m, x: loss_of(dict(m.named_params()), x)  # noqa: E731
    for x in xs[:2]:
        update(m, opt, value_and_grad(step, m, x)[1])
    checkpoint.save(tmp_path / "c.safetensors", m, opt)
    fresh = Model.init(net, seed=99)
    plain = adamw(fresh, lr=0.05, weight_decay=0.1)
    checkpoint.load(tmp_path / "c.safetensors", fresh, plain)
    assert plain.hyper["no_decay"] == ["enc.b", "scale"]
    assert [g["weight_decay"] for g in plain.torch_opt.param_groups] == [0.1, 0.0]
    for x in xs[2:]:
        update(fresh, plain, value_and_grad(step, fresh, x)[1])
    for name, t in fresh.named_params():
        torch.testing.assert_close(t.detach(), straight[name], rtol=0, atol=0)


def test_a_checkpoint_naming_no_param_is_refused_and_changes_nothing(net: ModelSpec, tmp_path: Path) -> None:
    m = Model.init(net, seed=3)
    opt = adamw(m, no_decay=["scale"])
    checkpoint.save(tmp_path / "c.safetensors", m, opt)
    meta, tensors = checkpoint._read(str(tmp_path / "c.safetensors"))
    meta["hyper"]["no_decay"] = ["gone"]
    import json

    from safetensors.torch import save_file
    save_file(tensors, str(tmp_path / "bad.safetensors"), {checkpoint._META: json.dumps(meta)})
    other = Model.init(net, seed=4)
    other_opt = adamw(other)
    before = {n: t.clone() for n, t in other.named_params()}
    with pytest.raises(ShapeError, match="`hyper.no_decay` names 'gone'") as e:
        checkpoint.load(tmp_path / "bad.safetensors", other, other_opt)
    assert f"its trained params are {', '.join(n for n, _ in other.named_params())}" in str(e.value)  # a hint
    meta["hyper"]["no_decay"] = ["scal"]
    save_file(tensors, str(tmp_path / "near.safetensors"), {checkpoint._META: json.dumps(meta)})
    with pytest.raises(ShapeError, match="names 'scal'.*did you mean `scale`"):
        checkpoint.load(tmp_path / "near.safetensors", other, other_opt)
    assert all(torch.equal(t, before[n]) for n, t in other.named_params())
    assert other_opt.hyper["no_decay"] == [] and len(other_opt.torch_opt.param_groups) == 1
