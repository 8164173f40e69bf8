"""`layout auto`: the compiler chooses the layout. With `memory 40 GiB` under the devices line each
device may hold that much (without it, what the devices have, where that is known here).

The layouts weighed, in this order (the order breaks ties): data parallel, `shard params`, then for
each declared dim that the devices divide and some model's params have, `split` of it, and `split`
of it with `shard params`. Each is checked and planned as if the program had written it; one the
compiler refuses for this program (a split no op can keep, E1801) is listed with its error and left
out. Of those that fit the budget (plan/costs.py counts what a device holds), the one that sends the
fewest bytes a step is chosen, then the one that holds the least. Nothing fitting is E1906, which
says what each layout needs. A layout written out, with `memory`, is checked against it the same way.

The chosen layout's program is the one that layout's own line compiles to: the guarantee (the same
results as on one device) is that layout's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import sympy

from ..check.program import Checked
from ..devices import DeviceSet
from ..errors import CompileError, Diagnostic, Span
from ..shapes.plans import LayoutChoice, LayoutCost
from .choice_text import choice_options, cost_text, devices_line
from .costs import batch_of, cost_of, refused, step_of
from .sizes_text import short_bytes

CheckWith = Callable[[DeviceSet], Checked]  # the program checked and planned on these devices


def candidates(checked: Checked) -> list[DeviceSet]:
    """The layouts `layout auto` weighs, simplest first."""
    devices = dataclasses.replace(checked.device_set, shard_params=False, split=None)
    out = [devices, dataclasses.replace(devices, shard_params=True)]
    for dim in splittable(checked):
        out += [dataclasses.replace(devices, split=dim), dataclasses.replace(devices, split=dim, shard_params=True)]
    return out


def splittable(checked: Checked) -> list[str]:
    """The declared dims that the devices divide and that some model's params have, in the order declared."""
    in_params: set[str] = set()
    for model in checked.models.values():
        for member in model.members.values():
            if member.tensor is not None:
                in_params.update(str(s) for a in member.tensor.axes for s in sympy.sympify(a.size).free_symbols)
    count = checked.device_set.count
    return [name for name, size in checked.dim_values.items()
            if name not in checked.derived and size is not None and size > 1 and size % count == 0 and name in in_params]


def choose(checked: Checked, check_with: CheckWith, budget: int | None, budget_from: str) -> Checked:
    """`checked` (planned data parallel) as `layout auto` has it: checked and planned with the
    layout chosen, its LayoutChoice on it; E1906 where none fits."""
    step = step_of(checked)
    batch, batch_from = batch_of(checked)
    costs: list[LayoutCost] = []
    planned: dict[int, Checked] = {}
    for devices in candidates(checked):
        try:
            candidate = checked if devices == checked.device_set else check_with(devices)
        except CompileError as e:
            first = e.diagnostics[0]
            costs.append(refused(devices, f"{first.code}: {first.message}"))
            continue
        planned[len(costs)] = candidate
        costs.append(cost_of(candidate, step, batch))
    fitting = [k for k, c in enumerate(costs) if c.fits(budget)]
    if not fitting:
        raise CompileError([nothing_fits(checked, costs, budget, budget_from)], checked.source, checked.warnings)
    best = min(fitting, key=lambda k: (costs[k].sent, costs[k].held, k))
    choice = LayoutChoice(costs[best], tuple(costs), budget, budget_from, step, batch, batch_from)
    return dataclasses.replace(planned[best], layout_choice=choice)


def check_budget(checked: Checked, budget: int, budget_from: str) -> None:
    """A layout written out, with `memory`: E1906 if it doesn't fit."""
    cost = cost_of(checked, step_of(checked), batch_of(checked)[0])
    if not cost.fits(budget):
        raise CompileError([nothing_fits(checked, [cost], budget, budget_from)], checked.source, checked.warnings)


def nothing_fits(checked: Checked, costs: list[LayoutCost], budget: int | None, budget_from: str) -> Diagnostic:
    weighed = [c for c in costs if c.refused is None]
    what = "no layout fits" if checked.device_set.auto else f"the layout, {costs[0].layout}, doesn't fit"
    least = min((c.held for c in weighed), default=None)
    return Diagnostic(
        "E1906", f"{what} in {short_bytes(budget or 0)} a device ({budget_from})",
        budget_span(checked), "the budget",
        (f"the least any layout needs is {short_bytes(least)} a device: give the devices that "
         "much, use more devices, or make the model smaller" if least is not None else
         "give the devices more memory",),
        tuple(need_text(c) for c in costs))


def need_text(c: LayoutCost) -> str:
    """What a layout needs, in a line: "shard params: sends 975 MiB a step, holds 1.23 GiB a device (...)"."""
    return f"{c.layout}: {cost_text(c)}"


def budget_span(checked: Checked) -> Span:
    """The `memory` option's span, or the devices line's, or the program's."""
    line = devices_line(checked)
    options = choice_options(checked)
    return (options.get("memory") or options.get("layout") or line or checked.program).span
