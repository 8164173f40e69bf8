"""Paths and switches the tests share (imported as `support`, since each folder has its own conftest)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UPDATE_GOLDEN = os.environ.get("SHAPESCRIPT_UPDATE_GOLDEN") == "1"


def assert_golden(text: str, path: Path, update: bool = UPDATE_GOLDEN) -> None:
    """`text` is what the golden file at `path` holds. A missing golden file fails: one is written
    only when asked (`update`, from SHAPESCRIPT_UPDATE_GOLDEN=1), to be reviewed and committed."""
    if update:
        path.write_text(text)
    if not path.exists():
        raise AssertionError(f"no golden file {path}: run the test with SHAPESCRIPT_UPDATE_GOLDEN=1 to write "
                             f"it, then review it")
    assert text == path.read_text(), f"the output differs from {path}"

# A small program on several devices: a linear classifier, its step and a loop over a dataset.
LINEAR = textwrap.dedent("""\
    dim D = 4
    dim C = 3

    data Ex:
        x: [D]
        y: [] Index[C]

    model Lin:
        param w: [D C] = normal(std=0.1)

    fn scores(m: Lin, x: [b D]) -> [b C] = x @ m.w

    fn loss(m: Lin, batch: [b] Ex) -> [] = cross_entropy(scores(m, batch.x), batch.y, over=C)

    fn step(mut m: Lin, mut opt: AdamW[Lin], batch: [b] Ex) -> []:
        l, g = value_and_grad(loss, m, batch)
        update(mut m, mut opt, g)
        return l

    fn fit(mut m: Lin, mut opt: AdamW[Lin], data: Dataset[Ex], log: Sink):
        for batch in data |> shuffle(seed=1) |> batches(8):
            write(log, logs(loss=step(mut m, mut opt, batch)))
    """)
