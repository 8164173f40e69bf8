"""Checkpoints between layouts, for tests/several/test_sharding.py and test_heads.py: a model
trained and saved in each layout, loaded in every other one and saved again must give the same file,
every param and every value of the optimizer's state bit for bit, and whole tensors from Python."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

import shapescript as ss


def check_checkpoints_move(programs: dict[str, Any], model: str, train: Callable[[Any, Any, Any], None],
                           folder: Path) -> None:
    """Every ordered pair of `programs` (layout name -> loaded program): `train(prog, m, opt)` a
    `model` made there, save it, restore it into the other's, save again and compare."""
    for source, target in itertools.product(programs, repeat=2):
        prog = programs[source]
        m = getattr(prog, model).init(seed=1)
        opt = ss.adamw(m, lr=1e-3)
        train(prog, m, opt)
        first = folder / f"{source}.safetensors"
        ss.save(first, m, opt)
        other = programs[target]
        m2 = getattr(other, model).init(seed=2)
        opt2 = ss.adamw(m2, lr=5e-2)
        ss.restore(first, m2, opt2)
        again = folder / f"{source} to {target}.safetensors"
        ss.save(again, m2, opt2)
        saved, resaved = load_file(first), load_file(again)
        assert saved.keys() == resaved.keys() and any(k.startswith("opt.") for k in saved)
        for key in saved:
            assert torch.equal(saved[key], resaved[key]), (source, target, key)
        assert opt2.hyper["lr"] == 1e-3
        for name, value in m2.state_dict().items():
            assert torch.equal(value, saved[f"model.{name}"]), (source, target, name)
        for name, value in opt2.state_dict().items():
            assert torch.equal(value, saved[f"opt.{name}"]), (source, target, name)
