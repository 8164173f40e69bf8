"""Adam, RMSprop, Adagrad and Adadelta beside AdamW and SGD; lr schedules; `opt.set`. Each against
torch's own optimizer driven by hand, as nanoGPT's train.py drives it (the lr written into every
param group before each step), in f64; the schedules against nanoGPT's get_lr and torch's
StepLR/LinearLR; the position and the settings through a checkpoint."""

from __future__ import annotations

import importlib.util
import json
import math
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from support import ROOT

import shapescript as ss
from shapescript.errors import DomainError, ShapeError
from shapescript.runtime import checkpoint, recorded
from shapescript.runtime.autodiff import value_and_grad
from shapescript.runtime.model import Model, ModelSpec, ParamSpec
from shapescript.runtime.optim import Optimizer, update

_SPEC = importlib.util.spec_from_file_location("nanogpt_train_reference", ROOT / "examples" / "nanogpt" / "train_reference.py")
assert _SPEC is not None and _SPEC.loader is not None
TRAIN_REFERENCE = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = TRAIN_REFERENCE  # its dataclasses look their module up there
_SPEC.loader.exec_module(TRAIN_REFERENCE)

F64 = torch.float64
SPEC = ModelSpec("Net", (ParamSpec("w", "param", (5, 3), F64, "normal", (("std", 0.5),), "net.ss:2:5"),
                         ParamSpec("b", "param", (3,), F64, "normal", (("std", 0.5),), "net.ss:3:5")), "net.ss:1:1")
STEPS = 12


def loss_of(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (torch.tanh(x @ w + b) - 0.3).pow(2).mean() + 0.1 * w.abs().sum()


def inputs(n: int = STEPS) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return [torch.randn(7, 5, generator=g, dtype=F64) for _ in range(n)]


def nanogpt_lr(it: int, learning_rate: float, warmup_iters: int, lr_decay_iters: int, min_lr: float) -> float:
    """nanoGPT's get_lr (train.py), as examples/nanogpt/train_reference.py transcribes it."""
    return TRAIN_REFERENCE.get_lr(it, learning_rate=learning_rate, warmup_iters=warmup_iters,
                                  lr_decay_iters=lr_decay_iters, min_lr=min_lr)


def train(m: Model, opt: Optimizer, xs: list[torch.Tensor]) -> None:
    for x in xs:
        _, g = value_and_grad(lambda m, x: loss_of(*(t for _, t in m.named_params()), x), m, x)
        update(m, opt, g)


def by_hand(make: Callable[[list[dict[str, Any]]], torch.optim.Optimizer], xs: list[torch.Tensor],
            lr_of: Callable[[int], float], decays: bool) -> dict[str, torch.Tensor]:
    """torch's optimizer on the same start, `b` without weight decay where `decays`, the lr of each
    step set in every group first."""
    start = Model.init(SPEC, seed=4)
    w, b = (t.detach().clone().requires_grad_(True) for t in (start.w, start.b))
    groups = [{"params": [w]}, {"params": [b], "weight_decay": 0.0}] if decays else [{"params": [w, b]}]
    opt = make(groups)
    for it, x in enumerate(xs):
        for group in opt.param_groups:
            group["lr"] = lr_of(it)
        loss_of(w, b, x).backward()
        opt.step()
        opt.zero_grad()
    return {"w": w.detach(), "b": b.detach()}


SCHEDULE = ss.schedules.warmup_cosine(0.05, warmup=3, decay_until=9, floor=0.005)

# Each kind with settings away from the defaults, and torch's optimizer with the same ones. Where
# ours runs torch's fused CPU kernel (AdamW, Adam, SGD, Adagrad) the reference does too: the same
# arithmetic, so the params agree to the bit.
KINDS: dict[str, tuple[Callable[..., Optimizer], dict[str, Any], Callable[..., torch.optim.Optimizer], dict[str, Any]]] = {
    "adamw": (ss.adamw, {"betas": (0.8, 0.95), "weight_decay": 0.1}, torch.optim.AdamW, {"fused": True}),
    "adam": (ss.adam, {"betas": (0.8, 0.95), "weight_decay": 0.1, "eps": 1e-6}, torch.optim.Adam, {"fused": True}),
    "sgd": (ss.sgd, {"momentum": 0.9, "weight_decay": 0.1, "nesterov": True}, torch.optim.SGD, {"fused": True}),
    "rmsprop": (ss.rmsprop, {"alpha": 0.9, "momentum": 0.5, "centered": True, "weight_decay": 0.1},
                torch.optim.RMSprop, {}),
    "adagrad": (ss.adagrad, {"lr_decay": 0.01, "initial_accumulator_value": 0.1, "weight_decay": 0.1},
                torch.optim.Adagrad, {"fused": True}),
    "adadelta": (ss.adadelta, {"rho": 0.8, "weight_decay": 0.1}, torch.optim.Adadelta, {}),
}


@pytest.mark.parametrize("kind", KINDS)
def test_each_optimizer_with_a_schedule_and_param_groups_is_torchs(kind: str) -> None:
    make, settings, reference, flags = KINDS[kind]
    xs = inputs()
    want = by_hand(lambda groups: reference(groups, **settings, **flags, lr=1.0), xs,
                   lambda it: nanogpt_lr(it, 0.05, 3, 9, 0.005), decays=True)
    m = Model.init(SPEC, seed=4)
    opt = make(m, lr=SCHEDULE, no_decay=["b"], **settings)
    assert opt.steps == 0 and opt.lr == SCHEDULE.at(0)
    train(m, opt, xs)
    assert opt.steps == STEPS
    for name, t in want.items():
        torch.testing.assert_close(getattr(m, name).detach(), t, rtol=0, atol=0)
    # with a fixed lr and one group, torch's defaults: our maker's defaults are torch's (but AdamW's lr)
    m = Model.init(SPEC, seed=4)
    opt = make(m, lr=0.01)
    train(m, opt, xs[:4])
    plain = by_hand(lambda groups: reference(groups, lr=0.01, **flags), xs[:4], lambda it: 0.01, decays=False)
    for name, t in plain.items():
        torch.testing.assert_close(getattr(m, name).detach(), t, rtol=0, atol=0)


def test_warmup_cosine_is_nanogpts_get_lr() -> None:
    s = ss.schedules.warmup_cosine(6e-4, warmup=20, decay_until=600, floor=6e-5)
    for it in [*range(0, 40), 299, 300, 599, 600, 601, 10_000]:
        assert s.at(it) == pytest.approx(nanogpt_lr(it, 6e-4, 20, 600, 6e-5), rel=1e-15, abs=0)
    zero = ss.schedules.warmup_cosine(1.0, warmup=0, decay_until=4)
    assert zero.at(0) == 1.0 and zero.at(4) == pytest.approx(0.0, abs=1e-16) and zero.at(5) == 0.0


def torch_lrs(make_scheduler: Callable[[torch.optim.Optimizer], Any], lr: float, n: int) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = make_scheduler(opt)
    seen = []
    for _ in range(n):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    return seen


def test_step_and_linear_are_torchs_step_lr_and_linear_lr() -> None:
    step = ss.schedules.step(0.1, every=3, factor=0.5)
    assert [step.at(k) for k in range(10)] == pytest.approx(
        torch_lrs(lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5), 0.1, 10), rel=1e-12)
    linear = ss.schedules.linear(0.02, 0.1, steps=5)  # start = 0.1 * 0.2
    assert [linear.at(k) for k in range(9)] == pytest.approx(torch_lrs(
        lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.2, end_factor=1.0, total_iters=5), 0.1, 9),
        rel=1e-12)
    assert ss.schedules.constant(0.3).at(10**9) == 0.3


@pytest.mark.parametrize(("make", "message"), [
    (lambda: ss.schedules.warmup_cosine(1e-3, warmup=10, decay_until=10), "must come after the warmup"),
    (lambda: ss.schedules.warmup_cosine(-1e-3, warmup=1, decay_until=10), "peak must be a finite number >= 0"),
    (lambda: ss.schedules.warmup_cosine(1e-3, warmup=1.5, decay_until=10), "warmup must be a whole number"),
    (lambda: ss.schedules.linear(1e-3, math.nan, steps=3), "end must be a finite number"),
    (lambda: ss.schedules.linear(1e-3, 0.0, steps=0), "steps must be a whole number >= 1"),
    (lambda: ss.schedules.step(10**400, every=2), "start must be a finite number"),
    (lambda: ss.schedules.step(0.1, every=True), "every must be a whole number"),
    (lambda: ss.schedules.constant("0.1"), "lr must be a finite number"),
])
def test_a_schedule_is_checked_when_made(make: Callable[[], Any], message: str) -> None:
    with pytest.raises(DomainError, match=message):
        make()


def test_set_changes_a_setting_from_the_next_update_and_keeps_the_state() -> None:
    """nanoGPT changes lr in the param groups between steps; `opt.set` does, keeping AdamW's moments
    (a new optimizer would start them again)."""
    xs = inputs(6)
    lrs = [0.05, 0.05, 0.05, 0.01, 0.01, 0.01]
    want = by_hand(lambda groups: torch.optim.AdamW(groups, lr=1.0, weight_decay=0.2, fused=True), xs,
                   lambda it: lrs[it], decays=False)
    m = Model.init(SPEC, seed=4)
    opt = ss.adamw(m, lr=0.05, weight_decay=0.2)
    train(m, opt, xs[:3])
    opt.set(lr=0.01)
    assert opt.hyper["lr"] == 0.01 and opt.lr == 0.01 and opt.steps == 3
    train(m, opt, xs[3:])
    for name, t in want.items():
        torch.testing.assert_close(getattr(m, name).detach(), t, rtol=0, atol=0)
    opt.set(lr=ss.schedules.constant(0.2), weight_decay=0.0)  # a schedule too
    assert opt.lr == 0.2 and all(g["weight_decay"] == 0.0 for g in opt.torch_opt.param_groups)


def test_the_groups_without_decay_keep_none_when_weight_decay_changes() -> None:
    m = Model.init(SPEC, seed=4)
    opt = ss.adamw(m, lr=0.05, weight_decay=0.2, no_decay=["b"])
    opt.set(weight_decay=0.5)
    assert [g["weight_decay"] for g in opt.torch_opt.param_groups] == [0.5, 0.0]
    everything = ss.adamw(m, lr=0.05, no_decay=["w", "b"])  # its only group is the one without decay
    everything.set(weight_decay=0.5)
    assert [g["weight_decay"] for g in everything.torch_opt.param_groups] == [0.0]


def test_settings_are_changed_by_set_or_refused_never_ignored() -> None:
    m = Model.init(SPEC, seed=4)
    opt = ss.adamw(m, lr=0.05)
    with pytest.raises(TypeError, match=r"opt.set\(lr=...\)"):
        opt.hyper["lr"] = 0  # type: ignore[index]
    with pytest.raises(TypeError, match="opt.set"):
        opt.hyper.update(lr=0)
    with pytest.raises(DomainError, match="has no setting 'momentun'"):
        ss.sgd(m).set(momentun=0.9)
    with pytest.raises(DomainError, match="lr must be a number or a schedule"):
        opt.set(lr={"schedule": "cosine"})
    with pytest.raises(DomainError, match="lr must be a finite number >= 0"):
        opt.set(lr=-1)
    with pytest.raises(DomainError, match="no_decay groups the params when the optimizer is made"):
        opt.set(no_decay=["b"])
    with pytest.raises(DomainError, match="nesterov can be True only with a momentum > 0"):
        ss.sgd(m, momentum=0.9, nesterov=True).set(momentum=0.0)
    rms = ss.rmsprop(m)
    train(m, rms, inputs(1))
    with pytest.raises(DomainError, match="momentum can't be turned on after the first update"):
        rms.set(momentum=0.9)
    assert rms.hyper["lr"] == 0.01 and opt.hyper["lr"] == 0.05 and rms.hyper["momentum"] == 0.0  # unchanged


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_keeps_the_schedules_position(kind: str, tmp_path: Path) -> None:
    """Ten updates, saved after five and restored into a fresh model and optimizer (made with another
    lr), equal ten straight ones: the schedule and its position come back with the state."""
    make, settings, _, _ = KINDS[kind]
    xs = inputs(10)
    straight = Model.init(SPEC, seed=4)
    train(straight, make(straight, lr=SCHEDULE, no_decay=["b"], **settings), xs)
    first = Model.init(SPEC, seed=4)
    opt = make(first, lr=SCHEDULE, no_decay=["b"], **settings)
    train(first, opt, xs[:5])
    ss.save(tmp_path / "half.safetensors", first, opt)
    meta = checkpoint._read(str(tmp_path / "half.safetensors"))[0]
    assert meta["steps"] == 5 and meta["hyper"]["lr"] == {"schedule": "warmup_cosine", **SCHEDULE.settings()}
    fresh = Model.init(SPEC, seed=99)
    again = make(fresh, lr=0.5, **settings)
    ss.restore(tmp_path / "half.safetensors", fresh, again)
    assert again.steps == 5 and again.hyper["lr"] == SCHEDULE and again.hyper["no_decay"] == ["b"]
    train(fresh, again, xs[5:])
    for name in ("w", "b"):
        torch.testing.assert_close(getattr(fresh, name), getattr(straight, name), rtol=0, atol=0)


def rewrite_header(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """The checkpoint at `path` with its ShapeScript header changed by `change` (safetensors: an 8-byte
    length, the JSON header, the data)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = json.loads(header["__metadata__"]["shapescript"])
    change(meta)
    header["__metadata__"]["shapescript"] = json.dumps(meta)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


@pytest.mark.parametrize(("change", "error", "message"), [
    (lambda meta: meta.update(steps=-1), DomainError, "`steps` must be a whole number >= 0"),
    (lambda meta: meta.update(steps="5"), DomainError, "`steps` must be a whole number >= 0"),
    (lambda meta: meta["hyper"].update(lr={"schedule": "warmup_cosine", "peak": 1.0}), DomainError,
     "the warmup_cosine schedule needs"),
    (lambda meta: meta["hyper"].update(lr={"schedule": "step", "start": 0.1, "every": 0}), DomainError,
     "every must be a whole number >= 1"),
    (lambda meta: meta["hyper"].update(rho=1.5), DomainError, "rho must be a number in \\[0, 1\\]"),
    (lambda meta: meta.update(optimizer="Adam"), ShapeError, "of kind Adam, not Adadelta"),
])
def test_a_checkpoints_settings_and_position_are_checked_before_anything_changes(
        tmp_path: Path, change: Callable[[dict[str, Any]], None], error: type[Exception], message: str) -> None:
    m = Model.init(SPEC, seed=4)
    opt = ss.adadelta(m, lr=ss.schedules.step(0.5, every=2))
    train(m, opt, inputs(3))
    path = tmp_path / "c.safetensors"
    ss.save(path, m, opt)
    rewrite_header(path, change)
    fresh = Model.init(SPEC, seed=5)
    other = ss.adadelta(fresh, lr=0.1)
    before = fresh.w.detach().clone()
    with pytest.raises(error, match=message):
        ss.restore(path, fresh, other)
    assert torch.equal(fresh.w.detach(), before) and other.steps == 0 and other.hyper["lr"] == 0.1


def test_a_checkpoints_state_must_be_its_kinds(tmp_path: Path) -> None:
    """An Adagrad's sum below 0, or an RMSprop with momentum whose state has no momentum buffer:
    refused, as torch would make NaNs of the one and fail at the next step on the other."""
    m = Model.init(SPEC, seed=4)
    opt = ss.adagrad(m)
    train(m, opt, inputs(2))
    path = tmp_path / "a.safetensors"
    ss.save(path, m, opt)
    from safetensors.torch import load_file, save_file
    tensors = load_file(path)
    tensors["opt.w.sum"] = -tensors["opt.w.sum"] - 1
    meta = checkpoint._read(str(path))[0]
    save_file(tensors, str(path), metadata={"shapescript": json.dumps(meta)})
    with pytest.raises(DomainError, match="`opt.w.sum` must be >= 0 everywhere"):
        ss.restore(path, m, ss.adagrad(m))
    rms = ss.rmsprop(m, momentum=0.5)
    train(m, rms, inputs(1))
    ss.save(path, m, rms)
    rewrite_header(path, lambda meta: meta["hyper"].update(momentum=0.0))
    ss.restore(path, m, ss.rmsprop(m))  # a setting turned off may leave its state
    tensors = load_file(path)
    del tensors["opt.w.momentum_buffer"]
    meta = checkpoint._read(str(path))[0]
    meta["hyper"]["momentum"] = 0.5
    save_file(tensors, str(path), metadata={"shapescript": json.dumps(meta)})
    with pytest.raises(ShapeError, match="the Rmsprop state of `w` has"):
        ss.restore(path, m, ss.rmsprop(m))


def test_recorded_steps_refuse_a_schedule_and_a_step_count_kept_on_the_cpu() -> None:
    """A CUDA graph replays the lr it captured, and Adagrad can't keep its step count on the device:
    such calls run eagerly (runtime/recorded.py's signature says why)."""
    m = Model.init(SPEC, seed=4)
    assert "schedule" in str(recorded.signature([m, ss.adamw(m, lr=SCHEDULE)]))
    assert "counts its steps on the CPU" in str(recorded.signature([m, ss.adagrad(m)]))
    assert isinstance(recorded.signature([m, ss.adam(m)]), tuple)
    assert isinstance(recorded.signature([m, ss.sgd(m)]), tuple)
