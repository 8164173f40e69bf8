"""`ss.schedules`: learning-rate schedules to give an optimizer as its `lr`
(`ss.adamw(m, lr=ss.schedules.warmup_cosine(6e-4, warmup=100, decay_until=2000, floor=6e-5))`).
The lr of its k-th update (k from 0) is the schedule's `at(k)`; docs/api.md says how each is drawn."""

from shapescript.runtime.schedules import Schedule, constant, linear, step, warmup_cosine

__all__ = ["Schedule", "constant", "linear", "step", "warmup_cosine"]
