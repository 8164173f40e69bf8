"""Checkpoints: safetensors layout, exact resumption, and refusing what does not fit."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import shapescript.runtime.checkpoint as checkpoint
from shapescript.errors import ShapeError
from shapescript.runtime.checkpoint import load, save
from shapescript.runtime.model import Model, ModelSpec, ParamSpec
from shapescript.runtime.optim import Optimizer, adamw, sgd, update, value_and_grad

# A small model so the resumption tests stay fast: x @ w1 -> relu -> @ w2.
SMALL = ModelSpec("Small", (
    ParamSpec("w1", "param", (8, 16), torch.float32, "normal", (("std", 0.3),), "s.ss:3:5"),
    ParamSpec("w2", "param", (16, 4), torch.float32, "normal", (("std", 0.3),), "s.ss:4:5"),
    ParamSpec("seen", "buffer", (4,), torch.float32, "zeros", (), "s.ss:5:5"),
), "s.ss:2:1")
OTHER = ModelSpec("Other", SMALL.members, "o.ss:2:1")
WIDER = ModelSpec("Small", (SMALL.members[0],
                            ParamSpec("w2", "param", (16, 5), torch.float32, "zeros", (),
                                      "s2.ss:4:5"), SMALL.members[2]), "s2.ss:2:1")

OPTS: dict[str, Callable[[Model], Optimizer]] = {
    "adamw": lambda m: adamw(m, lr=0.01),
    "sgd-momentum": lambda m: sgd(m, lr=0.1, momentum=0.9),
    "sgd-plain": lambda m: sgd(m, lr=0.1),
}


def loss(m: Model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(torch.relu(x @ m.w1) @ m.w2, y)


def train(m: Model, opt: Optimizer, steps: range) -> None:
    for step in steps:
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)
        _, grads = value_and_grad(loss, m, x, y)
        update(m, opt, grads)
        with torch.no_grad():
            m.seen.add_(1.0)


def snapshot(m: Model, opt: Optimizer | None = None) -> tuple[dict, dict | None]:
    # deepcopy: torch's optimizer state_dict holds references to the live state tensors.
    return m.state_dict(), (copy.deepcopy(opt.torch_opt.state_dict()) if opt else None)


def assert_same_snapshot(a: tuple[dict, dict | None], b: tuple[dict, dict | None]) -> None:
    assert a[0].keys() == b[0].keys()
    assert all(torch.equal(a[0][k], b[0][k]) for k in a[0])
    if a[1] is not None:
        assert a[1]["param_groups"] == b[1]["param_groups"]
        assert a[1]["state"].keys() == b[1]["state"].keys()
        for index, state in a[1]["state"].items():
            other = b[1]["state"][index]
            assert state.keys() == other.keys()
            assert all(torch.equal(state[k], other[k]) for k in state)


@pytest.mark.parametrize("kind", list(OPTS))
def test_resuming_from_a_checkpoint_equals_training_straight(tmp_path: Path, kind: str) -> None:
    straight = Model.init(SMALL, seed=0)
    straight_opt = OPTS[kind](straight)
    train(straight, straight_opt, range(10))

    first = Model.init(SMALL, seed=0)
    first_opt = OPTS[kind](first)
    train(first, first_opt, range(5))
    save(tmp_path / "ckpt.safetensors", first, first_opt)

    resumed = Model.init(SMALL, seed=99)
    resumed_opt = OPTS[kind](resumed)
    load(tmp_path / "ckpt.safetensors", resumed, resumed_opt)
    train(resumed, resumed_opt, range(5, 10))
    for a, b in zip(resumed.state_dict().values(), straight.state_dict().values()):
        assert torch.equal(a, b)
    assert resumed.seen.tolist() == [10.0] * 4


def test_file_layout_and_header(tmp_path: Path) -> None:
    m = Model.init(SMALL, seed=0)
    opt = adamw(m, lr=0.01)
    train(m, opt, range(2))
    path = tmp_path / "c.safetensors"
    save(path, m, opt)
    with safe_open(path, framework="pt") as f:
        keys = set(f.keys())
        meta = json.loads(f.metadata()["shapescript"])
        assert torch.equal(f.get_tensor("model.w1"), m.w1.detach())
        assert torch.equal(f.get_tensor("opt.w2.exp_avg"),
                           opt.torch_opt.state[m.w2]["exp_avg"])
    assert keys == {"model.w1", "model.w2", "model.seen"} | {
        f"opt.{p}.{k}" for p in ("w1", "w2") for k in ("step", "exp_avg", "exp_avg_sq")}
    assert meta["format"] == 1 and meta["model"] == "Small" and meta["optimizer"] == "AdamW"
    assert meta["hyper"] == {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8,
                             "weight_decay": 0.01}
    assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]  # no temp file left


def test_model_only_round_trip(tmp_path: Path) -> None:
    a, b = Model.init(SMALL, seed=0), Model.init(SMALL, seed=1)
    save(str(tmp_path / "m.safetensors"), a)
    w1 = b.w1
    load(str(tmp_path / "m.safetensors"), b)
    assert_same_snapshot(snapshot(a), snapshot(b))
    assert b.w1 is w1 and b.w1.requires_grad  # copied in place
    with safe_open(tmp_path / "m.safetensors", framework="pt") as f:
        assert json.loads(f.metadata()["shapescript"])["optimizer"] is None


def saved(tmp_path: Path, spec: ModelSpec = SMALL, with_opt: bool = True) -> Path:
    m = Model.init(spec, seed=5)
    opt = adamw(m)
    train(m, opt, range(1)) if spec is SMALL else None
    path = tmp_path / "saved.safetensors"
    save(path, m, opt if with_opt else None)
    return path


def refused(path: Path, m: Model, opt: Optimizer | None = None) -> str:
    """Loading must fail with a ShapeError and leave model and optimizer bit-identical."""
    before = snapshot(m, opt)
    with pytest.raises(ShapeError) as info:
        load(path, m, opt)
    assert_same_snapshot(snapshot(m, opt), before)
    return str(info.value)


def trained() -> tuple[Model, Optimizer]:
    m = Model.init(SMALL, seed=0)
    opt = adamw(m)
    train(m, opt, range(2))
    return m, opt


def test_another_model_type_is_refused(tmp_path: Path) -> None:
    path = saved(tmp_path, OTHER)
    msg = refused(path, *trained())
    assert msg == (f"checkpoint {path} holds a model of type Other, not Small "
                   f"(declared at s.ss:2:1)")


def test_a_changed_shape_is_refused_naming_the_declaration(tmp_path: Path) -> None:
    path = saved(tmp_path, WIDER)
    msg = refused(path, *trained())
    assert msg.startswith(f"checkpoint {path}: ")
    assert "`w2` is [16, 5] f32, expected [16, 4] f32 (declared at s.ss:4:5)" in msg


def test_optimizer_mismatches_are_refused_before_the_model_changes(tmp_path: Path) -> None:
    m, opt = trained()
    assert "holds no optimizer state" in refused(saved(tmp_path, with_opt=False), m, opt)
    assert "optimizer of kind AdamW, not Sgd" in refused(saved(tmp_path), m, sgd(m))
    tensors = {}
    with safe_open(saved(tmp_path), framework="pt") as f:
        header = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors["opt.w1.exp_avg"] = torch.zeros(3)
    save_file(tensors, tmp_path / "bad.safetensors", metadata=header)
    msg = refused(tmp_path / "bad.safetensors", m, opt)
    assert "`opt.w1.exp_avg` is [3] f32, expected [8, 16] f32 (declared at s.ss:3:5)" in msg
    del tensors["opt.w1.exp_avg"]
    save_file(tensors, tmp_path / "bad.safetensors", metadata=header)
    assert "the AdamW state of `w1` has ['exp_avg_sq', 'step']" in \
        refused(tmp_path / "bad.safetensors", m, opt)


def test_optimizer_of_another_model(tmp_path: Path) -> None:
    m, opt = trained()
    with pytest.raises(ShapeError, match="belongs to another Small model"):
        save(tmp_path / "x.safetensors", Model.init(SMALL, seed=0), opt)
    with pytest.raises(ShapeError, match="belongs to another Small model"):
        load(saved(tmp_path), Model.init(SMALL, seed=0), opt)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.safetensors"
    with pytest.raises(FileNotFoundError, match="nope.safetensors") as info:
        load(path, Model.init(SMALL, seed=0))
    assert info.value.filename == str(path)
    with pytest.raises(FileNotFoundError, match="no folder"):
        save(tmp_path / "no" / "such" / "x.safetensors", Model.init(SMALL, seed=0))


@pytest.mark.parametrize("content,expected", [
    (b"this is not a checkpoint at all, just some text" * 4, "not a readable safetensors file"),
    (b"", "not a readable safetensors file"),
    ("truncated", "not a readable safetensors file"),
    ("foreign", "a safetensors file but not a ShapeScript checkpoint"),
    ("bad-json", "a safetensors file but not a ShapeScript checkpoint"),
    ("future", "of format 2; this version reads format 1"),
])
def test_files_that_are_not_ours(tmp_path: Path, content: bytes | str, expected: str) -> None:
    path = tmp_path / "f.safetensors"
    good = saved(tmp_path)
    if content == "truncated":
        path.write_bytes(good.read_bytes()[:-40])
    elif content == "foreign":
        save_file({"weight": torch.zeros(3)}, path)
    elif content == "bad-json":
        save_file({"weight": torch.zeros(3)}, path, metadata={"shapescript": "{nope"})
    elif content == "future":
        save_file({"model.w1": torch.zeros(8, 16)}, path,
                  metadata={"shapescript": json.dumps({"format": 2, "model": "Small"})})
    else:
        path.write_bytes(content)  # type: ignore[arg-type]
    assert expected in refused(path, *trained())


def test_a_failed_save_leaves_the_old_file_intact(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = saved(tmp_path)
    before = path.read_bytes()

    def broken(tensors: dict, filename: str, metadata: dict) -> None:
        Path(filename).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        save(path, *trained())
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["saved.safetensors"]
