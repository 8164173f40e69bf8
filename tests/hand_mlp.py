"""The README's MLP written by hand in PyTorch, the reference its compiled program is held to
(tests/examples/test_readme_mlp.py, tests/several/test_products_several.py), and learnable batches for it."""

from __future__ import annotations

import torch


class HandMlp(torch.nn.Module):
    """The reference: the same init (one generator, params in declaration order), forward and loss."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w1 = torch.nn.Parameter(torch.empty(784, 256).normal_(0.0, 0.02, generator=g))
        self.w2 = torch.nn.Parameter(torch.empty(256, 10).normal_(0.0, 0.02, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.w1) @ self.w2


def batches(n_steps: int, size: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Learnable data: the labels come from a fixed linear teacher, so a few steps lower the loss."""
    g = torch.Generator().manual_seed(123)
    teacher = torch.randn(784, 10, generator=g)
    out = []
    for _ in range(n_steps):
        x = torch.randn(size, 784, generator=g)
        out.append((x, (x @ teacher).argmax(dim=1)))
    return out
