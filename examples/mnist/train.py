"""Train examples/mnist/net.ss (pytorch/examples' MNIST Net) as mnist/main.py does: Adadelta at lr
1.0, the lr times 0.7 after each epoch (StepLR), batches of 64, the held-out accuracy after each
epoch. No download here: the images are scikit-learn's 8x8 digits, scaled up to 28x28 (bilinear)
and normalized with MNIST's mean and std, 1,500 to train on and 297 held out.

    python examples/mnist/train.py [--epochs 2] [--limit 300] [--devices "cpu[0 1]"]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import shapescript as ss

HERE = Path(__file__).resolve().parent
HELD_OUT = 297


def load_reference():  # the example's constants live beside the Net it is compared with
    spec = importlib.util.spec_from_file_location("mnist_reference", HERE / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def digits(limit: int | None = None) -> tuple[ss.TensorDataset, dict[str, torch.Tensor]]:
    """(the training images as a dataset of `Image`, the held-out ones as a batch)."""
    from sklearn.datasets import load_digits  # imported here: it takes a second

    ref = load_reference()
    d = load_digits()
    pixels = torch.tensor(d.images, dtype=torch.float64).unsqueeze(1) / 16.0  # [n 1 8 8] in 0..1
    img = (F.interpolate(pixels, size=(28, 28), mode="bilinear", align_corners=False) - ref.MEAN) / ref.STD
    label = torch.tensor(d.target, dtype=torch.int64)
    order = torch.randperm(len(label), generator=torch.Generator().manual_seed(0))
    train, test = order[:-HELD_OUT], order[-HELD_OUT:]
    if limit is not None:
        train, test = train[:limit], test[:limit]
    return ss.TensorDataset(img=img[train], label=label[train]), {"img": img[test], "label": label[test]}


def main(argv: list[str] | None = None) -> list[float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=2, help="passes over the training images (default 2)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1.0, help="Adadelta's lr (default 1.0, as the example's)")
    p.add_argument("--gamma", type=float, default=0.7, help="the lr's factor after each epoch (default 0.7)")
    p.add_argument("--limit", type=int, default=None, help="train and test on at most this many images")
    p.add_argument("--devices", default="cpu", help='where it runs, as "cpu[0 1]" (default cpu)')
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or (args.limit is not None and args.limit < 1):
        p.error("--epochs, --batch-size and --limit take whole numbers of 1 or more")
    train_data, test_batch = digits(args.limit)
    prog = ss.load(HERE / "net.ss", devices=args.devices)
    try:
        m = prog.Net.init(seed=args.seed)
        per_epoch = math.ceil(len(train_data) / args.batch_size)
        opt = ss.adadelta(m, lr=ss.schedules.step(args.lr, every=per_epoch, factor=args.gamma))
        mode = ss.Train(seed=args.seed)
        accuracies = []
        for epoch in range(1, args.epochs + 1):
            order = torch.randperm(len(train_data), generator=torch.Generator().manual_seed(epoch))
            losses = []
            for start in range(0, len(order), args.batch_size):
                rows = order[start:start + args.batch_size]
                batch = {name: values[rows] for name, values in train_data.fields.items()}
                losses.append(float(prog.train_step(m, opt, batch, mode)))
            accuracies.append(float(prog.accuracy(m, test_batch)))
            print(f"epoch {epoch}: mean loss {sum(losses) / len(losses):.4f}, held-out accuracy "
                  f"{accuracies[-1]:.2%}, next lr {opt.lr:.3g}", flush=True)
        return accuracies
    finally:
        prog.stop()


if __name__ == "__main__":
    main()
