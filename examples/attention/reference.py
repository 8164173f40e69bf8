"""gpt.ss written by hand in PyTorch: the reference the tests and benchmarks compare against.

Its params are drawn as `Gpt.init(seed)` draws them: one generator, declaration order, depth-first
(ones and zeros draw nothing), so both start from the same model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class HandGpt(torch.nn.Module):
    def __init__(self, V: int, T: int, D: int, H: int, Dh: int, F_: int, L: int, seed: int) -> None:
        super().__init__()
        self.H, self.Dh = H, Dh
        g = torch.Generator().manual_seed(seed)

        def normal(*shape: int, std: float) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.empty(*shape).normal_(0.0, std, generator=g))

        def ones(n: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.ones(n))

        def zeros(n: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.zeros(n))

        self.emb = normal(V, D, std=0.02)
        self.pos = normal(T, D, std=0.01)
        self.blocks = torch.nn.ModuleList()
        for _ in range(L):
            block = torch.nn.Module()
            block.g1, block.b1 = ones(D), zeros(D)
            block.w_qkv, block.w_o = normal(D, 3 * H * Dh, std=0.02), normal(H * Dh, D, std=0.02)
            block.g2, block.b2 = ones(D), zeros(D)
            block.w1, block.c1 = normal(D, F_, std=0.02), zeros(F_)
            block.w2, block.c2 = normal(F_, D, std=0.02), zeros(D)
            self.blocks.append(block)
        self.gf, self.bf = ones(D), zeros(D)
        self.head = normal(D, V, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, n = tokens.shape
        x = F.embedding(tokens, self.emb) + self.pos
        mask = torch.ones(n, n, dtype=torch.bool, device=tokens.device).triu(1)
        for blk in self.blocks:
            h = F.layer_norm(x, (x.shape[-1],)) * blk.g1 + blk.b1
            q, k, v = (h @ blk.w_qkv).view(b, n, 3, self.H, self.Dh).permute(2, 0, 3, 1, 4)
            s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.Dh))
            a = torch.softmax(s.masked_fill(mask, -1e9), dim=-1)
            o = (a @ v).permute(0, 2, 1, 3).reshape(b, n, self.H * self.Dh)
            x = x + o @ blk.w_o
            h = F.layer_norm(x, (x.shape[-1],)) * blk.g2 + blk.b2
            x = x + F.gelu(h @ blk.w1 + blk.c1) @ blk.w2 + blk.c2
        return (F.layer_norm(x, (x.shape[-1],)) * self.gf + self.bf) @ self.head

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.forward(tokens)
        return F.cross_entropy(logits.transpose(1, 2), targets)
