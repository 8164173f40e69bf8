"""An extern fn that draws from each of the random states a worker's extern fns may use (imported by
the workers of tests/several/test_extern_streams.py)."""

from __future__ import annotations

import random

import numpy
import torch


def noisy(x: torch.Tensor) -> torch.Tensor:
    """Each row of `x` plus a draw of torch's, one of Python's and one of NumPy's, in its 3 columns."""
    rows = x.shape[0]
    drawn = torch.stack([torch.randn(rows, dtype=torch.float64),
                         torch.tensor([random.gauss(0.0, 1.0) for _ in range(rows)], dtype=torch.float64),
                         torch.from_numpy(numpy.random.standard_normal(rows))], dim=1)
    return x + drawn.to(x.dtype)
