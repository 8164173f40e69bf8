"""`precision mixed f16`'s dynamic loss scale, torch.amp.GradScaler's rule: f16's smallest values
are near 6e-8, so a step's gradients, computed in f16 where autocast does, would underflow to zero;
value_and_grad differentiates the loss times a scale S (a power of 2: exact both ways) and divides
the gradients by S again; an update whose gradients hold an inf or a NaN (the scaled backward
overflowed f16's 65,504) is skipped, the model and its optimizer's state left as they were, and S
halved; after 2,000 updates in a row that weren't, S doubles. S starts at 2^16.

On several devices every worker skips the same updates: the workers sum, with the failure flags they
sum before each update anyway (collectives.agree_to_update), whether each found an overflow in its
own part of the gradients; so each worker's S stays the same as every other's, and as one device's.

The scale belongs to the model being trained (a step's value_and_grad and update both name it), kept
beside it for as long as it lives; a checkpoint doesn't hold it (a model restored starts again at 2^16).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

INITIAL = 2.0 ** 16
GROWTH, BACKOFF, INTERVAL = 2.0, 0.5, 2000  # torch.amp.GradScaler's defaults


class LossScale:
    """One model's loss scale: `scale`, and the updates in a row that weren't skipped."""

    __slots__ = ("scale", "good", "__weakref__")

    def __init__(self) -> None:
        self.scale = INITIAL
        self.good = 0

    def stepped(self, overflow: bool) -> bool:
        """After an update found an overflow (skipped: False) or not (True), the scale moves on."""
        if overflow:
            self.scale *= BACKOFF
            self.good = 0
            return False
        self.good += 1
        if self.good == INTERVAL:
            self.scale *= GROWTH
            self.good = 0
        return True


_SCALES: weakref.WeakKeyDictionary[object, LossScale] = weakref.WeakKeyDictionary()


def scale_of(model: object) -> LossScale:
    """`model`'s loss scale, made at its first scaled value_and_grad."""
    found = _SCALES.get(model)
    if found is None:
        found = _SCALES[model] = LossScale()
    return found


def scale_kept(model: object) -> LossScale | None:
    """`model`'s loss scale, if a scaled value_and_grad has made one (its updates then check overflow)."""
    return _SCALES.get(model)


def overflowed(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether any of the gradients holds an inf or a NaN (one read of the host for all of them)."""
    if not tensors:
        return False
    return not bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())
