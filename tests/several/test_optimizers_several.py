"""Every optimizer kind with an lr schedule and param groups on cpu, cpu[0 1] and cpu[0 1 2]: the same
params as one device, the same position, `opt.set` and checkpoints across device counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from programs import LIN_HEADER

import shapescript as ss
from shapescript.errors import DomainError
from shapescript.optimizers import OptimizerKind

BIASED = LIN_HEADER.replace("    param w: [D C] = normal(std=0.1)\n",
                            "    param w: [D C] = normal(std=0.1)\n    param b: [C] = normal(std=0.1)\n")
# A step and a loop for each kind: `step_adam(mut m, mut opt: Adam[Lin], batch)`, `fit_adam(...)`.
PROGRAM = BIASED + "\nfn loss(m: Lin, batch: [b] Ex) -> [] = cross_entropy(batch.x @ m.w + m.b, batch.y, over=C)\n" + "".join(
    f"""
fn step_{k.maker}(mut m: Lin, mut opt: {k.value}[Lin], batch: [b] Ex) -> []:
    l, g = value_and_grad(loss, m, batch)
    update(mut m, mut opt, g)
    return l

fn fit_{k.maker}(mut m: Lin, mut opt: {k.value}[Lin], data: Dataset[Ex], log: Sink):
    for batch in data |> shuffle(seed=1) |> batches(8):
        write(log, logs(loss=step_{k.maker}(mut m, mut opt, batch)))
""" for k in OptimizerKind)
SETTINGS = {
    OptimizerKind.ADAMW: {"weight_decay": 0.2}, OptimizerKind.ADAM: {"weight_decay": 0.2},
    OptimizerKind.SGD: {"momentum": 0.9}, OptimizerKind.RMSPROP: {"momentum": 0.5, "centered": True},
    OptimizerKind.ADAGRAD: {"lr_decay": 0.01}, OptimizerKind.ADADELTA: {"rho": 0.8},
}
SCHEDULE = ss.schedules.warmup_cosine(0.1, warmup=2, decay_until=6, floor=0.01)


def dataset(n: int = 21) -> ss.TensorDataset:
    g = torch.Generator().manual_seed(0)
    return ss.TensorDataset(x=torch.randn(n, 4, generator=g), y=torch.randint(0, 3, (n,), generator=g))


def run(devices: str, tmp_path: Path) -> dict[OptimizerKind, dict[str, torch.Tensor]]:
    """Each kind: two passes (6 updates), then the lr changed with `set` for a third; on several
    devices the second pass resumes from a checkpoint of the first, in a fresh model and optimizer."""
    prog = ss.load(PROGRAM, devices=devices, name="fit.ss")
    maker = {k: getattr(ss, k.maker) for k in OptimizerKind}
    out = {}
    try:
        for kind in OptimizerKind:
            fit = getattr(prog, f"fit_{kind.maker}")
            m = prog.Lin.init(seed=0)
            opt = maker[kind](m, lr=SCHEDULE, no_decay=["b"], **SETTINGS[kind])
            fit(m, opt, dataset(), ss.sinks.memory())
            assert opt.steps == 3 and opt.lr == SCHEDULE.at(3)
            if devices != "cpu":
                path = tmp_path / f"{kind.maker}.safetensors"
                ss.save(path, m, opt)
                m = prog.Lin.init(seed=5)
                opt = maker[kind](m, lr=0.5, **SETTINGS[kind])
                ss.restore(path, m, opt)
                assert opt.steps == 3 and opt.hyper["lr"] == SCHEDULE and opt.hyper["no_decay"] == ["b"]
            fit(m, opt, dataset(), ss.sinks.memory())
            opt.set(lr=0.02)
            with pytest.raises(TypeError, match="opt.set"):
                opt.hyper["lr"] = 0.3
            fit(m, opt, dataset(), ss.sinks.memory())
            assert opt.steps == 9 and opt.lr == 0.02
            out[kind] = m.state_dict()
        with pytest.raises(DomainError, match="momentum can't be turned on after the first update"):
            m = prog.Lin.init(seed=0)
            opt = ss.rmsprop(m)
            prog.fit_rmsprop(m, opt, dataset(), ss.sinks.memory())
            opt.set(momentum=0.9)
        assert opt.hyper["momentum"] == 0.0
        prog.fit_rmsprop(m, opt, dataset(), ss.sinks.memory())  # the workers are up, the state as it was
    finally:
        prog.stop()
    return out


@pytest.mark.slow
def test_every_kind_with_a_schedule_trains_alike_on_every_device_count(tmp_path: Path) -> None:
    one = run("cpu", tmp_path)
    for devices in ("cpu[0 1]", "cpu[0 1 2]"):
        several = run(devices, tmp_path)
        for kind, params in one.items():
            for name, t in params.items():
                torch.testing.assert_close(several[kind][name], t.detach(), atol=1e-6, rtol=0,
                                           msg=lambda m, kind=kind, name=name: f"{kind} {name} on {devices}: {m}")


@pytest.mark.slow
def test_shard_params_keeps_the_position_and_takes_set() -> None:
    """With `shard params` each worker's optimizer holds its pieces' state: the schedule's position
    and a changed setting are every worker's, and the params equal one device's."""
    results = {}
    for devices in ("cpu", "cpu[0 1 2]"):
        source = PROGRAM if devices == "cpu" else f"devices {devices}\n    shard params\n\n" + PROGRAM
        prog = ss.load(source, name="fit.ss")
        try:
            m = prog.Lin.init(seed=0)
            opt = ss.adam(m, lr=SCHEDULE, no_decay=["b"], weight_decay=0.1)
            prog.fit_adam(m, opt, dataset(), ss.sinks.memory())
            opt.set(lr=0.03, betas=(0.5, 0.9))
            prog.fit_adam(m, opt, dataset(), ss.sinks.memory())
            assert opt.steps == 6
            results[devices] = (m.state_dict(), opt.state_dict())
        finally:
            prog.stop()
    (params, state), (params3, state3) = results["cpu"], results["cpu[0 1 2]"]
    for name, t in params.items():
        torch.testing.assert_close(params3[name], t.detach(), atol=1e-6, rtol=0)
    for name, t in state.items():
        torch.testing.assert_close(state3[name], t, atol=1e-6, rtol=0)
