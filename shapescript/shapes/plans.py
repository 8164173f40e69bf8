"""What the plans decide about a function on several devices, as every stage after them reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BatchSplit:
    """How a function on the workers takes the batch (check/split.py): which generic dims are split
    across the devices, and the split axis of each parameter and of the result (None: whole).
    `heads`: split along a dim of `split H` (check/layout.py) rather than along the batch axis."""
    dims: frozenset[Any]
    params: tuple[int | None, ...]
    result: int | None
    heads: bool = False
