"""Train and Eval modes, and dropout, whose draws are keyed by the mode's seed and a count of draws.

Each draw seeds a generator of its own from (seed, number of the draw) and draws the mask for the
whole batch's shape; on several devices each worker then takes its own part's rows. So N devices
draw exactly what one device draws, and a mode carries a plain count rather than generator state:
the controller's mode advances by the draws that a call made on the workers.
"""

from __future__ import annotations

import torch

from shapescript.runtime.collectives import batch_part

_MASK64 = (1 << 64) - 1


class Mode:
    """`Train(seed=...)` or `Eval`: selects dropout's behaviour. A Train mode counts its draws, so the
    same seed gives the same draws, run after run, and successive draws differ."""

    __slots__ = ("training", "seed", "draws")

    def __init__(self, training: bool, seed: int | None = None, draws: int = 0) -> None:
        self.training = training
        self.seed = seed
        self.draws = draws  # how many masks this mode has drawn so far

    def generator(self, device: torch.device) -> torch.Generator:
        """A generator for the next draw, seeded from (seed, draw number) alone; counts the draw."""
        key = stream_key(int(self.seed or 0), self.draws)
        self.draws += 1
        return torch.Generator(device=device).manual_seed(key)

    def __repr__(self) -> str:
        return f"Train(seed={self.seed})" if self.training else "Eval"


def stream_key(seed: int, number: int) -> int:
    """The 64-bit seed of stream `number` of `seed` (a mode's draw, a worker's extern fns): unrelated
    for nearby pairs, the same in every process."""
    return _mix((_mix(seed & _MASK64) + number) & _MASK64)


def _mix(z: int) -> int:
    """splitmix64's finaliser: nearby (seed, draw) pairs give unrelated seeds, the same in every process."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def Train(seed: int) -> Mode:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"Train(seed=...) takes an int, not {type(seed).__name__}")
    return Mode(True, seed)


Eval = Mode(False)


def eval_mode() -> Mode:
    return Eval


def dropout(x: torch.Tensor, p: float, mode: Mode, batch_axis: int | None = None) -> torch.Tensor:
    """Zero each value with probability p and scale the rest by 1/(1-p), in Train; the identity in Eval.
    `batch_axis`: x's axis split across the devices, if any; the mask is drawn for the whole batch and
    this worker keeps its part's rows."""
    if not mode.training or p == 0:
        return x
    generator = mode.generator(x.device)
    part = batch_part() if batch_axis is not None else None
    shape = list(x.shape)
    if part is not None and batch_axis is not None:  # (part is None without an axis)
        shape[batch_axis] = part[1]
    # A contiguous mask of the whole batch's shape, so the values don't depend on x's strides.
    keep = torch.empty(shape, dtype=x.dtype, device=x.device).bernoulli_(1.0 - p, generator=generator)
    if part is not None and batch_axis is not None:
        keep = keep.narrow(batch_axis, part[0], x.shape[batch_axis])
    return x * keep / (1.0 - p)
