"""examples/nanogpt: gpt.ss equals nanoGPT's GPT written by hand in PyTorch (reference.py), in f64,
on sequences shorter than the block size: the same logits and loss, and the same params after
training steps with nanoGPT's two AdamW groups (weight decay on the 2-D params only). It equals
nanoGPT's own model.py too (benchmarks/third_party/nanogpt, the reference of benchmarks/gpu_gpt.py):
the same loss and gradients."""

from __future__ import annotations

import importlib.util
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from support import ROOT

import shapescript as ss

HERE = ROOT / "examples" / "nanogpt"
V, T, H, DH, L = 13, 16, 2, 4, 2
DIMS = {"V": V, "T": T, "H": H, "Dh": DH, "L": L}
TOLERANCE = 1e-6


def load_reference():
    spec = importlib.util.spec_from_file_location("nanogpt_reference", HERE / "reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def prog() -> ss.Program:
    with warnings.catch_warnings():  # the small sizes replace gpt.ss's GPT-2 ones on purpose
        warnings.filterwarnings("ignore", message=".*sizes given when loading replace", category=UserWarning)
        return ss.load(HERE / "gpt.ss", dims=DIMS)


def both_models(prog: ss.Program, seed: int = 0):
    """The gpt.ss model and nanoGPT's, holding the same params, in f64; nanoGPT's in eval (no dropout)."""
    reference = load_reference()
    m = prog.Gpt.init(seed=seed)
    config = reference.GPTConfig(block_size=T, vocab_size=V, n_layer=L, n_head=H, n_embd=H * DH)
    hand = reference.GPT(config).double()
    hand.load_shapescript(m.state_dict())
    hand.eval()
    return m, hand, reference


def tokens(b: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (b, n), generator=g), torch.randint(0, V, (b, n), generator=g)


def assert_same_params(m, hand, reference) -> None:
    own = dict(hand.named_parameters())
    for name, value in m.state_dict().items():
        target, transpose = reference.torch_name(name)
        theirs = own[target].detach()
        torch.testing.assert_close(value, theirs.T if transpose else theirs, atol=TOLERANCE, rtol=0, msg=name)


@pytest.mark.parametrize("n", [1, 7, T])
def test_logits_and_loss_equal_nanogpt_for_sequences_up_to_the_block_size(prog, n: int) -> None:
    m, hand, _ = both_models(prog)
    x, y = tokens(3, n, seed=n)
    logits = prog.logits(m, x, ss.Eval)
    expected, expected_loss = hand(x, y)
    assert logits.dtype == torch.float64 and logits.shape == (3, n, V)
    torch.testing.assert_close(logits, expected.detach(), atol=TOLERANCE, rtol=0)
    loss = prog.loss(m, {"tokens": x, "targets": y}, ss.Eval)
    assert float(loss) == pytest.approx(expected_loss.item(), abs=TOLERANCE)
    assert expected.std() > 0.01  # a real comparison: the logits are not all alike


def test_training_steps_with_param_groups_equal_nanogpt(prog) -> None:
    m, hand, reference = both_models(prog, seed=1)
    opt = ss.adamw(m, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, no_decay=lambda name, p: p.ndim < 2)
    hand_opt = hand.configure_optimizers(weight_decay=0.1, learning_rate=1e-2, betas=(0.9, 0.95))
    # the same groups: nanoGPT's no-decay group is exactly the params gpt.ss leaves undecayed
    names = {id(p): name for name, p in hand.named_parameters()}
    undecayed = {names[id(p)] for p in hand_opt.param_groups[1]["params"]}
    assert {reference.torch_name(n)[0] for n in opt.hyper["no_decay"]} == undecayed
    assert "transformer.wte.weight" not in undecayed and "transformer.h.0.attn.c_attn.bias" in undecayed
    before = m.state_dict()
    for step in range(3):
        x, y = tokens(4, 11, seed=10 + step)  # 11 of the block's 16 positions
        loss = prog.train_step(m, opt, {"tokens": x, "targets": y}, ss.Eval)
        _, expected = hand(x, y)
        expected.backward()
        torch.nn.utils.clip_grad_norm_(hand.parameters(), 1.0)  # nanoGPT's grad_clip
        hand_opt.step()
        hand_opt.zero_grad(set_to_none=True)
        assert float(loss) == pytest.approx(expected.item(), abs=TOLERANCE)
    assert_same_params(m, hand, reference)
    moved = [name for name, value in m.state_dict().items() if not torch.equal(value, before[name])]
    assert len(moved) == len(before)  # every param trained, wte through both its uses


# gpt.ss's gradients, read in Python (a program's results have no autograd history)
GRADIENTS = """
fn gradients(m: Gpt, batch: [b] Text) -> Grad[Gpt]:
    _, g = value_and_grad(loss, m, batch, Eval())
    return g
"""


def load_gpu_gpt(monkeypatch: pytest.MonkeyPatch):
    """benchmarks/gpu_gpt.py, whose nanoGPT side is nanoGPT's own model.py, unmodified. The script puts
    benchmarks/ on sys.path, for this test only."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location("gpu_gpt", ROOT / "benchmarks" / "gpu_gpt.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_nanogpts_own_model_py_gives_gpt_ss_loss_and_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark's reference side computes what gpt.ss does: nanoGPT's model.py, given gpt.ss's
    initial weights by gpu_gpt.py's own loading, has the same loss in f64, and after a backward the
    same gradient of every param (wte's through both its uses, the tied lm_head's included)."""
    gpu_gpt = load_gpu_gpt(monkeypatch)
    with warnings.catch_warnings():  # the small sizes replace gpt.ss's GPT-2 ones on purpose
        warnings.filterwarnings("ignore", message=".*sizes given when loading replace", category=UserWarning)
        prog = ss.load((HERE / "gpt.ss").read_text() + GRADIENTS, dims=DIMS, name="gpt.ss")
    m = prog.Gpt.init(seed=2)
    nanogpt = gpu_gpt.nanogpt_model(DIMS, m.state_dict())
    assert type(nanogpt).__module__ == "nanogpt_model" and nanogpt.lm_head.weight.dtype == torch.float64
    x, y = tokens(3, T - 3, seed=4)
    batch = {"tokens": x, "targets": y}
    _, expected = nanogpt(x, y)
    expected.backward()
    assert float(prog.loss(m, batch, ss.Eval)) == pytest.approx(expected.item(), abs=1e-10)
    params = dict(nanogpt.named_parameters())
    gradients = prog.gradients(m, batch).named()
    assert len(gradients) == len(params)
    for name, gradient in gradients.items():
        target, transpose = gpu_gpt.REFERENCE.torch_name(name)
        theirs = params[target].grad
        torch.testing.assert_close(gradient, theirs.T if transpose else theirs, atol=1e-10, rtol=0, msg=name)
    assert gradients["wte"].abs().max() > 1e-3  # a real comparison: the gradients are not all zero


def test_a_sequence_longer_than_the_block_size_is_a_shape_error_naming_the_line(prog) -> None:
    m, _, _ = both_models(prog)
    x, _ = tokens(2, T + 1, seed=0)
    with pytest.raises(ss.ShapeError) as info:
        prog.logits(m, x, ss.Eval)
    line = next(k for k, text in enumerate((HERE / "gpt.ss").read_text().splitlines(), 1) if "first(m.wpe, n)" in text)
    message = str(info.value)
    assert f"gpt.ss:{line}:" in message and f"n = {T + 1}" in message and f"which has only {T}" in message


@pytest.mark.slow
def test_two_devices_train_as_one(prog) -> None:
    """On cpu[0 1] each device holds half of each batch; `first(m.wpe, n)` reads positions, never
    the batch axis, so the steps are one device's (dropout included: Train draws the whole batch's mask)."""
    results = []
    for devices in ("cpu", "cpu[0 1]"):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*sizes given when loading replace", category=UserWarning)
            several = ss.load(HERE / "gpt.ss", dims=DIMS, devices=devices)
        try:
            m = several.Gpt.init(seed=0)
            opt = ss.adamw(m, lr=1e-2, weight_decay=0.1, no_decay=lambda name, p: p.ndim < 2)
            mode = ss.Train(seed=0)
            losses = []
            for step in range(3):
                x, y = tokens(6, 11, seed=20 + step)
                losses.append(float(several.train_step(m, opt, {"tokens": x, "targets": y}, mode)))
            results.append((losses, m.state_dict()))
        finally:
            several.stop()
    (one, one_state), (two, two_state) = results
    assert two == pytest.approx(one, abs=TOLERANCE)
    for name, value in one_state.items():
        torch.testing.assert_close(two_state[name], value, atol=TOLERANCE, rtol=0, msg=name)


class Sequences:
    """Token sequences of different lengths, each item a dict of one sequence's fields."""

    def __init__(self, lengths: list[int], seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.items = [torch.randint(0, V, (n + 1,), generator=g) for n in lengths]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"tokens": self.items[i][:-1], "targets": self.items[i][1:]}


def test_a_padded_batch_of_different_lengths_equals_nanogpt_ignoring_the_padding(prog) -> None:
    """The loader pads each batch to its longest sequence; nanoGPT's own way is targets of -1
    (ignore_index) at the padding. Causal attention keeps padding out of the positions before it."""
    m, hand, _ = both_models(prog)
    lengths = [4, 12, 7, 9, 1, 12, 3, 5, 10, 6]  # batches(8): one of 8, padded to 12, and one of 2
    data = Sequences(lengths, seed=3)
    log = ss.sinks.memory()
    prog.evaluate(m, data, log)
    for record, start in zip(log.records, (0, 8)):
        items = [data[k] for k in range(start, min(start + 8, len(data)))]
        n = max(len(item["tokens"]) for item in items)
        x = torch.stack([F.pad(item["tokens"], (0, n - len(item["tokens"])), value=0) for item in items])
        y = torch.stack([F.pad(item["targets"], (0, n - len(item["targets"])), value=-1) for item in items])
        _, expected = hand(x, y)
        assert record["loss"] == pytest.approx(expected.item(), abs=TOLERANCE)
    assert len(log.records) == 2
