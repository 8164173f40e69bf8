"""nanoGPT's training script (Karpathy's train.py, MIT licence) written as functions in plain PyTorch,
for tests that compare a ShapeScript training run with it in f64 at tiny sizes: the learning-rate
schedule (linear warmup, cosine decay to min_lr), the iteration of gradient_accumulation_steps
micro-steps with the loss divided by their number, gradient clipping by global norm, the AdamW step,
estimate_loss, and the checkpoint that is saved and resumed from.

It follows train.py's algorithm step for step, without what does not change the numbers on a CPU
in f64: no DDP, no autocast or GradScaler (a no-op unless float16), no torch.compile, no files (the
checkpoint is kept in memory), no logging. The batches come from a function of (iter_num,
micro_step) rather than get_batch's random draws, so that both sides of a test see the same data;
train.py's eval/checkpoint branch at the top of each iteration is left to the caller, as
estimate_loss, checkpoint and resume.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn as nn


def get_lr(it: int, *, learning_rate: float, warmup_iters: int, lr_decay_iters: int, min_lr: float) -> float:
    """train.py's schedule: a linear warmup that is already nonzero at iteration 0, a cosine from
    learning_rate down to min_lr between warmup_iters and lr_decay_iters, then min_lr."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # 1 at the warmup's end, 0 at lr_decay_iters
    return min_lr + coeff * (learning_rate - min_lr)


@dataclass(frozen=True)
class TrainConfig:
    """train.py's optimizer and schedule settings (its global config variables of those names)."""

    learning_rate: float
    warmup_iters: int
    lr_decay_iters: int
    min_lr: float
    weight_decay: float
    beta1: float
    beta2: float
    grad_clip: float  # 0.0: no clipping
    gradient_accumulation_steps: int
    decay_lr: bool = True

    def lr(self, it: int) -> float:
        """The learning rate train.py sets for iteration `it`."""
        if not self.decay_lr:
            return self.learning_rate
        return get_lr(it, learning_rate=self.learning_rate, warmup_iters=self.warmup_iters,
                      lr_decay_iters=self.lr_decay_iters, min_lr=self.min_lr)


@dataclass
class Record:
    """One iteration: its number, the lr it ran with, and each micro-step's loss before train.py
    divides it by gradient_accumulation_steps (their mean is the iteration's loss)."""

    iter_num: int
    lr: float
    micro_losses: list[float]


class ConfiguresOptimizers(Protocol):
    """A model with nanoGPT's configure_optimizers (reference.GPT), less its device_type argument,
    which only picks the fused AdamW on CUDA."""

    def configure_optimizers(self, weight_decay: float, learning_rate: float,
                             betas: tuple[float, float]) -> torch.optim.AdamW: ...


def make_optimizer(model: ConfiguresOptimizers, config: TrainConfig) -> torch.optim.AdamW:
    """train.py's optimizer: the model's two AdamW groups (decay on the 2-D params only)."""
    return model.configure_optimizers(config.weight_decay, config.learning_rate, (config.beta1, config.beta2))


Batches = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


def train(model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig, batch_for: Batches,
          start_iter: int, iters: int) -> list[Record]:
    """Run train.py's iterations start_iter .. start_iter + iters - 1 (start_iter is a resumed run's
    iter_num, which the schedule depends on). `batch_for(iter_num, micro_step)` gives the (X, Y)
    of each micro-step. The gradients are summed over the micro-steps of loss / their number, so an
    iteration's gradient is that of the mean loss; clipping is on the global norm of all params."""
    model.train()
    records = []
    for iter_num in range(start_iter, start_iter + iters):
        lr = config.lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        micro_losses = []
        for micro_step in range(config.gradient_accumulation_steps):
            X, Y = batch_for(iter_num, micro_step)
            _, loss = model(X, Y)
            micro_losses.append(loss.item())
            (loss / config.gradient_accumulation_steps).backward()
        if config.grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        records.append(Record(iter_num, lr, micro_losses))
    return records


@torch.no_grad()
def estimate_loss(model: nn.Module, splits: dict[str, list[tuple[torch.Tensor, torch.Tensor]]]) -> dict[str, float]:
    """train.py's estimate_loss on given batches: each split's mean loss, in eval mode (no dropout),
    then back to train mode. The mean is taken in f64, where train.py's torch.zeros(eval_iters)
    would hold the losses in the default dtype (f32) and round an f64 model's losses."""
    model.eval()
    out = {}
    for split, batches in splits.items():
        losses = torch.zeros(len(batches), dtype=torch.float64)
        for k, (X, Y) in enumerate(batches):
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean().item()
    model.train()
    return out


def checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, iter_num: int,
               best_val_loss: float) -> dict[str, Any]:
    """What train.py saves to ckpt.pt, less model_args and config: deep copies, so that training
    on does not change it. iter_num is the iteration a resumed run starts with (train.py saves
    at the top of an iteration, before its step)."""
    return {
        "model": copy.deepcopy(model.state_dict()),
        "optimizer": copy.deepcopy(optimizer.state_dict()),
        "iter_num": iter_num,
        "best_val_loss": best_val_loss,
    }


def resume(model: nn.Module, optimizer: torch.optim.Optimizer, ckpt: dict[str, Any]) -> tuple[int, float]:
    """train.py's init_from='resume' into a freshly built model and its optimizer (made from that
    model by make_optimizer): load both states and return (iter_num, best_val_loss). The
    optimizer's state is copied, as load_state_dict would otherwise share the checkpoint's moment
    tensors and step them in place."""
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(copy.deepcopy(ckpt["optimizer"]))
    return ckpt["iter_num"], ckpt["best_val_loss"]
