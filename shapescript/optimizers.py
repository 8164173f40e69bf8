"""The optimizers a program can name, one entry a kind: its type in a .ss program (`AdamW[M]`), the
function that makes it from Python (`ss.adamw`), and how many tensors of a param's size its state
always holds, whatever its settings (the DeviceTable's estimate of its bytes; None where that
depends on the settings, as SGD's momentum does). The checker, the DeviceTable and the run time read
this table; the run time's own (runtime/optim.py) adds torch's class and the checks of the settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class OptimizerKind(StrEnum):
    ADAMW = "AdamW"
    ADAM = "Adam"
    SGD = "Sgd"
    RMSPROP = "Rmsprop"
    ADAGRAD = "Adagrad"
    ADADELTA = "Adadelta"

    @property
    def maker(self) -> str:
        """`ss.adamw`'s name: the kind's name in lower case."""
        return self.value.lower()


@dataclass(frozen=True)
class KindFacts:
    # tensors the size of each param the state holds whatever the settings; None: it depends on them
    state_per_param: int | None
    state_text: str  # what they are, for the DeviceTable: "two moments"
    state_at_most: int  # the most such tensors any settings keep (`layout auto` counts these)


FACTS: dict[OptimizerKind, KindFacts] = {
    OptimizerKind.ADAMW: KindFacts(2, "two moments", 2),
    OptimizerKind.ADAM: KindFacts(2, "two moments", 2),
    OptimizerKind.SGD: KindFacts(None, "a momentum buffer where momentum > 0", 1),
    OptimizerKind.RMSPROP: KindFacts(None, "a mean square, and a momentum buffer and a mean where asked", 3),
    OptimizerKind.ADAGRAD: KindFacts(1, "a sum of squares", 1),
    OptimizerKind.ADADELTA: KindFacts(2, "the mean squares of gradients and of updates", 2),
}


def kind_named(name: str) -> OptimizerKind | None:
    """The kind a type name in a program names (`AdamW`), or None."""
    try:
        return OptimizerKind(name)
    except ValueError:
        return None


def kinds_text() -> str:
    """`AdamW[M], Adam[M], ...` for a message."""
    return ", ".join(f"{kind.value}[M]" for kind in OptimizerKind)
