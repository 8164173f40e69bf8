"""Train and Eval modes, and the random draws keyed by the mode's seed and a count of draws:
dropout's masks and the random ops (random_normal, random_uniform, bernoulli, randint, categorical).

Each draw seeds a generator of its own from (seed, number of the draw) and draws for the whole
batch's shape (`draw`); on several devices each worker then takes its own part's rows. So N devices
draw exactly what one device draws, and a mode carries a plain count rather than generator state:
the controller's mode advances by the draws that a call made on the workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from shapescript.errors import DomainError
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


def draw(mode: Mode, shape: Sequence[int], batch_axis: int | None, dtype: torch.dtype, device: torch.device,
         fill: Callable[[torch.Tensor, torch.Generator], torch.Tensor]) -> torch.Tensor:
    """The mode's next draw, tied to each value's place in the whole batch: `fill` fills a contiguous
    tensor of the whole batch's shape (so the values don't depend on strides or on the devices) from
    the draw's own generator, and this worker keeps its part along `batch_axis`, the axis split
    across the devices if any (`shape` is this worker's part's shape)."""
    generator = mode.generator(device)
    part = batch_part() if batch_axis is not None else None
    whole = list(shape)
    if part is not None and batch_axis is not None:  # (part is None without an axis)
        whole[batch_axis] = part[1]
    out = fill(torch.empty(whole, dtype=dtype, device=device), generator)
    if part is not None and batch_axis is not None:
        out = out.narrow(batch_axis, part[0], shape[batch_axis])
    return out


def dropout(x: torch.Tensor, p: float, mode: Mode, batch_axis: int | None = None) -> torch.Tensor:
    """Zero each value with probability p and scale the rest by 1/(1-p), in Train; the identity in Eval.
    `batch_axis`: x's axis split across the devices, if any; the mask is drawn for the whole batch and
    this worker keeps its part's rows."""
    if not mode.training or p == 0:
        return x
    keep = draw(mode, x.shape, batch_axis, x.dtype, x.device, lambda t, g: t.bernoulli_(1.0 - p, generator=g))
    return x * keep / (1.0 - p)


# ---- the random ops: each one draw of a Train mode, for the whole batch (`draw`) -----------------

def _training(mode: Mode, op: str, where: str) -> Mode:
    if not mode.training:
        raise DomainError(f"{where}: `{op}` draws from a Train(seed=...) mode, and Eval has no seed to draw "
                          f"from; pass Train(seed=...) where the numbers are drawn")
    return mode


def random_normal(like: torch.Tensor, mode: Mode, batch_axis: int | None, where: str,
                  mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
    """Normal values of `like`'s shape and dtype (torch's `normal_`)."""
    return draw(_training(mode, "random_normal", where), like.shape, batch_axis, like.dtype, like.device,
                lambda t, g: t.normal_(mean, std, generator=g))


def random_uniform(like: torch.Tensor, mode: Mode, batch_axis: int | None, where: str,
                   low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """Values uniform in [low, high) of `like`'s shape and dtype (torch's `uniform_`)."""
    return draw(_training(mode, "random_uniform", where), like.shape, batch_axis, like.dtype, like.device,
                lambda t, g: t.uniform_(low, high, generator=g))


def bernoulli(p: torch.Tensor, mode: Mode, batch_axis: int | None, where: str) -> torch.Tensor:
    """True with probability p, each value by itself: a uniform draw in [0, 1) of p's dtype below p."""
    u = draw(_training(mode, "bernoulli", where), p.shape, batch_axis, p.dtype, p.device,
             lambda t, g: t.uniform_(0.0, 1.0, generator=g))
    return u < p.detach()


def randint(like: torch.Tensor, mode: Mode, batch_axis: int | None, where: str,
            low: int = 0, high: int = 1) -> torch.Tensor:
    """Whole numbers uniform in low..high-1, i64, of `like`'s shape (torch's `random_(low, high)`)."""
    return draw(_training(mode, "randint", where), like.shape, batch_axis, torch.int64, like.device,
                lambda t, g: t.random_(low, high, generator=g))


def categorical(probs: torch.Tensor, mode: Mode, axis: int, batch_axis: int | None, where: str) -> torch.Tensor:
    """One index along `axis` for each distribution of `probs` (weights at least 0, not all 0), i64:
    the first index whose running sum of weights exceeds u times their total, for u one uniform
    f64 draw in [0, 1) per distribution. `batch_axis` is the result's (probs' without `axis`)."""
    shape = probs.shape[:axis] + probs.shape[axis + 1:]
    u = draw(_training(mode, "categorical", where), shape, batch_axis, torch.float64, probs.device,
             lambda t, g: t.uniform_(0.0, 1.0, generator=g))
    running = probs.detach().to(torch.float64).cumsum(axis)
    target = u * running.select(axis, -1)
    index = (running <= target.unsqueeze(axis)).sum(axis)
    return index.clamp_(max=probs.shape[axis] - 1)
