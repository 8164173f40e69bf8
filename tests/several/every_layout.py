"""A program loaded on every device count and with the layout options, for the tests that compare
what it computes on each with one device's: one pool each, kept for a test file (its fixture)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import shapescript as ss

# The options' header: the devices each load gives replace its line, and the options stay.
OPTIONS = "devices cpu\n    split H\n    shard params\n\n"


def loaded_everywhere(source: str, name: str, with_options: str = "cpu[0 1]") -> Iterator[dict[str, Any]]:
    """`source` loaded on cpu, cpu[0 1] and cpu[0 1 2], and on `with_options` with `split H` and
    `shard params`, by those names (the last `"cpu[0 1] split H, shard params"`); stopped after."""
    loads = {"cpu": source, "cpu[0 1]": source, "cpu[0 1 2]": source,
             f"{with_options} split H, shard params": OPTIONS + source}
    progs: dict[str, Any] = {}
    try:
        for label, text in loads.items():
            progs[label] = ss.load(text, devices=label.split(" split")[0], name=name)
        yield progs
    finally:
        for prog in progs.values():
            prog.stop()


def one_step_everywhere(programs: dict[str, Any], data: Any) -> dict[str, tuple[Any, dict[str, Any]]]:
    """On each, one `train_step(m, ss.sgd(m, lr=1.0), data)` from `Net.init(seed=0)`: its loss, and
    how far each param and buffer moved (with lr 1, a param's gradient)."""
    results = {}
    for devices, prog in programs.items():
        m = prog.Net.init(seed=0)
        before = {k: v.clone() for k, v in m.state_dict().items()}
        loss = prog.train_step(m, ss.sgd(m, lr=1.0), data)
        results[devices] = (loss, {k: before[k] - v for k, v in m.state_dict().items()})
    return results
