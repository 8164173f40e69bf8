"""The DeviceTable (plan/comms.py, `device_table(checked)`): what each line sends between the devices,
in values, dtype and bytes, checked against the tensors each all-reduce combines, built here with
torch (a batch of BATCH examples; no figure depends on it), and the values' layouts."""

from __future__ import annotations

import programs as P
import sympy
import torch
import torch.nn.functional as F
from facts import build, line_of
from support import README_MLP_SHAPES, param_and_adamw_bytes

from shapescript.plan.comms import DeviceTable, device_table

BATCH = 8
D, C = 4, 3  # LIN_HEADER's dims


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def sums_and_count(result: torch.Tensor) -> torch.Tensor:
    """What a mean over the batch all-reduces: its sums, and the count, in the result's dtype."""
    return torch.cat([result.reshape(-1), result.new_tensor([BATCH])])


def loss_sum_and_count(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """What cross_entropy all-reduces: the sum of the losses and the count."""
    total = F.cross_entropy(logits, labels, reduction="sum")
    return torch.stack([total, total.new_tensor(float(len(labels)))])


def whole(figure: sympy.Basic | None) -> int:
    """A figure of the table that the types fix: a whole number."""
    assert isinstance(figure, sympy.Integer), figure
    return int(figure)


def line_bytes(table: DeviceTable) -> dict[int, int]:
    """Each line that sends anything: its bytes per run, its calls included."""
    return {line: int(sum(item.bytes for item in items)) for line, items in table.lines.items()}


def example_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(BATCH, D, generator=g), torch.randint(0, C, (BATCH,), generator=g), torch.randn(D, C)


def test_each_combined_operation_sends_what_it_combines() -> None:
    x, y, w = example_batch()
    at = {name: line_of(P.SPLIT_OPS, f"fn {name}(") for name in ("total", "average", "overall", "gram",
                                                                  "gram_einsum", "column_sums", "loss",
                                                                  "mean_score")}
    assert line_bytes(device_table(build(P.SPLIT_OPS, "cpu[0 1]"))) == {
        at["total"]: nbytes(x.sum(0)),
        at["average"]: nbytes(sums_and_count(x.mean(0))),
        at["overall"]: nbytes(sums_and_count(x.mean())),
        at["gram"]: nbytes(x.T @ x),
        at["gram_einsum"]: nbytes(torch.einsum("bd,be->de", x, x)),
        at["column_sums"]: nbytes(x.sum(0)),
        at["loss"]: nbytes(loss_sum_and_count(x @ w, y)),
        at["mean_score"]: nbytes(sums_and_count((x @ w).mean())),
    }


def test_the_bytes_dont_depend_on_the_device_count_and_one_device_sends_nothing() -> None:
    two = line_bytes(device_table(build(P.SPLIT_OPS, "cpu[0 1]")))
    assert line_bytes(device_table(build(P.SPLIT_OPS, "cpu[0 1 2]"))) == two
    assert device_table(build(P.SPLIT_OPS, "cpu")).lines == {}


def test_an_all_reduce_sends_its_results_dtype() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, 4, generator=g, dtype=torch.float64)
    n = torch.randint(0, 9, (BATCH, 4), generator=g, dtype=torch.int32)
    h = torch.randn(BATCH, 4, generator=g).half()
    table = device_table(build(P.MIXED_DTYPES, "cpu[0 1]"))
    sent = {line: [(int(s.collective.count), s.collective.dtype, int(s.bytes)) for item in items for s in item.sent]
            for line, items in table.lines.items()}
    names = {torch.float64: "f64", torch.int64: "i64", torch.float16: "f16"}
    expected = {"f64_total": x.sum(0), "i32_total": n.sum(0), "f16_mean": sums_and_count(h.mean())}
    assert sent == {line_of(P.MIXED_DTYPES, f"fn {fn}("): [(t.numel(), names[t.dtype], nbytes(t))]
                    for fn, t in expected.items()}
    assert expected["i32_total"].dtype == torch.int64  # torch widens an i32 sum, and so does the table


def test_a_step_sends_the_gradients_and_its_loss_forward_and_backward() -> None:
    """LINEAR's step on two devices: value_and_grad all-reduces w's gradient, and the loss it
    differentiates all-reduces its sum and count twice (the backward pass runs one as big); the
    controller's loop sends what the step it calls sends."""
    x, y, w = example_batch()
    w.requires_grad_()
    F.cross_entropy(x @ w, y).backward()
    assert w.grad is not None
    gradients, loss = nbytes(w.grad), nbytes(loss_sum_and_count(x @ w, y))
    table = device_table(build(P.LINEAR, "cpu[0 1]"))
    step_line = line_of(P.LINEAR, "value_and_grad")
    [item] = table.line(step_line)
    assert item.callee == "loss" and item.differentiated
    assert [(int(s.bytes), s.times, s.via) for s in item.sent] == [(gradients, 1, ()), (2 * loss, 2, ("loss",))]
    assert line_bytes(table) == {line_of(P.LINEAR, "fn loss("): loss, step_line: gradients + 2 * loss,
                                 line_of(P.LINEAR, "write(log"): gradients + 2 * loss}
    assert {name: int(plan.bytes) for name, plan in table.fns.items()} == {
        "scores": 0, "loss": loss, "step": gradients + 2 * loss, "fit": gradients + 2 * loss}
    assert int(sum(s.bytes for s in table.fns["loss"].sent_differentiated)) == 2 * loss


def test_the_readmes_step_on_three_gpus_sends_the_manuals_figures() -> None:
    """The manual's hover: the value_and_grad line all-reduces the gradients of w1 and w2 (203,264
    f32s, 813,056 bytes) and, inside `loss`, cross_entropy's sum and count forward and backward (16
    bytes): 813,072 bytes, here from torch's own gradients."""
    params = [torch.zeros(shape, requires_grad=True) for shape in README_MLP_SHAPES]
    x, y = torch.randn(BATCH, README_MLP_SHAPES[0][0]), torch.randint(0, README_MLP_SHAPES[1][1], (BATCH,))
    logits = torch.relu(x @ params[0]) @ params[1]
    F.cross_entropy(logits, y).backward()
    gradients = nbytes(*(p.grad for p in params if p.grad is not None))
    table = device_table(build(P.README, "cuda[0 1 2]"))
    [item] = table.line(line_of(P.README, "value_and_grad"))
    assert [int(s.bytes) for s in item.sent] == [gradients, 2 * nbytes(loss_sum_and_count(logits, y))]
    assert whole(item.bytes) == 813_072 == gradients + 16


def test_batch_norm_all_reduces_its_statistics_in_f64() -> None:
    """BATCH_NORM's train_step: the gradients of w1 and w2 (its buffers aren't trained), and in the
    loss, batch_norm's per-channel sums and sums of squares and the count in f64, and cross_entropy's
    sum and count, each twice under value_and_grad."""
    net = {"w1": torch.zeros(6, 8, requires_grad=True), "w2": torch.zeros(8, 3, requires_grad=True)}
    x, y = torch.randn(BATCH, 6), torch.randint(0, 3, (BATCH,))
    hidden = torch.relu(F.batch_norm(x @ net["w1"], None, None, training=True))
    F.cross_entropy(hidden @ net["w2"], y).backward()
    gradients = nbytes(*(p.grad for p in net.values() if p.grad is not None))
    h64 = (x @ net["w1"]).detach().double()
    statistics = torch.cat([h64.sum(0), (h64 * h64).sum(0), h64.new_tensor([BATCH])])
    loss = loss_sum_and_count(hidden @ net["w2"], y)
    table = device_table(build(P.BATCH_NORM, "cpu[0 1]"))
    step_line = line_of(P.BATCH_NORM, "value_and_grad")
    assert line_bytes(table)[step_line] == gradients + 2 * nbytes(statistics) + 2 * nbytes(loss)
    assert line_bytes(table)[line_of(P.BATCH_NORM, "batch_norm(")] == nbytes(statistics)


def test_a_padded_dims_bytes_stay_symbolic() -> None:
    """The sum over the batch of a [b n D] field sends n·D f32s, for whatever n a batch pads to."""
    [item] = device_table(build(P.PADDED, "cpu[0 1]")).line(line_of(P.PADDED, "fn total("))
    [n] = item.bytes.free_symbols
    for length in (1, 5):
        assert whole(item.bytes.subs(n, length)) == nbytes(torch.zeros(BATCH, length, 4).sum(0))
    assert isinstance(item.bytes, sympy.Expr) and not item.bytes.is_Integer


def test_the_values_layouts_and_sizes() -> None:
    """LINEAR on two devices: the model a copy on every device, AdamW's state beside it, the batch
    split with its bytes per example, and the loop's batch loaded in parts."""
    params, adamw_state = param_and_adamw_bytes([(D, C)])
    x, y, _ = example_batch()
    table = device_table(build(P.LINEAR, "cpu[0 1]"))
    assert whole(table.models["Lin"].bytes) == params
    step = {v.name: v for v in table.values if v.fn == "step"}
    assert step["m"].kind == "model" and whole(step["m"].bytes) == params
    # torch's AdamW also keeps a step count per param; the table counts the two moments
    assert step["opt"].kind == "optimizer" and whole(step["opt"].bytes) == 2 * params <= adamw_state
    batch = step["batch"]
    assert (batch.kind, batch.axis, whole(batch.per_example)) == ("split", "b", nbytes(x[0], y[0]))
    loop_batch = next(v for v in table.values if v.fn == "fit" and v.name == "batch")
    assert loop_batch.kind == "split" and table.shares() == [4, 4]  # fit's batches(8) over two devices
