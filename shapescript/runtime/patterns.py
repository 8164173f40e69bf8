"""Patterns at run time: the checker's recipes applied with reshape, permute, expand and reductions.

A recipe holds only what the shapes can't say until the program runs: which sizes to read off the
operand. Everything else (the permutation, which axes merge) was fixed when the program compiled.

The generated code prints each recipe as torch method calls (ops/shaping.py) and calls these
functions only for a recipe that reads a size off the shape of an operand that isn't a name; they
are also what the tests compare the printed lines with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Split = tuple[tuple[Any, ...] | None, ...] | None


def _split(x: torch.Tensor, split: Split) -> torch.Tensor:
    if split is None:
        return x
    shape: list[int] = []
    for k, parts in enumerate(split):
        if parts is None:
            shape.append(x.shape[k])
        else:
            shape.extend(x.shape[p[1]] if isinstance(p, tuple) else p for p in parts)
    return x.reshape(shape)


def _merge(x: torch.Tensor, merge: tuple[int, ...] | None) -> torch.Tensor:
    if merge is None:
        return x
    shape, k = [], 0
    for count in merge:
        n = 1
        for j in range(k, k + count):
            n *= x.shape[j]
        shape.append(n)
        k += count
    return x.reshape(shape)


def _arrange(x: torch.Tensor, perm: tuple[int, ...] | None, drop: tuple[int, ...]) -> torch.Tensor:
    """Squeeze the atoms `drop` names (a pattern's literal 1s, which `perm` leaves out), then permute:
    the atoms left count from 0 again."""
    if drop:
        x = x.squeeze(drop)
    if perm is not None:
        x = x.permute([sorted(perm).index(k) for k in perm])
    return x


def rearrange(x: torch.Tensor, split: Split, perm: tuple[int, ...] | None,
              merge: tuple[int, ...] | None, drop: tuple[int, ...] = ()) -> torch.Tensor:
    return _merge(_arrange(_split(x, split), perm, drop), merge)


def split_parts(x: torch.Tensor, split: Split, perm: tuple[int, ...],
                merge: tuple[int, ...] | None, drop: tuple[int, ...] = ()) -> tuple[torch.Tensor, ...]:
    """`q, k, v = split(...)`: the literal-sized atom goes first, then each part is rearranged."""
    x = _arrange(_split(x, split), perm, drop)
    return tuple(_merge(part, merge) for part in x.unbind(0))


_REDUCE: dict[str, Callable[..., torch.Tensor]] = {
    "sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin,
    "prod": lambda x, dim: _prod(x, dim),
}


def _prod(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    for d in sorted(dims, reverse=True):  # torch.prod takes one dim at a time
        x = torch.prod(x, dim=d)
    return x


def reduce(x: torch.Tensor, split: Split, dims: tuple[int, ...], op: str, perm: tuple[int, ...] | None,
           merge: tuple[int, ...] | None) -> torch.Tensor:
    x = _split(x, split)
    if dims:
        x = _REDUCE[op](x, dims)
    if perm is not None:
        x = x.permute(perm)
    return _merge(x, merge)


def repeat(x: torch.Tensor, split: Split, perm: tuple[int, ...] | None, view: tuple[Any, ...],
           sizes: tuple[Any, ...], merge: tuple[int, ...] | None) -> torch.Tensor:
    """Arrange the kept atoms, add the new ones as axes of size 1 (`view`), expand them to `sizes`."""
    x = _split(x, split)
    if perm is not None:
        x = x.permute(perm)
    kept = iter(x.shape)
    x = x.reshape([next(kept) if v is None else 1 for v in view])
    x = x.expand([-1 if s is None else s for s in sizes])
    return _merge(x, merge)
