"""Learning-rate schedules: the lr of an optimizer's k-th update (k from 0), a pure function of k.

An optimizer made with `lr=` one of these sets its param groups' lr to `at(k)` just before its k-th
update, k being the updates it has made (`Optimizer.steps`), which a checkpoint keeps. Each worker's
optimizer counts its own updates, and every worker makes every update, so all of them use the same
lr as one device does. The schedules are frozen and checked when made; a checkpoint holds one as
its `header()`, read back through `from_header` with the same checks. (A standalone build inlines
this module beside the rest of the run time: its helpers' names are its own.) `ss.schedules`
(shapescript/schedules.py) has the functions that make them.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from shapescript.errors import DomainError


def _schedule_rate(where: str, name: str, value: Any) -> float:
    """A finite number >= 0 as a float, or DomainError."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and not value < 0 and value < math.inf
    try:
        if ok:
            return float(value)
    except OverflowError:  # an int past the largest float: finite as Python compares it
        pass
    raise DomainError(f"{where}: {name} must be a finite number >= 0, not {_schedule_text(value)}")


def _schedule_count(where: str, name: str, value: Any, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise DomainError(f"{where}: {name} must be a whole number >= {least}, not {_schedule_text(value)}")
    return int(value)


def _schedule_text(value: Any) -> str:
    text = repr(value) if not (isinstance(value, int) and value.bit_length() > 256) else "a very large int"
    return text if len(text) <= 80 else text[:80] + "..."


class Schedule(ABC):
    """What every schedule has: `at(k)`, and its settings as a checkpoint's header holds them."""

    name: ClassVar[str]

    @abstractmethod
    def at(self, k: int) -> float:
        """The lr of update k (k from 0)."""

    def settings(self) -> dict[str, Any]:
        made: Any = self  # every subclass is a dataclass
        return {f.name: getattr(self, f.name) for f in fields(made)}

    def header(self) -> dict[str, Any]:
        return {"schedule": self.name, **self.settings()}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings().items())
        return f"ss.schedules.{self.name}({args})"


@dataclass(frozen=True, repr=False)
class Constant(Schedule):
    """`lr` at every update."""

    lr: float
    name: ClassVar[str] = "constant"

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", _schedule_rate("constant", "lr", self.lr))

    def at(self, k: int) -> float:
        return self.lr


@dataclass(frozen=True, repr=False)
class Linear(Schedule):
    """From `start` at update 0 in a straight line to `end` at update `steps`, then `end`."""

    start: float
    end: float
    steps: int
    name: ClassVar[str] = "linear"

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", _schedule_rate("linear", "start", self.start))
        object.__setattr__(self, "end", _schedule_rate("linear", "end", self.end))
        object.__setattr__(self, "steps", _schedule_count("linear", "steps", self.steps, least=1))

    def at(self, k: int) -> float:
        if k >= self.steps:
            return self.end
        return self.start + (self.end - self.start) * k / self.steps


@dataclass(frozen=True, repr=False)
class Step(Schedule):
    """`start`, multiplied by `factor` every `every` updates (torch's StepLR): start · factor^(k // every)."""

    start: float
    every: int
    factor: float = 0.1
    name: ClassVar[str] = "step"

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", _schedule_rate("step", "start", self.start))
        object.__setattr__(self, "every", _schedule_count("step", "every", self.every, least=1))
        object.__setattr__(self, "factor", _schedule_rate("step", "factor", self.factor))

    def at(self, k: int) -> float:
        try:
            return self.start * self.factor ** (k // self.every)
        except OverflowError:  # a factor above 1 after very many updates
            return math.inf


@dataclass(frozen=True, repr=False)
class WarmupCosine(Schedule):
    """nanoGPT's `get_lr`: for k < warmup, peak · (k + 1) / (warmup + 1); past `decay_until`, `floor`;
    in between, from `peak` down to `floor` along half a cosine:
    floor + (peak − floor) · ½ (1 + cos(π (k − warmup) / (decay_until − warmup)))."""

    peak: float
    warmup: int
    decay_until: int
    floor: float = 0.0
    name: ClassVar[str] = "warmup_cosine"

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak", _schedule_rate("warmup_cosine", "peak", self.peak))
        object.__setattr__(self, "warmup", _schedule_count("warmup_cosine", "warmup", self.warmup))
        object.__setattr__(self, "decay_until", _schedule_count("warmup_cosine", "decay_until", self.decay_until))
        object.__setattr__(self, "floor", _schedule_rate("warmup_cosine", "floor", self.floor))
        if self.decay_until <= self.warmup:
            raise DomainError(f"warmup_cosine: decay_until ({self.decay_until}) must come after the warmup "
                              f"({self.warmup} updates): the cosine runs from one to the other")

    def at(self, k: int) -> float:
        if k < self.warmup:
            return self.peak * (k + 1) / (self.warmup + 1)
        if k > self.decay_until:
            return self.floor
        ratio = (k - self.warmup) / (self.decay_until - self.warmup)
        return self.floor + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (self.peak - self.floor)


SCHEDULES: dict[str, type[Schedule]] = {s.name: s for s in (Constant, Linear, Step, WarmupCosine)}


def from_header(value: Any, where: str) -> Schedule:
    """The schedule a checkpoint's header holds (`header()`'s form), checked as when it was made."""
    kind = value.get("schedule") if isinstance(value, dict) else None
    if not isinstance(kind, str) or kind not in SCHEDULES:
        raise DomainError(f"{where} must be a number or a schedule ({', '.join(SCHEDULES)}), not {_schedule_text(value)}")
    made: Any = SCHEDULES[kind]  # a dataclass
    names = {f.name for f in fields(made)}
    given = {k: v for k, v in value.items() if k != "schedule"}
    if set(given) - names:
        raise DomainError(f"{where}: the {kind} schedule takes {', '.join(sorted(names))}, not "
                          f"{', '.join(sorted(set(given) - names))}")
    try:
        return made(**given)
    except TypeError:  # a setting left out
        raise DomainError(f"{where}: the {kind} schedule needs {', '.join(sorted(names))}") from None
