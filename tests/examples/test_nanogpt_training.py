"""examples/nanogpt's training run and sampler against nanoGPT's, in f64 at a tiny size: gpt.ss's
`accumulate_step` (M = 4 micro-batches, clipping, AdamW with nanoGPT's param groups, the
warmup-cosine schedule) for 20 iterations equals train_reference.py's transcription of train.py's
loop, every lr, loss and param, on cpu, cpu[0 1] and cpu[0 1 2], with one gradient all-reduce per
optimizer step; a run stopped after 10 iterations and resumed in a fresh process ends where 20
straight ones do; `generate` with top k = 1 equals nanoGPT's `generate` token for token, and
sampling with a seed repeats and is the same on cpu[0 1] as on cpu."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import load_file, save_file
from support import ROOT

import shapescript as ss

HERE = ROOT / "examples" / "nanogpt"
V, T, H, DH, L, M = 13, 8, 2, 4, 2, 4
DIMS = {"V": V, "T": T, "H": H, "Dh": DH, "L": L, "M": M, "New": 12, "TopK": 1}
B, ITERS, TOLERANCE = 6, 20, 1e-10
PEAK, WARMUP, DECAY_UNTIL, FLOOR = 1e-2, 5, 15, 1e-3


def module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"nanogpt_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded
    spec.loader.exec_module(loaded)
    return loaded


def load(devices: str = "cpu", **dims: int) -> ss.Program:
    with warnings.catch_warnings():  # the small sizes replace gpt.ss's GPT-2 ones on purpose
        warnings.filterwarnings("ignore", message=".*sizes given when loading replace", category=UserWarning)
        return ss.load(HERE / "gpt.ss", dims={**DIMS, **dims}, devices=devices)


def micro_batch(it: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Micro-batch k of iteration `it`: B sequences of T tokens and their successors."""
    g = torch.Generator().manual_seed(1000 * it + k)
    seq = torch.randint(0, V, (B, T + 1), generator=g)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def step_batch(it: int) -> dict[str, torch.Tensor]:
    """Iteration `it`'s M micro-batches as one batch of `Steps`: row k of each example is micro-batch k's."""
    xs, ys = zip(*(micro_batch(it, k) for k in range(M)))
    return {"tokens": torch.stack(xs, dim=1), "targets": torch.stack(ys, dim=1)}


def optimizer(m: object) -> object:
    schedule = ss.schedules.warmup_cosine(PEAK, warmup=WARMUP, decay_until=DECAY_UNTIL, floor=FLOOR)
    return ss.adamw(m, lr=schedule, betas=(0.9, 0.95), weight_decay=0.1, no_decay=lambda name, p: p.ndim < 2)


def run(prog: ss.Program, m: object, opt: object, iters: range) -> list[tuple[float, float]]:
    """Each iteration's (lr, mean micro-batch loss)."""
    out = []
    for it in iters:
        lr = opt.lr
        out.append((lr, float(prog.accumulate_step(m, opt, step_batch(it), ss.Eval))))
    return out


def reference_run(state: dict[str, torch.Tensor]) -> tuple[list[tuple[float, float]], torch.nn.Module]:
    reference, train = module("reference"), module("train_reference")
    config = reference.GPTConfig(block_size=T, vocab_size=V, n_layer=L, n_head=H, n_embd=H * DH, dropout=0.0)
    hand = reference.GPT(config).double()
    hand.load_shapescript(state)
    settings = train.TrainConfig(learning_rate=PEAK, warmup_iters=WARMUP, lr_decay_iters=DECAY_UNTIL, min_lr=FLOOR,
                                 weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0,
                                 gradient_accumulation_steps=M)
    records = train.train(hand, train.make_optimizer(hand, settings), settings, micro_batch, 0, ITERS)
    return [(r.lr, sum(r.micro_losses) / M) for r in records], hand


def assert_same_params(state: dict[str, torch.Tensor], hand: torch.nn.Module) -> None:
    reference = module("reference")
    own = dict(hand.named_parameters())
    for name, value in state.items():
        target, transpose = reference.torch_name(name)
        theirs = own[target].detach()
        torch.testing.assert_close(value, theirs.T if transpose else theirs, atol=TOLERANCE, rtol=0, msg=name)


@pytest.fixture(scope="module")
def nanogpt_run() -> tuple[dict[str, torch.Tensor], list[tuple[float, float]], torch.nn.Module]:
    m = load().Gpt.init(seed=0)
    start = m.state_dict()
    records, hand = reference_run(start)
    return start, records, hand


@pytest.mark.parametrize("devices", ["cpu", "cpu[0 1]", "cpu[0 1 2]"])
def test_twenty_iterations_of_four_micro_steps_equal_nanogpts_train_loop(nanogpt_run, devices: str) -> None:
    start, expected, hand = nanogpt_run
    prog = load(devices)
    try:
        m = prog.Gpt.init(seed=0)  # the same params on every device count
        assert all(torch.equal(value, start[name]) for name, value in m.state_dict().items())
        got = run(prog, m, optimizer(m), range(ITERS))
        for it, ((lr, loss), (want_lr, want_loss)) in enumerate(zip(got, expected)):
            assert lr == pytest.approx(want_lr, abs=1e-15, rel=0), it
            assert loss == pytest.approx(want_loss, abs=TOLERANCE, rel=0), it
        assert_same_params(m.state_dict(), hand)
        if devices != "cpu":  # the micro-batches' gradients meet once a step, where clip_norm reads them
            sent = prog.device_table.fns["accumulate_step"].sent
            gradients = [s for s in sent if s.collective.what.startswith("the gradients")]
            assert [(s.times, s.collective.span.line) for s in gradients] == [(1, line_of("clip_norm(g / M"))]
            micro = [s for s in sent if s.via == ("micro_loss",)]
            # the loss's own sum and count, in the forward and the backward pass of each micro-batch
            assert sorted(s.times for s in micro) == [2, 2 * (M - 1)]
    finally:
        prog.stop()


def line_of(text: str) -> int:
    return next(k for k, line in enumerate((HERE / "gpt.ss").read_text().splitlines(), 1) if text in line)




def test_stopping_after_ten_iterations_and_resuming_in_a_fresh_process_equals_twenty_straight(
        nanogpt_run, tmp_path: Path) -> None:
    _, _, hand = nanogpt_run
    prog = load()
    m = prog.Gpt.init(seed=0)
    opt = optimizer(m)
    run(prog, m, opt, range(10))
    ss.save(tmp_path / "ckpt.safetensors", m, opt)
    script = (f"import sys; sys.path.insert(0, {str(ROOT / 'tests' / 'examples')!r})\n"
              "from test_nanogpt_training import resumed_process\n"
              f"resumed_process({str(tmp_path / 'ckpt.safetensors')!r}, {str(tmp_path / 'out.safetensors')!r})\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT / "tests", capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert_same_params(load_file(tmp_path / "out.safetensors"), hand)


def resumed_process(checkpoint: str, out: str) -> None:
    """The second half of the run, in a process of its own: a fresh model and optimizer (another
    init, another lr) restored from the checkpoint, iterations 10 to 19, the params saved to `out`."""
    prog = load()
    m = prog.Gpt.init(seed=5)
    opt = ss.adamw(m, lr=0.5)
    ss.restore(checkpoint, m, opt)
    assert opt.steps == 10
    run(prog, m, opt, range(10, ITERS))
    save_file({name: value.contiguous() for name, value in m.state_dict().items()}, out)


def test_greedy_generation_equals_nanogpts_generate_token_for_token() -> None:
    prog = load()
    m = prog.Gpt.init(seed=0)
    hand = module("reference").GPT(module("reference").GPTConfig(
        block_size=T, vocab_size=V, n_layer=L, n_head=H, n_embd=H * DH, dropout=0.0)).double()
    hand.load_shapescript(m.state_dict())
    hand.eval()
    prompt = torch.randint(0, V, (5, 3), generator=torch.Generator().manual_seed(1))
    got = prog.generate(m, {"tokens": prompt}, 0.8, ss.Train(seed=3))
    expected = hand.generate(prompt, DIMS["New"], temperature=0.8, top_k=1)
    assert got.shape == (5, 3 + DIMS["New"]) and 3 + DIMS["New"] > T  # the context was cropped
    assert torch.equal(got, expected)
    assert len(set(got[:, 3:].flatten().tolist())) > 1  # a real comparison: not one token over and over


def test_sampling_with_a_seed_repeats_and_is_the_same_on_two_devices() -> None:
    prompt = {"tokens": torch.randint(0, V, (4, 2), generator=torch.Generator().manual_seed(2))}
    samples = []
    for devices in ("cpu", "cpu[0 1]"):
        prog = load(devices, TopK=5)
        try:
            m = prog.Gpt.init(seed=0)
            samples += [prog.generate(m, prompt, 1.0, ss.Train(seed=7)) for _ in range(2)]
        finally:
            prog.stop()
    other = load(TopK=5)
    assert all(torch.equal(s, samples[0]) for s in samples)
    assert not torch.equal(other.generate(other.Gpt.init(seed=0), prompt, 1.0, ss.Train(seed=8)), samples[0])
