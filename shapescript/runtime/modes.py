"""Train and Eval modes, and dropout, whose draws come from the mode's own generator."""

from __future__ import annotations

import torch


class Mode:
    """`Train(seed=...)` or `Eval`: selects dropout's behaviour. A Train mode owns a generator, so
    the same seed gives the same draws, run after run."""

    __slots__ = ("training", "seed", "_generators")

    def __init__(self, training: bool, seed: int | None = None) -> None:
        self.training = training
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def generator(self, device: torch.device) -> torch.Generator:
        g = self._generators.get(device)
        if g is None:  # one stream per device, each seeded alike
            g = torch.Generator(device=device).manual_seed(int(self.seed or 0))
            self._generators[device] = g
        return g

    def __repr__(self) -> str:
        return f"Train(seed={self.seed})" if self.training else "Eval"


def Train(seed: int) -> Mode:  # noqa: N802 (the language's spelling)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"Train(seed=...) takes an int, not {type(seed).__name__}")
    return Mode(True, seed)


Eval = Mode(False)


def eval_mode() -> Mode:
    return Eval


def dropout(x: torch.Tensor, p: float, mode: Mode) -> torch.Tensor:
    """Zero each value with probability p and scale the rest by 1/(1-p), in Train; the identity in Eval."""
    if not mode.training or p == 0:
        return x
    keep = torch.empty_like(x).bernoulli_(1.0 - p, generator=mode.generator(x.device))
    return x * keep / (1.0 - p)
