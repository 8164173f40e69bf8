"""`ss.schedules`: learning-rate schedules to give an optimizer as its `lr`
(`ss.adamw(m, lr=ss.schedules.warmup_cosine(6e-4, warmup=100, decay_until=2000, floor=6e-5))`).
The lr of its k-th update (k from 0) is the schedule's `at(k)`; docs/api.md says how each is drawn."""

from shapescript.runtime.schedules import Constant, Linear, Schedule, Step, WarmupCosine


def constant(lr: float) -> Schedule:
    """`lr` at every update."""
    return Constant(lr)


def linear(start: float, end: float, steps: int) -> Schedule:
    """From `start` in a straight line to `end` at update `steps`, then `end` (torch's LinearLR)."""
    return Linear(start, end, steps)


def step(start: float, every: int, factor: float = 0.1) -> Schedule:
    """`start · factor ** (k // every)` at update k (torch's StepLR)."""
    return Step(start, every, factor)


def warmup_cosine(peak: float, warmup: int, decay_until: int, floor: float = 0.0) -> Schedule:
    """nanoGPT's get_lr: a linear warmup to `peak`, half a cosine down to `floor` by update
    `decay_until`, then `floor`."""
    return WarmupCosine(peak, warmup, decay_until, floor)


__all__ = ["Schedule", "constant", "linear", "step", "warmup_cosine"]
