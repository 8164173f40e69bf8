"""Randomness: one interface over hypothesis' draw and random.Random."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

try:
    from hypothesis import strategies as st
except ImportError:  # RandomRand works without hypothesis; DrawRand needs it
    st = None  # type: ignore[assignment]

X = TypeVar("X")


class Rand:
    """What the generators need. `chance` and `choice` shrink towards False and the first item."""

    def choice(self, seq: Sequence[X]) -> X: ...
    def randint(self, lo: int, hi: int) -> int: ...
    def chance(self, p: float) -> bool: ...

    def sample(self, seq: Sequence[X], k: int) -> list[X]:
        pool, out = list(seq), []
        for _ in range(min(k, len(pool))):
            out.append(pool.pop(self.randint(0, len(pool) - 1)))
        return out


class RandomRand(Rand):
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def choice(self, seq):
        return self.rng.choice(list(seq))

    def randint(self, lo, hi):
        return self.rng.randint(lo, hi)

    def chance(self, p):
        return self.rng.random() < p


class DrawRand(Rand):
    def __init__(self, draw) -> None:
        self.draw = draw

    def choice(self, seq):
        return self.draw(st.sampled_from(list(seq)))

    def randint(self, lo, hi):
        return self.draw(st.integers(lo, hi))

    def chance(self, p):
        return self.draw(st.integers(0, 999)) >= 1000 - int(p * 1000)
