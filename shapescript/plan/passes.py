"""The plans of a checked program on its devices, as passes after type checking: where each
function runs (placement.py), then on several devices how the batch splits (split.py) or, with
`split H`, how H does (layout.py's heads_facts), and the layout options' plan (layout.py). What a
pass finds is kept in `Checked` (its placements, split and layout facts); the DeviceTable
(comms.py) is worked out from them when first asked for."""

from __future__ import annotations

import dataclasses

from ..check.program import Checked
from ..shapes import dims as D
from .layout import heads_facts, lay_out
from .placement import place
from .planning import Planning
from .split import split_batches


def plan_program(checked: Checked) -> Checked:
    """`checked` with its plans, or the CompileError of what they refuse (E1801 to E1804, E1901)."""
    planning = Planning(checked)
    with D.derived(checked.derived):  # a derived dim equals its definition, as in checking
        checked = planning.checked = dataclasses.replace(checked, placements=place(planning))
        if not planning.diagnostics and checked.device_set.count > 1:
            # With `split H` batches are whole on every device: no batch split.
            split = heads_facts(checked) if checked.device_set.split else split_batches(planning)
            checked = dataclasses.replace(checked, split=split)
            checked = dataclasses.replace(checked, layout=lay_out(checked))
    planning.raise_found(checked.program)
    return checked
