"""Checkpoints: safetensors layout, exact resumption, and refusing what does not fit."""

from __future__ import annotations

import copy
import json
import os
import secrets
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import shapescript.runtime.checkpoint as checkpoint
from shapescript.errors import DomainError, ShapeError
from shapescript.runtime.autodiff import value_and_grad
from shapescript.runtime.checkpoint import load, save
from shapescript.runtime.leftovers import owner_tag
from shapescript.runtime.model import Model, ModelSpec, ParamSpec
from shapescript.runtime.optim import Optimizer, adamw, sgd, update

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
    return torch.nn.functional.cross_entropy(torch.relu(x @ m._m_w1) @ m._m_w2, y)  # as generated code


def train(m: Model, opt: Optimizer, steps: range) -> None:
    for step in steps:
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)
        _, grads = value_and_grad(loss, m, x, y)
        update(m, opt, grads)
        with torch.no_grad():
            m._m_seen.add_(1.0)


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
                           opt.torch_opt.state[m._leaf("w2")]["exp_avg"])
    assert keys == {"model.w1", "model.w2", "model.seen"} | {
        f"opt.{p}.{k}" for p in ("w1", "w2") for k in ("step", "exp_avg", "exp_avg_sq")}
    assert meta["format"] == 1 and meta["model"] == "Small" and meta["optimizer"] == "AdamW"
    assert meta["hyper"] == {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "no_decay": [],
                             "weight_decay": 0.01}
    assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]  # no temp file left


def test_model_only_round_trip(tmp_path: Path) -> None:
    a, b = Model.init(SMALL, seed=0), Model.init(SMALL, seed=1)
    save(str(tmp_path / "m.safetensors"), a)
    w1 = b._leaf("w1")
    load(str(tmp_path / "m.safetensors"), b)
    assert_same_snapshot(snapshot(a), snapshot(b))
    assert b._leaf("w1") is w1 and w1.requires_grad  # copied in place
    with safe_open(tmp_path / "m.safetensors", framework="pt") as f:
        assert json.loads(f.metadata()["shapescript"])["optimizer"] is None


def saved(tmp_path: Path, spec: ModelSpec = SMALL, with_opt: bool = True) -> Path:
    m = Model.init(spec, seed=5)
    opt = adamw(m)
    train(m, opt, range(1)) if spec is SMALL else None
    path = tmp_path / "saved.safetensors"
    save(path, m, opt if with_opt else None)
    return path


def refused(path: Path, m: Model, opt: Optimizer | None = None, error: type[Exception] = ShapeError) -> str:
    """Loading must fail with `error` and leave model and optimizer bit-identical."""
    before = snapshot(m, opt)
    hyper = dict(opt.hyper) if opt is not None else None
    with pytest.raises(error) as info:
        load(path, m, opt)
    assert type(info.value) is error
    assert_same_snapshot(snapshot(m, opt), before)
    assert (dict(opt.hyper) if opt is not None else None) == hyper
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
    ("nested", "a safetensors file but not a ShapeScript checkpoint"),  # json.loads: RecursionError
    ("nested-format", "of format [[[[[[[["),  # deep, yet under Python's limit: shown cut short
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
    elif content == "nested":  # 100,000 lists deep: no traceback from the stack's limit, a refusal
        save_file({"weight": torch.zeros(3)}, path, metadata={"shapescript": "[" * 100_000 + "]" * 100_000})
    elif content == "nested-format":
        header = '{"format": ' + "[" * 500 + "]" * 500 + ', "model": "Small"}'
        save_file({"model.w1": torch.zeros(8, 16)}, path, metadata={"shapescript": header})
    elif content == "future":
        save_file({"model.w1": torch.zeros(8, 16)}, path,
                  metadata={"shapescript": json.dumps({"format": 2, "model": "Small"})})
    else:
        path.write_bytes(content)  # type: ignore[arg-type]
    assert expected in refused(path, *trained())


def named_temporaries_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a system without O_TMPFILE: the data goes to a named temporary file from the start."""
    monkeypatch.setattr(checkpoint, "_unnamed_file", lambda folder: None)


@pytest.mark.parametrize("unnamed", [True, False])
def test_a_failed_save_leaves_the_old_file_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  unnamed: bool) -> None:
    path = saved(tmp_path)
    before = path.read_bytes()
    if not unnamed:
        named_temporaries_only(monkeypatch)

    def broken(f: BinaryIO, tensors: dict, metadata: dict) -> None:
        f.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "_write_safetensors", broken)
    with pytest.raises(OSError, match="disk full"):
        save(path, *trained())
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["saved.safetensors"]


@pytest.mark.parametrize("unnamed", [True, False])
def test_a_save_is_synced_before_its_rename_and_the_folder_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 unnamed: bool) -> None:
    """fsync of the data before os.replace, so that a crash can't leave the new name on a file whose
    data never reached the disk; fsync of the folder after it, so that the rename itself lasts."""
    if not unnamed:
        named_temporaries_only(monkeypatch)
    events: list[str] = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(
        "fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file") or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append("replace") or replace(a, b))
    m = Model.init(SMALL, seed=0)
    save(tmp_path / "c.safetensors", m)
    assert events == ["fsync file", "replace", "fsync folder"]
    assert sorted(os.listdir(tmp_path)) == ["c.safetensors"]
    load(tmp_path / "c.safetensors", Model.init(SMALL, seed=1))


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_a_killed_saves_temporary_file_goes_with_the_next_save(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Without O_TMPFILE a save killed midway leaves its named temporary file: the next save into
    the folder removes it, once its process has ended, and nothing else."""
    named_temporaries_only(monkeypatch)
    pid = dead_pid()
    dead = tmp_path / f".c.safetensors.{pid}-12345.0123456789ab.tmp"
    ours = tmp_path / f".c.safetensors.{owner_tag()}.0123456789ab.tmp"  # a save in progress in another thread
    reused = tmp_path / f".c.safetensors.{os.getpid()}-1.0123456789ab.tmp"  # an earlier process with our pid
    others = [tmp_path / ".c.safetensors.0123456789ab.tmp", tmp_path / "notes.txt"]
    for p in [dead, ours, reused, *others]:
        p.write_bytes(b"half a file")
    save(tmp_path / "c.safetensors", Model.init(SMALL, seed=0))
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in [ours, *others, tmp_path / "c.safetensors"])


def test_a_save_never_writes_through_a_planted_temporary_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without O_TMPFILE the temporary file is made exclusively: a symlink (or anything) already at
    the name it would have is left alone, with its target, and the save takes another name."""
    named_temporaries_only(monkeypatch)
    tokens = iter(["0123456789ab", "ba9876543210"])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(tokens))
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"someone else's file")
    planted = tmp_path / f".c.safetensors.{owner_tag()}.0123456789ab.tmp"
    planted.symlink_to(victim)
    m = Model.init(SMALL, seed=0)
    save(tmp_path / "c.safetensors", m)
    assert victim.read_bytes() == b"someone else's file" and planted.is_symlink()
    assert sorted(os.listdir(tmp_path)) == sorted(["c.safetensors", planted.name, "victim.bin"])
    back = Model.init(SMALL, seed=1)
    load(tmp_path / "c.safetensors", back)
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), m.state_dict().values()))


def test_the_file_holds_every_dtype_as_safetensors_reads_it(tmp_path: Path) -> None:
    tensors = {f"t.{dtype}": (torch.arange(-3, 9).reshape(3, 4) % 7).to(dtype) for dtype in checkpoint._DTYPE_NAMES}
    tensors |= {"scalar": torch.tensor(2.5, dtype=torch.float64), "empty": torch.zeros(0, 3),
                "a_bool": torch.tensor([True, False, True]), "z_byte": torch.tensor([7], dtype=torch.uint8)}
    path = tmp_path / "t.safetensors"
    with open(path, "wb") as f:
        checkpoint._write_safetensors(f, tensors, {"shapescript": "{}"})
    back = load_file(path)
    assert back.keys() == tensors.keys()
    assert all(back[k].dtype == t.dtype and torch.equal(back[k], t) for k, t in tensors.items())
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == {"shapescript": "{}"}


# -- the header's settings are checked as ss.adamw / ss.sgd check theirs ---------------------------

def edited(path: Path, edit: Callable[[dict[str, Any], dict[str, torch.Tensor]], None]) -> Path:
    """A copy of the checkpoint at `path` with its header's JSON and tensors edited, written with
    safetensors' own API."""
    with safe_open(path, framework="pt") as f:
        meta = json.loads(f.metadata()["shapescript"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(meta, tensors)
    out = path.with_name("edited.safetensors")
    save_file(tensors, out, metadata={"shapescript": json.dumps(meta)})
    return out


def setting(part: str, key: str, value: Any) -> Callable[[dict[str, Any], dict[str, torch.Tensor]], None]:
    return lambda meta, tensors: meta[part].__setitem__(key, value)


def without(part: str, key: str) -> Callable[[dict[str, Any], dict[str, torch.Tensor]], None]:
    return lambda meta, tensors: meta[part].pop(key)


def tensor(key: str, value: torch.Tensor) -> Callable[[dict[str, Any], dict[str, torch.Tensor]], None]:
    return lambda meta, tensors: tensors.__setitem__(key, value)


BAD_ADAMW_HEADERS = [
    (setting("hyper", "lr", "fast"), DomainError, "its header's hyper.lr must be a finite number >= 0, not 'fast'"),
    (setting("hyper", "lr", -0.1), DomainError, "its header's hyper.lr must be a finite number >= 0, not -0.1"),
    (setting("hyper", "lr", float("nan")), DomainError, "its header's hyper.lr must be a finite number >= 0, not nan"),
    (setting("hyper", "lr", 10**400), DomainError, "its header's hyper.lr must be a finite number >= 0 that fits a "
                                                   "float (at most about 1.8e308), not an int of 1329 bits"),
    (setting("group", "weight_decay", 10**400), DomainError, "group.weight_decay must be a finite number >= 0 that "
                                                             "fits a float"),
    (setting("hyper", "betas", [0.9]), DomainError, "its header's hyper.betas must be two numbers in [0, 1), not [0.9]"),
    (setting("hyper", "betas", [0.9, 1.0]), DomainError, "hyper.betas must be two numbers in [0, 1), not [0.9, 1.0]"),
    (setting("hyper", "weight_decay", -1), DomainError, "hyper.weight_decay must be a finite number >= 0, not -1"),
    (without("hyper", "eps"), ShapeError, "its header's `hyper` lacks eps"),
    (setting("hyper", "momentum", 0.9), ShapeError, "its header's `hyper` has momentum, which AdamW doesn't take"),
    (lambda meta, tensors: meta.__setitem__("hyper", None), ShapeError, "its header's `hyper` is null"),
    (setting("group", "lr", "fast"), DomainError, "its header's group.lr must be a finite number >= 0, not 'fast'"),
    (setting("group", "betas", [0.9, 0.99, 0.5]), DomainError, "group.betas must be two numbers in [0, 1)"),
    (setting("group", "eps", float("inf")), DomainError, "group.eps must be a finite number >= 0, not inf"),
    (setting("group", "params", [0, 5]), ShapeError, "`group.params` is [0, 5]; the optimizer's params are "
                                                      "numbered 0 to 1"),
    (lambda meta, tensors: meta.__setitem__("scalars", "opt.w1.step"), ShapeError, "`scalars` is \"opt.w1.step\""),
    (tensor("opt.w1.step", torch.tensor(-3.0)), DomainError, "`opt.w1.step` must be a whole number >= 0 (steps "
                                                             "taken), not -3"),
    (tensor("opt.w2.step", torch.tensor(2.5)), DomainError, "`opt.w2.step` must be a whole number >= 0"),
    (tensor("opt.w1.exp_avg_sq", -torch.ones(8, 16)), DomainError, "`opt.w1.exp_avg_sq` must be >= 0 everywhere"),
]


@pytest.mark.parametrize("edit,error,message", BAD_ADAMW_HEADERS)
def test_bad_optimizer_settings_are_refused_before_anything_changes(
        tmp_path: Path, edit: Callable, error: type[Exception], message: str) -> None:
    path = edited(saved(tmp_path), edit)
    msg = refused(path, *trained(), error=error)
    assert msg.startswith(f"checkpoint {path}: ") and message in msg


@pytest.mark.parametrize("edit,message", [
    (setting("group", "momentum", -1), "group.momentum must be a finite number >= 0, not -1"),
    (setting("hyper", "nesterov", "yes"), "hyper.nesterov must be True or False, not 'yes'"),
    (setting("group", "dampening", 0.5), "group.nesterov can be True only with a momentum > 0 and no dampening"),
])
def test_bad_sgd_settings_are_refused(tmp_path: Path, edit: Callable, message: str) -> None:
    m = Model.init(SMALL, seed=0)
    opt = sgd(m, lr=0.1, momentum=0.9, nesterov=True)
    train(m, opt, range(2))
    save(tmp_path / "s.safetensors", m, opt)
    path = edited(tmp_path / "s.safetensors", edit)
    assert message in refused(path, m, opt, error=DomainError)


def test_torchs_flags_stay_the_optimizers_own(tmp_path: Path) -> None:
    """Settings ShapeScript never sets (amsgrad, capturable, ...) are the optimizer's own, whatever a
    header says; the hyperparameters are the header's."""
    path = edited(saved(tmp_path), lambda meta, tensors: meta["group"].update(capturable=True, lr=0.5))
    m, opt = trained()
    load(path, m, opt)
    group = opt.torch_opt.param_groups[0]
    assert group["capturable"] is False and group["lr"] == 0.5
    train(m, opt, range(2, 3))  # a capturable AdamW would refuse CPU tensors
