"""A GPT training step: ShapeScript's nanoGPT (examples/nanogpt/gpt.ss, in f32) against nanoGPT's own
model.py (Karpathy's, unmodified, in benchmarks/third_party/nanogpt), side by side in one run on the
same device and the same batches (issue 41):

    python benchmarks/gpu_gpt.py               # the baby GPT on cuda:0
    python benchmarks/gpu_gpt.py --quick       # a tiny GPT on the CPU: checks the script, not a figure
    python benchmarks/gpu_gpt.py --device cpu  # the baby GPT on the CPU (slow; compiling takes minutes)

The baby GPT is nanoGPT's config/train_shakespeare_char.py: n_layer 6, n_head 6, n_embd 384,
block_size 256, batches of 64 sequences, a vocabulary of 65 characters. That config trains with
dropout 0.2; here both sides run without dropout (0.0), so that they compute the same function and
their losses compare. nanoGPT's GPT is built with bias=True, as gpt.ss has biases.

Each side is a step of AdamW (lr 6e-4, betas (0.9, 0.95), weight decay 0.1 on the 2-D params only:
train.py's defaults; the shakespeare_char config's lr 1e-3 and beta2 0.99 cost the same), its
gradients clipped to norm 1.0 (train.py's grad_clip):

- nanoGPT eager f32: its GPT, no autocast, no compile, AdamW over nanoGPT's two param groups, not fused;
- nanoGPT's defaults, as its train.py sets them: bf16 autocast around the forward (`ctx`), the model
  through torch.compile, and `configure_optimizers`' AdamW (fused on cuda) — the reference of the
  mixed-precision sides. Where train.py differs, so that the sides stay comparable: on a GPU without
  bf16 it would train in f16 with a GradScaler, here in f32; on the CPU it uses no autocast, here bf16
  as on a GPU; and it allows TF32 matmuls, which change nothing under bf16 autocast and are left off
  so that the f32 sides stay f32;
- ShapeScript f32 (`prog.train_step`), ShapeScript `precision mixed bf16`, and the same loaded with
  `compiled=True` (each pure function on the device handed to torch.compile); on cuda ShapeScript
  records each step and replays it as a CUDA graph, by default (SHAPESCRIPT_RECORD).

After a warmup (compiling, recording), the sides take turns in blocks (ABC..CBA), each step ended by
a device synchronize; a figure is a side's median step, the ratios against nanoGPT's defaults and
against nanoGPT eager f32; on a GPU each side's peak memory during its first steps, above what was
held before them. Their first losses are printed: the same model from the same weights
(ShapeScript's, copied into nanoGPT's) gives the same loss to the dtype's rounding.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (ROOT, HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import torch  # noqa: E402
from common import cpu_model  # noqa: E402  (benchmarks/common.py)

import shapescript as ss  # noqa: E402


def load_by_path(name: str, path: Path) -> ModuleType:
    """Import a file that is not on sys.path, once a process. It is in sys.modules before it runs:
    @dataclass looks its class's module up there."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


NANOGPT = load_by_path("nanogpt_model", HERE / "third_party" / "nanogpt" / "model.py")  # nanoGPT's own
REFERENCE = load_by_path("nanogpt_reference", ROOT / "examples" / "nanogpt" / "reference.py")  # its torch_name

BABY = {"V": 65, "T": 256, "H": 6, "Dh": 64, "L": 6, "M": 1, "New": 1, "TopK": 1}  # nanoGPT's shakespeare-char
TINY = {"V": 65, "T": 32, "H": 2, "Dh": 16, "L": 2, "M": 1, "New": 1, "TopK": 1}
F32_SOURCE = ((ROOT / "examples" / "nanogpt" / "gpt.ss").read_text()  # its types in f32
              .replace("] f64", "]").replace("-1e300", "-1e30"))
Step = Callable[[dict[str, torch.Tensor]], torch.Tensor | float]  # a loss, left on the device


def load_shapescript_weights(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy a gpt.ss model's params (its `state_dict()`) into nanoGPT's GPT, each to the param that
    examples/nanogpt/reference.py's `torch_name` names, an nn.Linear's weight transposed ([out, in]
    there, [in out] in gpt.ss). named_parameters() lists the head's weight, tied to wte's, once (as
    transformer.wte.weight), and leaves out the causal mask nanoGPT keeps as a buffer `attn.bias`
    where it has no flash attention: each param is written once, the tie kept."""
    params = dict(model.named_parameters())
    targets = {name: REFERENCE.torch_name(name) for name in state}
    assert sorted(target for target, _ in targets.values()) == sorted(params), (sorted(state), sorted(params))
    assert model.lm_head.weight is model.transformer.wte.weight
    with torch.no_grad():
        for name, (target, transpose) in targets.items():
            value = state[name].T if transpose else state[name]
            assert params[target].shape == value.shape, (name, target)  # copy_ would broadcast
            params[target].copy_(value)


def nanogpt_model(dims: dict[str, int], state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """nanoGPT's GPT of gpt.ss's sizes, without dropout, holding a gpt.ss model's params in their dtype."""
    config = NANOGPT.GPTConfig(block_size=dims["T"], vocab_size=dims["V"], n_layer=dims["L"], n_head=dims["H"],
                               n_embd=dims["H"] * dims["Dh"], dropout=0.0, bias=True)
    model = NANOGPT.GPT(config).to(next(iter(state.values())).dtype)
    load_shapescript_weights(model, state)
    return model


def shapescript_side(dims: dict[str, int], device: str, mixed: bool, compiled: bool) -> tuple[Step, dict]:
    source = ("precision mixed bf16\n\n" if mixed else "") + F32_SOURCE
    devices = "cpu" if device == "cpu" else f"cuda[{torch.device(device).index or 0}]"
    prog = ss.load(source, devices=devices, dims=dims, name="gpt.ss", compiled=compiled)
    m = prog.Gpt.init(seed=0)
    opt = ss.adamw(m, lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, no_decay=lambda name, p: p.ndim < 2)
    state = {k: v.detach().cpu().clone() for k, v in m.state_dict().items()}

    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor | float:
        return prog.train_step(m, opt, batch, ss.Eval)
    return step, state


def nanogpt_side(dims: dict[str, int], device: str, state: dict[str, torch.Tensor], defaults: bool) -> Step:
    """nanoGPT's model.py from ShapeScript's initial weights: eager in f32, or with the defaults of
    nanoGPT's train.py (`defaults`)."""
    model = nanogpt_model(dims, state).to(device)
    kind = torch.device(device).type
    # nanoGPT's two param groups; configure_optimizers fuses AdamW where device_type is cuda, and
    # device_type cpu is how it says not to
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=6e-4, betas=(0.9, 0.95),
                                     device_type=kind if defaults else "cpu")
    run = torch.compile(model) if defaults else model
    bf16 = defaults and (kind == "cpu" or torch.cuda.is_bf16_supported())

    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.autocast(kind, dtype=torch.bfloat16, enabled=bf16):  # train.py's ctx: the forward only
            _, loss = run(batch["tokens"], batch["targets"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # train.py's grad_clip
        opt.step()
        opt.zero_grad(set_to_none=True)  # as train.py: the gradients freed as soon as they are used
        return loss.detach()  # the loss alone, not its graph
    return step


def batches(dims: dict[str, int], size: int, count: int, device: str) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(count):
        tokens = torch.randint(0, dims["V"], (size, dims["T"] + 1), generator=g)
        out.append({"tokens": tokens[:, :-1].contiguous().to(device), "targets": tokens[:, 1:].contiguous().to(device)})
    return out


def timed(step: Step, data: list[dict[str, torch.Tensor]], device: str) -> list[float]:
    times = []
    for batch in data:
        t0 = time.perf_counter()
        step(batch)
        if device != "cpu":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="cuda:0 where there is one, else cpu")
    ap.add_argument("--quick", action="store_true", help="a tiny GPT: checks the script, not a figure")
    ap.add_argument("--batch", type=int, default=None, help="sequences a step (64; 4 with --quick)")
    args = ap.parse_args(argv)
    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    dims = TINY if args.quick else BABY
    size = args.batch or (4 if args.quick else 64)
    rounds, block, warmup = (2, 2, 2) if args.quick else (6, 10, 5)
    name = torch.cuda.get_device_name(device) if device != "cpu" else cpu_model()
    print(f"GPT step on {device} ({name}), torch {torch.__version__}: L={dims['L']} H={dims['H']} "
          f"D={dims['H'] * dims['Dh']} T={dims['T']} V={dims['V']}, batch {size}; {rounds} rounds of {block} steps")
    # building nanoGPT's sides prints nanoGPT's own lines: its parameter count, its AdamW's groups, fused or not
    ss_f32, state = shapescript_side(dims, device, mixed=False, compiled=False)
    sides: dict[str, Step] = {
        "nanoGPT eager f32": nanogpt_side(dims, device, state, defaults=False),
        "nanoGPT defaults": nanogpt_side(dims, device, state, defaults=True),
        "ShapeScript f32": ss_f32,
        "ShapeScript mixed bf16": shapescript_side(dims, device, mixed=True, compiled=False)[0],
        "ShapeScript mixed bf16 compiled": shapescript_side(dims, device, mixed=True, compiled=True)[0],
    }
    data = batches(dims, size, block, device)
    peaks: dict[str, float] = {}
    for label, step in sides.items():
        before = _allocated(device, reset=True)
        print(f"  first loss, {label}: {float(step(data[0])):.5f}", flush=True)
        for _ in range(warmup):
            step(data[0])
        peaks[label] = _peak(device) - before
    times: dict[str, list[float]] = {label: [] for label in sides}
    for r in range(rounds):
        for label in (list(sides) if r % 2 == 0 else list(reversed(sides))):
            times[label] += timed(sides[label], data, device)
    medians = {label: statistics.median(t) for label, t in times.items()}
    print(f"  {'side':<34} {'step':>10} {'/ defaults':>11} {'/ eager f32':>12} {'peak MiB':>9}")
    for label, t in medians.items():
        peak = f"{peaks[label] / 2**20:>9.1f}" if device != "cpu" else f"{'-':>9}"
        print(f"  {label:<34} {t * 1e3:>7.2f} ms {t / medians['nanoGPT defaults']:>11.3f} "
              f"{t / medians['nanoGPT eager f32']:>12.3f} {peak}")
    if device != "cpu":
        print("  peak MiB: the most the GPU held during a side's first steps, above what it held before them "
              "(its optimizer state, gradients and activations; its params, made before, are not counted)")


def _allocated(device: str, reset: bool = False) -> int:
    """Bytes the caching allocator has handed out on a GPU (0 on the CPU); `reset` starts its peak anew."""
    if device == "cpu":
        return 0
    torch.cuda.synchronize(device)
    if reset:
        torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _peak(device: str) -> int:
    if device == "cpu":
        return 0
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)


if __name__ == "__main__":
    main()
