"""`layout auto`'s choice in words, for `shapescript comms`, hovers and the notebook's table alike:
the layout chosen, what it sends a step and holds a device, and every other layout weighed, so that
a person can write one out instead."""

from __future__ import annotations

from typing import Any

from ..check.program import Checked
from ..shapes.plans import LayoutChoice, LayoutCost
from ..syntax import tree as A
from .sizes_text import short_bytes


def cost_text(c: LayoutCost) -> str:
    """"sends 253 MiB a step, holds 2.56 GiB a device (params 181 MiB, optimizer state 362 MiB, ...)"."""
    if c.refused is not None:
        return f"not possible for this program ({c.refused})"
    f = c.footprint
    assert f is not None
    return (f"sends {short_bytes(c.sent)} a step, holds {short_bytes(f.total)} a device (params "
            f"{short_bytes(f.params)}, optimizer state {short_bytes(f.optimizer)}, gradients {short_bytes(f.gradients)}, "
            f"activations about {short_bytes(f.activations)})")


def choice_lines(choice: LayoutChoice) -> list[str]:
    """The choice, its budget and what it was weighed on, then the others: those that fit (fewest
    bytes sent first), those that don't, those the compiler refuses."""
    budget = (f"{short_bytes(choice.budget)} a device, from {choice.budget_from}" if choice.budget is not None
              else f"no budget ({choice.budget_from}): the fewest bytes sent chose")
    step = f"a step of `{choice.step}`" if choice.step else "no step (nothing runs on the devices)"
    out = [f"Layout chosen by `layout auto`: {choice.chosen.layout}, which {cost_text(choice.chosen)}.",
           f"  Budget: {budget}. Weighed on {step}, at a batch of {choice.batch} ({choice.batch_from})."]
    others = [("fits", c) for c in choice.runners_up()]
    others += [("too big", c) for c in choice.costs if c.refused is None and not c.fits(choice.budget)]
    others += [("refused", c) for c in choice.costs if c.refused is not None]
    if others:
        out.append("  The others weighed (write one under the devices line, in place of `layout auto`, to use it):")
        out += [f"    {c.layout}: {'' if how != 'too big' else 'too big: '}{cost_text(c)}" for how, c in others]
    return out


def choice_json(choice: LayoutChoice) -> dict[str, Any]:
    def cost(c: LayoutCost) -> dict[str, Any]:
        f = c.footprint
        return {"layout": c.layout, "shard_params": c.shard_params, "split_dim": c.split, "sent": c.sent,
                "fits": c.fits(choice.budget), "refused": c.refused,
                "per_device": None if f is None else {"params": f.params, "optimizer": f.optimizer,
                                                      "gradients": f.gradients, "activations": f.activations,
                                                      "total": f.total}}
    return {"chosen": choice.chosen.layout, "budget": choice.budget, "budget_from": choice.budget_from,
            "step": choice.step, "batch": choice.batch, "costs": [cost(c) for c in choice.costs]}


def devices_line(checked: Checked) -> A.Devices | None:
    """The program's devices line (its first, where it has more), None where it has none."""
    return next((i for i in checked.program.items if isinstance(i, A.Devices)), None)


def choice_options(checked: Checked) -> dict[str, A.DeviceOption]:
    """The devices line's `layout auto` and `memory` options, by kind (the first of each)."""
    line = devices_line(checked)
    found: dict[str, A.DeviceOption] = {}
    for o in line.options if line is not None else []:
        if o.kind in ("layout", "memory"):
            found.setdefault(o.kind, o)
    return found


def option_lines(checked: Checked) -> set[int]:
    """The lines of the devices line's `layout auto` and `memory` options, where a hover shows the choice."""
    return {o.span.line for o in choice_options(checked).values()}
