"""`layout auto` (plan/choose.py): the compiler weighs every layout a program can have on its devices
and chooses, within a per-device `memory` budget, the one that sends the fewest bytes a step. These
tests check the choice at compile time: what is weighed, that the choice changes with the budget and
fits it, that the chosen program is the one its own layout line compiles to, the words the table and
hovers show, and the errors. tests/several/test_layout_auto_several.py runs the choices."""

from __future__ import annotations

import json
import re

import pytest
from programs import AUTO_BUDGETS, NANO_LARGER, NANO_SMALL, NANOGPT, README, WIDE_GPT, WIDE_GPT_DIMS, auto_layout

from shapescript.errors import CompileError
from shapescript.lower.targets import Target
from shapescript.notebook.device_table import DeviceTableView
from shapescript.pipeline import check_source, python_modules
from shapescript.plan.comms import device_table
from shapescript.plan.comms_text import hover_text, report, to_json
from shapescript.plan.costs import cost_of

GPT, DIMS, BUDGETS, auto = WIDE_GPT, WIDE_GPT_DIMS, AUTO_BUDGETS, auto_layout


def explicit(source: str, layout: str, devices: str = "cpu[0 1 2]") -> str:
    options = [] if layout == "data parallel" else [f"    {part}" for part in layout.split(" + ")]
    return "\n".join([f"devices {devices}", *options, "", source])


@pytest.mark.parametrize("budget", list(BUDGETS))
def test_the_choice_follows_the_budget_and_fits_it(budget: str) -> None:
    checked = check_source(auto(GPT, budget), "gpt.ss", dims=DIMS)
    choice = checked.layout_choice
    assert choice is not None and choice.chosen.layout == BUDGETS[budget]
    assert choice.budget == int(float(budget.split()[0]) * 2 ** 20) and choice.chosen.held <= choice.budget
    assert (checked.device_set.split, checked.device_set.shard_params) == (choice.chosen.split, choice.chosen.shard_params)
    # every layout that fits sends at least as much, and the chosen one is among the weighed
    weighed = {c.layout: c for c in choice.costs}
    assert set(weighed) == {"data parallel", "shard params", "split D", "split D + shard params", "split H",
                            "split H + shard params", "split F", "split F + shard params"}
    assert all(c.sent >= choice.chosen.sent for c in choice.costs if c.fits(choice.budget))
    assert choice.step == "train_step" and choice.batch == 32


def test_the_costs_are_each_layouts_own_table() -> None:
    """What `layout auto` weighs for a layout is what that layout's own program's table says."""
    choice = check_source(auto(GPT), "gpt.ss", dims=DIMS).layout_choice
    assert choice is not None
    for cost in choice.costs:
        own = check_source(explicit(GPT, cost.layout), "gpt.ss", dims=DIMS)
        assert cost_of(own, "train_step", 32) == cost
        sent = device_table(own).fns["train_step"].bytes
        assert [str(s) for s in sent.free_symbols] in ([], ["b"])  # the batch's size alone is left to the call
        assert cost.sent == int(sent.subs({s: 32 for s in sent.free_symbols}))


def test_the_chosen_program_is_the_one_its_layout_line_compiles_to() -> None:
    chosen = check_source(auto(GPT, "10 MiB"), "gpt.ss", dims=DIMS)
    written = check_source(explicit(GPT, "split F + shard params"), "gpt.ss", dims=DIMS)
    targets = (Target.CONTROLLER, Target.WORKER)
    assert python_modules(chosen, targets) == python_modules(written, targets)


def test_nothing_fits_is_an_error_that_says_what_each_layout_needs() -> None:
    with pytest.raises(CompileError) as e:
        check_source(auto(GPT, "8 MiB"), "gpt.ss", dims=DIMS)
    (d,) = e.value.diagnostics
    assert d.code == "E1906" and d.span.line == 3  # at `memory 8 MiB`
    assert "no layout fits in 8.00 MiB a device" in d.message
    assert len(d.notes) == 8 and all("sends" in n and "a device" in n for n in d.notes)
    assert "the least any layout needs is 8.36 MiB" in d.help[0]


def test_a_written_layout_is_checked_against_memory() -> None:
    source = "devices cpu[0 1 2]\n    memory 11 MiB\n\n" + GPT
    with pytest.raises(CompileError) as e:
        check_source(source, "gpt.ss", dims=DIMS)  # data parallel holds 11.5 MiB
    assert e.value.diagnostics[0].code == "E1906" and "the layout, data parallel, doesn't fit" in str(e.value)
    check_source(source.replace("memory 11 MiB", "memory 12 MiB"), "gpt.ss", dims=DIMS)


def test_the_table_and_the_hover_show_the_choice_and_the_others() -> None:
    source = auto(GPT, "10 MiB")
    checked = check_source(source, "gpt.ss", dims=DIMS)
    text = report(checked)
    assert "Layout chosen by `layout auto`: split F + shard params, which sends 324 KiB a step" in text
    for layout in ("data parallel", "shard params", "split H", "split D", "split F"):
        assert f"    {layout}: " in text  # each other layout, with its bytes and its memory
    assert "    split F: too big: sends 236 KiB a step, holds 10.0 MiB a device" in text
    assert hover_text(checked, 2, 5).startswith("Layout chosen by `layout auto`: split F + shard params")
    html = DeviceTableView.of(checked).html()  # the notebook's table: a row a layout, the chosen first
    rows = re.findall(r'<tr class="ss-layout-([a-z-]+)">.*?<code>(.*?)</code>', html)
    assert rows[0] == ("chosen", "split F + shard params") and len(rows) == 8
    assert ("fits", "shard params") in rows and ("too-big", "split F") in rows and "Budget: 10.0 MiB a device" in html
    found = to_json(checked)["layout_choice"]
    assert found["chosen"] == "split F + shard params" and len(found["costs"]) == 8
    assert json.loads(json.dumps(found)) == found


def test_the_readme_mlp_chooses_by_its_budget() -> None:
    """The README MLP on 3 devices, where no dim of its params divides by 3: data parallel (3.14 MiB a
    device) with room, `shard params` (1.08 MiB) when its params, AdamW state and gradients don't fit whole."""
    source = README.replace("devices cuda[0 1 2]\n", "")
    roomy = check_source(auto(source, "4 MiB"), "mlp.ss").layout_choice
    tight = check_source(auto(source, "2 MiB"), "mlp.ss").layout_choice
    assert roomy is not None and tight is not None
    assert [c.layout for c in roomy.costs] == ["data parallel", "shard params"]
    assert roomy.chosen.layout == "data parallel" and tight.chosen.layout == "shard params"
    assert tight.chosen.held <= 2 * 2 ** 20 < roomy.chosen.held


@pytest.mark.parametrize("dims,budgets", [
    (NANO_SMALL, {"2 MiB": "data parallel", "1 MiB": "shard params"}),  # they hold 1.18 and 0.85 MiB
    (NANO_LARGER, {"16 MiB": "data parallel", "8 MiB": "shard params"}),  # 14.2 and 7.15 MiB
])
def test_nanogpt_chooses_by_its_budget_at_two_sizes(dims: dict[str, int], budgets: dict[str, str]) -> None:
    for budget, layout in budgets.items():
        choice = check_source(auto(NANOGPT, budget), "gpt.ss", dims=dims).layout_choice
        assert choice is not None and choice.chosen.layout == layout, (budget, choice)
        assert {c.layout for c in choice.costs} == {"data parallel", "shard params", "split H", "split H + shard params"}


def test_one_device_has_nothing_to_choose() -> None:
    assert check_source(auto(GPT, devices="cpu"), "gpt.ss", dims=DIMS).layout_choice is None


@pytest.mark.parametrize("options,code,words", [
    ("    layout auto\n    shard params\n", "E1905", "`layout auto` beside a layout of its own, `shard params`"),
    ("    split H\n    layout auto\n", "E1905", "`layout auto` beside a layout of its own, `split H`"),
    ("    layout auto\n    layout auto\n", "E0202", "a second `layout` option"),
    ("    memory 1 GiB\n    memory 2 GiB\n", "E0202", "a second `memory` option"),
    ("    layout manual\n", "E0105", "unknown layout `manual`"),
    ("    memory 40\n", "E0105", "expected a unit of memory after `memory 40`"),
    ("    memory lots GiB\n", "E0105", "expected an amount after `memory`"),
    ("    memory 0 GiB\n", "E0105", "`memory 0 GiB` isn't an amount a device can hold"),
    ("    memory 1e999 GiB\n", "E0105", "isn't an amount a device can hold"),
])
def test_wrong_options_are_errors(options: str, code: str, words: str) -> None:
    with pytest.raises(CompileError) as e:
        check_source(f"devices cpu[0 1 2]\n{options}\n" + GPT, "gpt.ss", dims=DIMS)
    assert e.value.diagnostics[0].code == code and words in str(e.value)
