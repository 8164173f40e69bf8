"""`precision mixed bf16` on several devices: the README MLP trains as on one device (cpu[0 1] and
cpu[0 1 2], and with `shard params`), and under `split H` the attention example's collectives are
sent in the dtypes the DeviceTable says: the heads' partial products in bf16 (half the bytes of f32),
the gradients of the f32 params in f32 (recorded on every worker, compared line by line). And
`precision mixed f16`: every worker skips the updates whose gradients overflowed, as one device does."""

from __future__ import annotations

import pytest
import torch
from programs import F16_OVERFLOWING, GPT, GPT_DIMS, README
from test_comms import _compare_a_step
from test_equivalence import digits

import shapescript as ss
from shapescript.pipeline import check_source
from shapescript.plan.comms import device_table

MIXED = "precision mixed bf16\n\n"
README_MIXED = MIXED + README.replace("devices cuda[0 1 2]\n", "")


def one_step(source: str, devices: str) -> tuple[float, dict[str, torch.Tensor]]:
    """One step from Mlp.init(seed=0) with AdamW(lr=1, eps=1, no decay), whose update of a param is
    g / (|g| + 1): smooth in the gradient g (AdamW's own eps would make it g / |g|, whose sign a
    rounding flips for the gradients near 0). The loss, and how far each param moved."""
    prog = ss.load(source, devices=devices, name="mlp.ss")
    try:
        m = prog.Mlp.init(seed=0)
        before = {k: v.clone() for k, v in m.state_dict().items()}
        loss = prog.train_step(m, ss.adamw(m, lr=1.0, eps=1.0, weight_decay=0.0), digits(1, 64, 784, 10)[0])
        return float(loss), {k: before[k] - v for k, v in m.state_dict().items()}
    finally:
        prog.stop()


@pytest.mark.slow
@pytest.mark.parametrize("devices,options", [("cpu[0 1]", ""), ("cpu[0 1 2]", ""), ("cpu[0 1 2]", "    shard params\n")])
def test_the_readme_mlp_in_mixed_precision_trains_as_on_one_device(devices: str, options: str) -> None:
    """Equal to one device's to bf16's rounding: each device's part of a gradient, a product over its
    rows of the batch, is rounded to bf16 (relative 2^-9) before the parts are added in f32, where one
    device rounds the whole batch's product once. Measured: within 0.7% of each param's largest
    update (2^-6 is 1.6%); the loss, in f32 from bf16 logits, within 3e-7."""
    ref_loss, ref_moved = one_step(README_MIXED, "cpu")
    loss, moved = one_step(f"devices cpu\n{options}\n" + README_MIXED if options else README_MIXED, devices)
    assert loss == pytest.approx(ref_loss, abs=1e-5)
    for k, want in ref_moved.items():
        torch.testing.assert_close(moved[k], want, atol=2 ** -6 * float(want.abs().max()), rtol=0, msg=k)


def test_the_table_counts_the_heads_partial_products_in_bf16() -> None:
    source = "devices cpu[0 1]\n    split H\n\n" + MIXED + GPT
    mixed = device_table(check_source(source, "gpt.ss", dims=GPT_DIMS))
    plain = device_table(check_source(source.replace(MIXED, ""), "gpt.ss", dims=GPT_DIMS))
    dtypes = {s.collective.dtype for s in mixed.fns["attend"].sent}
    assert dtypes == {"bf16"} and {s.collective.dtype for s in plain.fns["attend"].sent} == {"f32"}
    def shape(t):  # each collective but its dtype
        return [(s.collective.op, str(s.collective.count), s.times) for s in t.fns["attend"].sent]
    assert shape(mixed) == shape(plain)  # the same values, in half the bytes
    assert mixed.fns["attend"].bytes_text == "32·b·n bytes" and plain.fns["attend"].bytes_text == "64·b·n bytes"
    gradients = [s.collective for s in mixed.fns["train_step"].sent if "gradients" in s.collective.what]
    assert gradients and all(c.dtype == "f32" for c in gradients)  # the f32 params' gradients


@pytest.mark.slow
def test_what_a_mixed_step_sends_under_split_h_is_what_the_table_says() -> None:
    """Each collective's line, count and dtype, recorded on cpu[0 1]: test_comms's comparison."""
    g = torch.Generator().manual_seed(0)
    batch = {"tokens": torch.randint(0, 11, (7, 8), generator=g), "targets": torch.randint(0, 11, (7, 8), generator=g)}
    ops = _compare_a_step("devices cpu\n    split H\n\n" + MIXED + GPT, GPT_DIMS, "Gpt", lambda: (batch, ss.Eval), "cpu[0 1]",
                          {"b": 7})
    assert ops["all-reduce"] > 2


@pytest.mark.slow
@pytest.mark.parametrize("devices,options", [("cpu[0 1]", ""), ("cpu[0 1 2]", ""), ("cpu[0 1]", "    shard params\n")])
def test_f16_skips_the_same_updates_on_every_worker_as_on_one_device(devices: str, options: str) -> None:
    """`precision mixed f16` with a loss whose scaled backward overflows f16 at the first steps: every
    worker skips the same updates (each one's count of steps, asked of each), as one device does (the
    scale seeds each worker's backward over N, so that each holds the values one device would), and
    the params end as one device's, to AdamW's magnifying of f16's rounding (eps 1: within 2^-5 of the
    largest move; measured within 1.6%)."""
    source = f"devices cpu\n{options}\n" + F16_OVERFLOWING if options else F16_OVERFLOWING
    data = digits(8, 64, 784, 10)
    runs = {}
    for where in ("cpu", devices):
        prog = ss.load(source if where == devices else F16_OVERFLOWING, devices=where, name="mlp.ss")
        try:
            m = prog.Mlp.init(seed=0)
            before = {k: v.clone() for k, v in m.state_dict().items()}
            opt = ss.adamw(m, lr=1e-3, eps=1.0, weight_decay=0.0)
            losses = [float(prog.train_step(m, opt, batch)) for batch in data]
            steps = prog.workers().call("optimizer_steps", (opt._handle,)) if where != "cpu" else [opt.steps]
            runs[where] = (losses, steps, {k: before[k] - v for k, v in m.state_dict().items()})
        finally:
            prog.stop()
    (ref_losses, (ref_steps,), ref_moved), (losses, steps, moved) = runs["cpu"], runs[devices]
    assert 0 < ref_steps < len(data)  # some updates were skipped
    assert steps == [ref_steps] * len(steps)  # every worker skipped those, and only those
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    for k, want in ref_moved.items():
        torch.testing.assert_close(moved[k], want, atol=2 ** -5 * float(want.abs().max()), rtol=0, msg=k)
