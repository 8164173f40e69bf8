"""The digits demo (`make demo`): train digits.ss on scikit-learn's 8x8 digits, print held-out accuracy.

The program builds its own training data through `python fn digits(part)` (digits_data.py, next to
this script): 1,500 images to train on, 297 held out, split with a fixed seed. Everything is seeded,
so every run prints the same numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # digits.ss's `python fn` imports digits_data from this folder
    sys.path.insert(0, str(HERE))

import digits_data  # noqa: E402

import shapescript as ss  # noqa: E402

EPOCHS = 10
LR = 1e-2
SEED = 0


VARIANTS = {"mlp": ("digits.ss", "Mlp"), "bn": ("digits_bn.ss", "Net"), "cnn": ("digits_cnn.ss", "Cnn")}


def train(epochs: int = EPOCHS, lr: float = LR, seed: int = SEED, verbose: bool = True, variant: str = "mlp"
          ) -> tuple[list[float], float]:
    """Train from a fixed init; (mean training loss of each epoch, held-out accuracy).
    `variant` "bn" is digits_bn.ss: batch_norm and dropout, trained in Train(seed) mode; "cnn" is
    digits_cnn.ss, two convolutions and a pooling."""
    path, model = VARIANTS[variant]
    prog = ss.load(HERE / path)
    m = getattr(prog, model).init(seed=seed)
    opt = ss.adamw(m, lr=lr)
    modes = (ss.Train(seed=seed),) if variant == "bn" else ()
    log = ss.sinks.memory()  # one record per step; we print one line per epoch
    losses: list[float] = []
    for epoch in range(1, epochs + 1):
        start = len(log.records)
        prog.epoch(m, opt, *modes, log)  # = run(m, opt, digits("train"), log)
        epoch_losses = [r["loss"] for r in log.records[start:]]
        losses.append(sum(epoch_losses) / len(epoch_losses))
        if verbose:
            print(f"epoch {epoch:2d}  mean loss {losses[-1]:.4f}", flush=True)
    img, label = digits_data.tensors("test")
    predicted = prog.predict(m, img)
    accuracy = (predicted == label).double().mean().item()
    if verbose:
        correct = int((predicted == label).sum())
        print(f"held-out accuracy: {accuracy:.2%} ({correct}/{len(label)} digits)")
    return losses, accuracy


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Train a digits classifier written in ShapeScript.")
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="mlp",
                        help="mlp: the README's MLP; bn: with batch_norm and dropout; cnn: two convolutions")
    train(variant=parser.parse_args().variant)
