"""A torch scheduler (`ss.lr_scheduler`) driving an optimizer on cpu[0 1] as on cpu: the same lr at
every update, the same params after, and its state through a checkpoint saved on two devices (with
`shard params` too), restored there or on one, continuing as a run never interrupted."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim import lr_scheduler as L

import shapescript as ss
from shapescript.errors import ShapeError

pytestmark = pytest.mark.slow

PROGRAM = """\
precision f64
dim D = 4
dim C = 3

data Ex:
    x: [D]
    y: [] Index[C]

model Lin:
    param w: [D C] = normal(std=0.5)
    param b: [C] = normal(std=0.5)

fn loss(m: Lin, batch: [b] Ex) -> [] = cross_entropy(batch.x @ m.w + m.b, batch.y, over=C)

fn step_adamw(mut m: Lin, mut opt: AdamW[Lin], batch: [b] Ex) -> []:
    l, g = value_and_grad(loss, m, batch)
    update(mut m, mut opt, g)
    return l

fn step_sgd(mut m: Lin, mut opt: Sgd[Lin], batch: [b] Ex) -> []:
    l, g = value_and_grad(loss, m, batch)
    update(mut m, mut opt, g)
    return l

fn save_adamw(m: Lin, opt: AdamW[Lin], path: str):
    save(path, m, opt)

fn save_sgd(m: Lin, opt: Sgd[Lin], path: str):
    save(path, m, opt)
"""
STEPS = 8
LAYOUTS = {"cpu": "", "cpu[0 1]": "", "cpu[0 1] shard params": "devices cpu\n    shard params\n\n"}

# name: the optimizer's maker and settings, and ss.lr_scheduler's arguments after the optimizer
CASES: dict[str, tuple[str, dict[str, Any], Any, dict[str, Any]]] = {
    # OneCycleLR moves AdamW's betas as well as its lr
    "one_cycle": ("adamw", {"lr": 0.05, "weight_decay": 0.1, "no_decay": ["b"]}, L.OneCycleLR,
                  {"max_lr": 0.3, "total_steps": STEPS + 1}),
    # a plain lambda: it never leaves the controller, so it needn't be pickled for the workers
    "lambda": ("sgd", {"lr": 0.2, "momentum": 0.9}, lambda o: L.LambdaLR(o, lambda k: 0.7 ** k + 0.05), {}),
}


@pytest.fixture(scope="module")
def programs() -> Iterator[dict[str, Any]]:
    progs: dict[str, Any] = {}
    try:
        for label, options in LAYOUTS.items():
            progs[label] = ss.load(options + PROGRAM, devices=label.removesuffix(" shard params"), name="sched.ss")
        yield progs
    finally:
        for prog in progs.values():
            prog.stop()


def batches() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(6, 4, generator=g, dtype=torch.float64), "y": torch.randint(0, 3, (6,), generator=g)}
            for _ in range(STEPS)]


def start(prog: Any, name: str, seed: int = 0) -> tuple[Any, Any, Any, Callable[..., Any]]:
    maker, settings, scheduler, scheduler_settings = CASES[name]
    m = prog.Lin.init(seed=seed)
    opt = getattr(ss, maker)(m, **settings)
    return m, opt, ss.lr_scheduler(opt, scheduler, **scheduler_settings), getattr(prog, f"step_{maker}")


def train(m: Any, opt: Any, sched: Any, step: Callable[..., Any], data: list[dict[str, torch.Tensor]]) -> list[Any]:
    """Each update's lr and betas (or momentum), as the optimizer's settings held them."""
    seen = []
    for batch in data:
        seen.append((opt.hyper["lr"], opt.hyper.get("betas", opt.hyper.get("momentum"))))
        step(m, opt, batch)
        sched.step()
        assert sched.get_last_lr() == [opt.hyper["lr"]]
    return seen


def assert_same_params(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    for key, t in want.items():
        torch.testing.assert_close(got[key], t.detach(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", CASES)
def test_the_lr_and_the_params_are_one_devices_on_two(programs: dict[str, Any], name: str) -> None:
    runs = {}
    for label in ("cpu", "cpu[0 1]"):
        m, opt, sched, step = start(programs[label], name)
        runs[label] = (train(m, opt, sched, step, batches()), m.state_dict(), opt.steps)
    (lrs, params, steps), (lrs2, params2, steps2) = runs["cpu"], runs["cpu[0 1]"]
    assert lrs2 == lrs and steps == steps2 == STEPS
    assert len({lr for lr, _ in lrs}) == STEPS  # a new lr every update
    assert_same_params(params2, params)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("layout", ["cpu[0 1]", "cpu[0 1] shard params"])
def test_save_and_restore_on_two_devices_continue_as_one_device_uninterrupted(
        programs: dict[str, Any], name: str, layout: str, tmp_path: Path) -> None:
    data = batches()
    m, opt, sched, step = start(programs["cpu"], name)
    whole = train(m, opt, sched, step, data)
    prog = programs[layout]
    m2, opt2, sched2, step2 = start(prog, name)
    first = train(m2, opt2, sched2, step2, data[:3])
    path = tmp_path / "c.safetensors"
    if layout == "cpu[0 1]":
        ss.save(path, m2, opt2)
    else:  # the program's own save writes the scheduler's state too
        getattr(prog, f"save_{CASES[name][0]}")(m2, opt2, str(path))
    for where in (layout, "cpu"):  # restored on the same devices, and on one: a checkpoint is one device's file
        m3, opt3, sched3, step3 = start(programs[where], name, seed=7)
        ss.restore(path, m3, opt3)
        assert sched3.last_epoch == 3 and sched3.get_last_lr() == sched2.get_last_lr() and opt3.steps == 3
        assert train(m3, opt3, sched3, step3, data[3:]) == whole[3:] and first == whole[:3]
        assert_same_params(m3.state_dict(), m.state_dict())


def test_a_checkpoint_of_another_scheduler_is_refused_on_the_workers_before_anything_changes(
        programs: dict[str, Any], tmp_path: Path) -> None:
    prog = programs["cpu[0 1]"]
    m, opt, sched, step = start(prog, "one_cycle")
    train(m, opt, sched, step, batches()[:2])
    path = tmp_path / "c.safetensors"
    ss.save(path, m, opt)
    m2 = prog.Lin.init(seed=7)
    opt2 = ss.adamw(m2, lr=0.05, weight_decay=0.1, no_decay=["b"])
    cosine = ss.lr_scheduler(opt2, L.CosineAnnealingLR, T_max=4)
    before = m2.state_dict()
    with pytest.raises(ShapeError, match="holds the state of a torch.optim.lr_scheduler.OneCycleLR scheduler, not of "
                                         "the torch.optim.lr_scheduler.CosineAnnealingLR"):
        ss.restore(path, m2, opt2)
    assert cosine.last_epoch == 0 and opt2.steps == 0
    assert_same_params(m2.state_dict(), before)
