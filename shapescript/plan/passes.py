"""The plans of a checked program on its devices, as passes over its IR after type checking: where
each function runs (placement.py), then on several devices how the batch splits (split.py) or,
with `split H`, how H does (layout.py's split_heads), the layout options' plan (layout.py), and
which gradients wait to be averaged until an update reads them (accumulate.py).
Each pass gives the module back with what it found on its nodes; the DeviceTable (comms.py) is
worked out from the planned IR when first asked for."""

from __future__ import annotations

import dataclasses

from ..check.program import Checked
from ..shapes import dims as D
from .accumulate import defer_gradients
from .layout import lay_out, split_heads
from .placement import place
from .planning import Planning
from .split import split_batches


def plan_program(checked: Checked) -> Checked:
    """`checked` with its IR planned, or the CompileError of what the plans refuse (E1801 to E1804,
    E1901)."""
    planning = Planning(checked.module)
    with D.derived(checked.derived):  # a derived dim equals its definition, as in checking
        planning.module = place(planning)
        if not planning.diagnostics and planning.module.devices.count > 1:
            # With `split H` batches are whole on every device: no batch split.
            planning.module = split_heads(planning.module) if planning.module.devices.split else split_batches(planning)
            planning.module = lay_out(planning.module)
            planning.module = defer_gradients(planning.module)
    planning.raise_found(checked.program)
    return dataclasses.replace(checked, ir=planning.module)
