"""Train the GPT-style character model of gpt.ss on corpus.txt, with small dims, and compare its
loss with the unigram entropy of the text (what a model that ignores context can reach).

    python examples/attention/train.py [--steps 300]
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from collections import Counter
from pathlib import Path

import torch

import shapescript as ss

HERE = Path(__file__).resolve().parent
SMALL = {"D": 64, "H": 4, "Dh": 16, "F": 256, "L": 2}  # the chapter's full size: D 768, H 12, Dh 64
T = 64  # the program's context length
BATCH = 32  # the program's batches(32)


def windows(ids: torch.Tensor, stride: int) -> ss.TensorDataset:
    """Every window of T + 1 characters, `stride` apart: tokens and their successors."""
    starts = torch.arange(0, len(ids) - T - 1, stride)
    rows = torch.stack([ids[s:s + T + 1] for s in starts.tolist()])
    return ss.TensorDataset(tokens=rows[:, :-1].contiguous(), targets=rows[:, 1:].contiguous())


def unigram_entropy(text: str) -> float:
    counts = Counter(text)
    n = len(text)
    return -sum(c / n * math.log(c / n) for c in counts.values())


def main(steps: int = 300, quiet: bool = False) -> dict[str, float]:
    torch.manual_seed(0)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    text = (HERE / "corpus.txt").read_text()
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(ch) for ch in text])
    cut = int(len(ids) * 0.9)
    train_data, held_out = windows(ids[:cut], stride=8), windows(ids[cut:], stride=T)
    with warnings.catch_warnings():  # SMALL replaces gpt.ss's sizes on purpose: a model that trains in seconds
        warnings.filterwarnings("ignore", message=".*sizes given when loading replace", category=UserWarning)
        prog = ss.load(HERE / "gpt.ss", dims={"V": len(vocab), **SMALL})
    m = prog.Gpt.init(seed=0)
    opt = ss.adamw(m, lr=3e-3, weight_decay=0.01)
    mode = ss.Train(seed=0)
    log = ss.sinks.memory()
    start = time.perf_counter()
    first = float(prog.evaluate(m, held_out))
    while len(log.records) < steps:  # whole epochs, then the part of one that the steps left need
        remaining = (steps - len(log.records)) * BATCH
        part = train_data if remaining >= len(train_data) else ss.TensorDataset(
            **{k: v[:remaining] for k, v in train_data.fields.items()})
        prog.train(m, opt, part, mode, log)
    losses = [r["loss"] for r in log.records[:steps]]
    end = float(prog.evaluate(m, held_out))
    baseline = unigram_entropy(text)
    seconds = time.perf_counter() - start
    if not quiet:
        print(f"{len(vocab)} characters, {len(train_data)} training windows of {T}")
        print(f"held-out loss at start: {first:.3f} nats")
        print(f"training loss: step 1 {losses[0]:.3f}, step {steps} {sum(losses[-20:]) / 20:.3f} (mean of last 20)")
        print(f"held-out loss at end:   {end:.3f} nats; unigram entropy of the text: {baseline:.3f} nats")
        print(f"{steps} steps in {seconds:.1f} s")
    return {"start": first, "end": end, "unigram": baseline, "first_step": losses[0], "steps": len(losses),
            "last": losses[-1]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    main(parser.parse_args().steps)
