"""Spec literals shaped like those the code generator emits, shared by the runtime tests.

Given as fixtures rather than imports, so the tests work under any pytest import mode.
"""

from __future__ import annotations

import pytest
import torch

from shapescript.runtime.data import DataSpec, FieldSpec
from shapescript.runtime.model import ModelSpec, ParamSpec, SubSpec

F32 = torch.float32


def param(name: str, shape: tuple[int, ...], init: str = "normal", *, kind: str = "param",
          dtype: torch.dtype = F32, line: int = 9, **args: float) -> ParamSpec:
    return ParamSpec(name, kind, shape, dtype, init, tuple(args.items()), f"mlp.ss:{line}:5")


# The README's model: 784 -> 256 -> 10.
MLP = ModelSpec("Mlp", (param("w1", (784, 256), std=0.02, line=9),
                        param("w2", (256, 10), std=0.02, line=10)), "mlp.ss:8:1")

# Every kind of member: sub-model, buffer, each init, another dtype.
ENC = ModelSpec("Enc", (param("w", (4, 3), "uniform", low=-0.5, high=0.5, line=3),
                        param("b", (3,), "zeros", line=4)), "mlp.ss:2:1")
NET = ModelSpec("Net", (
    param("w0", (5, 4), mean=1.0, std=0.5, line=12),
    SubSpec("enc", ENC, "mlp.ss:13:5"),
    param("scale", (3,), "ones", line=14),
    param("running", (3,), kind="buffer", line=15),
    param("w64", (3, 2), dtype=torch.float64, line=16),
    param("count", (), "zeros", kind="buffer", dtype=torch.int64, line=17),
), "mlp.ss:11:1")


def field(name: str, dims: tuple[tuple[str, int | None], ...], type_text: str, line: int,
          dtype: torch.dtype = F32, bound: int | None = None, label: str | None = None
          ) -> FieldSpec:
    return FieldSpec(name, dims, dtype, bound, label, f"digits.ss:{line}:5", type_text)


DIGIT = DataSpec("Digit", (
    field("img", (("D", 64),), "[D]", 7),
    field("label", (), "[] Index[C]", 8, torch.int64, 10, "C"),
), "digits.ss:6:1")

# Generic dims shared by two fields of one item.
SEQ = DataSpec("Seq", (
    field("tokens", (("n", None),), "[n] Index[V]", 3, torch.int64, 50, "V"),
    field("mask", (("n", None),), "[n]", 4),
), "seq.ss:2:1")


@pytest.fixture
def mlp() -> ModelSpec:
    return MLP


@pytest.fixture
def net() -> ModelSpec:
    return NET


@pytest.fixture
def digit() -> DataSpec:
    return DIGIT


@pytest.fixture
def seq() -> DataSpec:
    return SEQ
