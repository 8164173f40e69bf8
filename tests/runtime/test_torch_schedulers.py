"""torch.optim.lr_scheduler's schedulers driving ss.adamw and ss.sgd on one device (`ss.lr_scheduler`):
each against the same scheduler driving torch's own optimizer on an equal param list in f64, the lr
of every step and the params after; their state through a checkpoint, which continues as a run
never interrupted; what a checkpoint refuses to hold or to load."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim import lr_scheduler as L

import shapescript as ss
from shapescript.errors import DomainError, ShapeError
from shapescript.runtime.autodiff import value_and_grad
from shapescript.runtime.model import Model, ModelSpec, ParamSpec
from shapescript.runtime.optim import Optimizer, update

F64 = torch.float64
SPEC = ModelSpec("Net", (ParamSpec("w", "param", (5, 3), F64, "normal", (("std", 0.5),), "net.ss:2:5"),
                         ParamSpec("b", "param", (3,), F64, "normal", (("std", 0.5),), "net.ss:3:5")), "net.ss:1:1")
STEPS = 12


def loss_of(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (torch.tanh(x @ w + b) - 0.3).pow(2).mean() + 0.1 * w.abs().sum()


def inputs(n: int = STEPS) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return [torch.randn(7, 5, generator=g, dtype=F64) for _ in range(n)]


# name: (our maker and its settings, torch's optimizer and the same settings, the scheduler as
# ss.lr_scheduler's arguments: a class and its settings, or a function of the optimizer)
Case = tuple[Callable[..., Optimizer], dict[str, Any], type[torch.optim.Optimizer], tuple[Any, dict[str, Any]]]
CASES: dict[str, Case] = {
    "step": (ss.adamw, {"lr": 0.05, "weight_decay": 0.1}, torch.optim.AdamW, (L.StepLR, {"step_size": 3, "gamma": 0.5})),
    "cosine": (ss.adamw, {"lr": 0.05}, torch.optim.AdamW, (L.CosineAnnealingLR, {"T_max": 8, "eta_min": 0.001})),
    "lambda": (ss.adamw, {"lr": 0.05}, torch.optim.AdamW, (lambda o: L.LambdaLR(o, lambda k: 0.8 ** k + 0.1), {})),
    "one_cycle": (ss.adamw, {"lr": 0.05, "betas": (0.9, 0.99)}, torch.optim.AdamW,
                  (L.OneCycleLR, {"max_lr": 0.2, "total_steps": STEPS + 1})),
    "one_cycle_sgd": (ss.sgd, {"lr": 0.05, "momentum": 0.9}, torch.optim.SGD,
                      (L.OneCycleLR, {"max_lr": 0.2, "total_steps": STEPS + 1, "anneal_strategy": "linear"})),
    "sequential": (ss.sgd, {"lr": 0.1}, torch.optim.SGD, (lambda o: L.SequentialLR(
        o, [L.LinearLR(o, start_factor=0.1, total_iters=3), L.MultiStepLR(o, milestones=[3, 6], gamma=0.5)],
        milestones=[3]), {})),
}


def made(scheduler: tuple[Any, dict[str, Any]], opt: Any) -> Any:
    """The scheduler of a case for a torch optimizer, as ss.lr_scheduler makes it for ours."""
    make, settings = scheduler
    return make(opt, **settings)


def by_torch(case: Case, xs: list[torch.Tensor]) -> tuple[list[tuple[float, Any]], dict[str, torch.Tensor]]:
    """torch's optimizer and scheduler in torch's loop on the same start: the lr (and betas or
    momentum) of each update, and the params after."""
    _, settings, torch_class, scheduler = case
    start = Model.init(SPEC, seed=4)
    w, b = (t.detach().clone().requires_grad_(True) for t in (start.w, start.b))
    opt = torch_class([w, b], **settings, fused=True)  # ours runs torch's fused kernel on cpu too
    sched = made(scheduler, opt)
    seen = []
    for x in xs:
        group = opt.param_groups[0]
        seen.append((group["lr"], group.get("betas", group.get("momentum"))))
        loss_of(w, b, x).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return seen, {"w": w.detach(), "b": b.detach()}


def train(m: Model, opt: Optimizer, sched: Any, xs: list[torch.Tensor]) -> list[tuple[float, Any]]:
    seen = []
    for x in xs:
        group = opt.torch_opt.param_groups[0]
        seen.append((group["lr"], group.get("betas", group.get("momentum"))))
        assert opt.hyper["lr"] == group["lr"]
        _, g = value_and_grad(lambda m, x: loss_of(*(t for _, t in m.named_params()), x), m, x)
        update(m, opt, g)
        sched.step()
        assert sched.get_last_lr() == [opt.hyper["lr"]]
    return seen


def ours(case: Case, seed: int = 4) -> tuple[Model, Optimizer, Any]:
    maker, settings, _, (make, scheduler_settings) = case
    m = Model.init(SPEC, seed=seed)
    opt = maker(m, **settings)
    return m, opt, ss.lr_scheduler(opt, make, **scheduler_settings)


@pytest.mark.parametrize("name", CASES)
def test_a_torch_scheduler_steps_the_lr_as_it_steps_torchs_optimizer(name: str) -> None:
    xs = inputs()
    want_lrs, want = by_torch(CASES[name], xs)
    m, opt, sched = ours(CASES[name])
    assert train(m, opt, sched, xs) == want_lrs  # every lr (and OneCycleLR's betas or momentum) to the bit
    assert len({lr for lr, _ in want_lrs}) > 2  # it did change the lr
    for key, t in want.items():
        torch.testing.assert_close(getattr(m, key).detach(), t, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["one_cycle", "lambda", "sequential", "one_cycle_sgd"])
def test_save_and_restore_mid_run_continue_as_an_uninterrupted_run(name: str, tmp_path: Path) -> None:
    xs = inputs()
    m, opt, sched = ours(CASES[name])
    whole = train(m, opt, sched, xs)
    m2, opt2, sched2 = ours(CASES[name])
    first = train(m2, opt2, sched2, xs[:5])
    path = tmp_path / "c.safetensors"
    ss.save(path, m2, opt2)
    meta = header(path)
    assert meta["scheduler"]["class"] == f"torch.optim.lr_scheduler.{type(sched.scheduler).__name__}"
    assert meta["scheduler"]["state"]["last_epoch"] == 5
    # a fresh model, optimizer and scheduler, restored
    m3, opt3, sched3 = ours(CASES[name], seed=9)
    ss.restore(path, m3, opt3)
    assert sched3.last_epoch == 5 and sched3.get_last_lr() == sched2.get_last_lr()
    assert sched3.state_dict().keys() == sched2.state_dict().keys()
    rest = train(m3, opt3, sched3, xs[5:])
    assert first + rest == whole
    for key in ("w", "b"):
        assert torch.equal(getattr(m3, key), getattr(m, key))


def header(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(json.loads(raw[8:8 + n])["__metadata__"]["shapescript"])


def rewrite_header(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """The checkpoint at `path` with its ShapeScript header changed by `change`."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    outer = json.loads(raw[8:8 + n])
    meta = json.loads(outer["__metadata__"]["shapescript"])
    change(meta)
    outer["__metadata__"]["shapescript"] = json.dumps(meta)
    text = json.dumps(outer).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def saved_one_cycle(tmp_path: Path) -> Path:
    m, opt, sched = ours(CASES["one_cycle"])
    train(m, opt, sched, inputs(3))
    path = tmp_path / "c.safetensors"
    ss.save(path, m, opt)
    return path


def set_at(*keys: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(meta: dict[str, Any]) -> None:
        target = meta
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return change


@pytest.mark.parametrize(("change", "error", "message"), [
    (set_at("scheduler", "class", value="torch.optim.lr_scheduler.StepLR"), ShapeError,
     "holds the state of a torch.optim.lr_scheduler.StepLR scheduler, not of the torch.optim.lr_scheduler.OneCycleLR"),
    (set_at("scheduler", "state", "_anneal_func_type", value="_annealing_linear"), ShapeError,
     r"scheduler.state._anneal_func_type` is \"_annealing_linear\", where the torch.optim.lr_scheduler.OneCycleLR's "
     r"is \"cos\""),
    (set_at("scheduler", "state", "_schedule_phases", 0, "start_lr", value="optimizer"), ShapeError,
     r"scheduler.state._schedule_phases\[0\].start_lr` is \"optimizer\""),
    (set_at("scheduler", "state", "__class__", value="x"), ShapeError, r"scheduler.state` has the keys"),
    (set_at("scheduler", "state", "last_epoch", value=2.5), ShapeError, "last_epoch` is 2.5, where .* is a whole number"),
    (set_at("scheduler", "state", "last_epoch", value=10**30), DomainError, "a whole number within int64"),
    (set_at("scheduler", "state", "base_lrs", value=[0.1, 0.2]), ShapeError, "has 1 entries"),
    (set_at("scheduler", "state", "_last_lr", 0, value=math.nan), DomainError, "_last_lr\\[0\\]` must be a number, not NaN"),
    (set_at("scheduler", "group", "max_lr", value={"py/object": "os.system"}), ShapeError, "group.max_lr` is"),
    (set_at("scheduler", value=None), ShapeError, "holds no lr scheduler's state for the torch.optim.lr_scheduler.OneCycleLR"),
    (set_at("scheduler", value=[1]), ShapeError, "its header's `scheduler` is \\[1\\]"),
])
def test_a_checkpoints_scheduler_state_is_checked_before_anything_changes(
        tmp_path: Path, change: Callable[[dict[str, Any]], None], error: type[Exception], message: str) -> None:
    path = saved_one_cycle(tmp_path)
    rewrite_header(path, change)
    m, opt, sched = ours(CASES["one_cycle"], seed=9)
    before = (m.w.clone(), dict(opt.hyper), sched.state_dict(), opt.torch_opt.state_dict()["state"])
    with pytest.raises(error, match=message):
        ss.restore(path, m, opt)
    assert torch.equal(m.w, before[0]) and dict(opt.hyper) == before[1] and sched.state_dict() == before[2]
    assert opt.steps == 0 and opt.torch_opt.state_dict()["state"] == before[3] == {}


def test_a_scheduler_of_other_settings_is_refused_and_one_without_is_ignored(tmp_path: Path) -> None:
    path = saved_one_cycle(tmp_path)
    m = Model.init(SPEC, seed=9)
    opt = ss.adamw(m, lr=0.05)
    three = ss.lr_scheduler(opt, L.OneCycleLR, max_lr=0.2, total_steps=20, three_phase=True)
    with pytest.raises(ShapeError, match="_schedule_phases` is .* where the .*OneCycleLR's has 3 entries"):
        ss.restore(path, m, opt)
    assert three.last_epoch == 0
    plain = ss.adamw(m, lr=0.05)  # no scheduler: the model and optimizer restored, the entry unread
    ss.restore(path, m, plain)
    assert plain.steps == 3 and plain.lr_scheduler is None
    # a checkpoint without one, into an optimizer that has one: refused, as its state would be stale
    ss.save(path, m, plain)
    assert "scheduler" not in header(path)
    cosine = ss.lr_scheduler(opt, L.CosineAnnealingLR, T_max=5)
    with pytest.raises(ShapeError, match="holds no lr scheduler's state for the .*CosineAnnealingLR"):
        ss.restore(path, m, opt)
    assert cosine.last_epoch == 0
    ss.restore(path, m, plain)  # restored first, then the scheduler made: it starts from the lr restored
    fresh = ss.lr_scheduler(plain, L.CosineAnnealingLR, T_max=5)
    assert fresh.get_last_lr() == [plain.hyper["lr"]]


def test_state_dict_round_trips_through_json_and_refuses_what_json_cant_hold() -> None:
    m, opt, sched = ours(CASES["sequential"])
    train(m, opt, sched, inputs(4))
    state = json.loads(json.dumps(sched.state_dict()))
    m2, opt2, sched2 = ours(CASES["sequential"])
    sched2.load_state_dict(state)
    assert sched2.state_dict() == sched.state_dict() and sched2.get_last_lr() == sched.get_last_lr()
    assert opt2.hyper["lr"] == 0.1 * 0.1  # as torch's: loading a scheduler leaves the optimizer's lr
    with pytest.raises(DomainError, match=r"state.last_epoch is a tensor of shape \(\), which a checkpoint can't hold"):
        sched2.load_state_dict({**state, "last_epoch": torch.tensor(3)})
    with pytest.raises(ShapeError, match="has the keys"):
        sched2.load_state_dict({**state, "optimizer": 0})

    class Scale:  # a callable object: torch's LambdaLR keeps its __dict__ in the state
        def __init__(self, factor: Any) -> None:
            self.factor = factor

        def __call__(self, k: int) -> float:
            return float(self.factor) ** k

    assert ss.lr_scheduler(opt, L.LambdaLR, lr_lambda=Scale(0.5)).entry()["state"]["lr_lambdas"] == [{"factor": 0.5}]
    with pytest.raises(DomainError, match=r"LambdaLR's state.lr_lambdas\[0\].factor is a tensor"):
        ss.lr_scheduler(opt, L.LambdaLR, lr_lambda=Scale(torch.tensor(0.5)))


def test_plateau_takes_its_metric_and_set_is_where_a_chained_scheduler_goes_on_from() -> None:
    m = Model.init(SPEC, seed=4)
    opt = ss.sgd(m, lr=0.1)
    plateau = ss.lr_scheduler(opt, L.ReduceLROnPlateau, patience=0, factor=0.5)
    for metric in (1.0, 2.0, 3.0):
        plateau.step(metric)
    assert opt.hyper["lr"] == 0.1 * 0.5 ** 2 and plateau.get_last_lr() == [0.025]
    step = ss.lr_scheduler(opt, L.StepLR, step_size=2, gamma=0.1)
    with pytest.raises(DomainError, match="another scheduler drives this optimizer's lr now"):
        plateau.step(4.0)
    assert opt.lr_scheduler is step
    step.step()
    opt.set(lr=0.5)  # StepLR goes on from the lr the optimizer has, as from a torch group's
    step.step()
    assert opt.hyper["lr"] == pytest.approx(0.05, rel=1e-15)
    del step
    assert opt.lr_scheduler is None  # held by no one, it drives nothing, and a checkpoint holds none


def test_what_lr_scheduler_refuses() -> None:
    m = Model.init(SPEC, seed=4)
    scheduled = ss.adamw(m, lr=ss.schedules.constant(0.1))
    with pytest.raises(DomainError, match="one of ss.schedules"):
        ss.lr_scheduler(scheduled, L.StepLR, step_size=2)
    opt = ss.adamw(m, lr=0.1)
    with pytest.raises(TypeError, match="expected an optimizer made by ss.adamw"):
        ss.lr_scheduler(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), L.StepLR, step_size=2)
    with pytest.raises(TypeError, match="int is no torch scheduler"):
        ss.lr_scheduler(opt, int)
    with pytest.raises(TypeError, match="step_size would go to a scheduler's class"):
        ss.lr_scheduler(opt, lambda o: L.StepLR(o, 2), step_size=2)
    other = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    with pytest.raises(TypeError, match="not one for another optimizer"):
        ss.lr_scheduler(opt, lambda o: L.StepLR(other, 2))
    with pytest.raises(DomainError, match=r"LambdaLR set lr=-0.1, which the optimizer refuses"):
        ss.lr_scheduler(opt, L.LambdaLR, lr_lambda=lambda k: -1.0)
    assert opt.hyper["lr"] == 0.1 and opt.lr_scheduler is None
    sched = ss.lr_scheduler(opt, L.StepLR, step_size=1)
    opt.set(lr=ss.schedules.constant(0.2))
    with pytest.raises(DomainError, match="the optimizer's lr is now ss.schedules.constant"):
        sched.step()
