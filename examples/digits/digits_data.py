"""The data of digits.ss: scikit-learn's 8x8 digits (shipped with the package, no download).

`load("train")` and `load("test")` split the 1,797 images deterministically: a fixed-seed
permutation, the last 297 held out. Pixels (0..16) are scaled to 0..1.
"""

from __future__ import annotations

import functools

import torch

import shapescript as ss

HELD_OUT = 297
SEED = 0


@functools.cache
def tensors(part: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(images [n, 64] float32 in 0..1, labels [n] int64) of the part "train" or "test"."""
    if part not in ("train", "test"):
        raise ValueError(f"digits: part must be 'train' or 'test', not {part!r}")
    from sklearn.datasets import load_digits  # imported here: it takes a second

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(SEED))
    idx = perm[:-HELD_OUT] if part == "train" else perm[-HELD_OUT:]
    return x[idx], y[idx]


def load(part: str) -> ss.TensorDataset:
    """The `python fn digits(part)` of digits.ss: a dataset of Digit records."""
    img, label = tensors(part)
    return ss.TensorDataset(img=img, label=label)
