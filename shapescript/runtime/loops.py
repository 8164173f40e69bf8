"""Loops over datasets at run time: shuffled views, the order and bounds of a loop's batches, the
batches themselves, and the hooks a loop runs through (`progress`, `call_scope`; the notebook sets
them: shapescript/notebook/progress.py).

Apart from runtime/data.py, which says what a batch is and checks what comes from a dataset: this
module only walks a dataset in order and hands each batch's items to data.py's `load_items`. A
standalone build inlines both into one namespace (lower/specs.py), so the names each takes from the
other are imported by name, never read as `data.X`.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from shapescript.errors import DomainError
from shapescript.runtime.data import Batch, DataSpec, TensorDataset, int_arg, load_items, trusted_batch
from shapescript.runtime.steps import current


def _length(ds: Any, op: str) -> int:
    try:
        return len(ds)
    except TypeError:
        raise TypeError(f"{op}: expected a map-style dataset (with __len__ and __getitem__), "
                        f"got {type(ds).__name__}") from None
    except (OverflowError, ValueError) as e:  # Python's own limits on what __len__ returns
        raise DomainError(f"{op}: the {type(ds).__name__}'s __len__ returned a length Python can't use "
                          f"({e}); a dataset has from 0 to {sys.maxsize} items") from None


class _Shuffled:
    """A permuted view of a map-style dataset: view[i] is base[perm[i]], perm drawn from `seed`."""

    def __init__(self, base: Any, seed: int) -> None:
        self.base, self.seed = base, seed
        self.length = _length(base, "shuffle")

    @functools.cached_property
    def perm(self) -> torch.Tensor:
        """Drawn when an item is first read: a loop over batches draws its own order from the seeds."""
        return shuffle_order(self.length, (self.seed,))

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        return self.base[int(self.perm[i])]

    def __getitems__(self, indices: Sequence[int]) -> Any:
        real = self.perm[torch.as_tensor(indices, dtype=torch.long)].tolist()
        getitems = getattr(self.base, "__getitems__", None)
        return getitems(real) if getitems is not None else [self.base[i] for i in real]


def shuffle_order(length: int, seeds: Sequence[int]) -> torch.Tensor:
    """The order of `length` items after shuffling with each seed in turn, outermost first: what
    torch.randperm draws from a generator seeded with each. The same in every process, so workers
    make a loop's order from its seeds rather than receive it."""
    order: torch.Tensor | None = None
    for seed in seeds:
        generator = torch.Generator().manual_seed(seed)
        try:
            perm = torch.randperm(length, generator=generator)
        except RuntimeError as e:  # torch's "Storage size calculation overflowed", or no memory for it
            raise DomainError(f"shuffle: a dataset of {length} items is too big to shuffle here: its order "
                              f"takes {8 * length:,} bytes, and torch can't make it ({e})") from None
        order = perm if order is None else perm[order]
    return order if order is not None else torch.arange(length)


def shuffle(ds: Any, seed: int) -> _Shuffled:
    """`ds` in the order torch.randperm draws from a generator seeded with `seed`."""
    seed = int_arg(seed, "shuffle", "seed")
    if not -2**63 <= seed < 2**64:  # what a torch.Generator takes
        shown = seed if seed.bit_length() <= 128 else f"a number of {seed.bit_length()} bits"
        raise DomainError(f"shuffle: the seed must be from -2**63 to 2**64 - 1, got {shown}")
    return _Shuffled(ds, seed)


def batch_bounds(total: int, n: int, k: int) -> tuple[int, int]:
    """Where the k-th batch of `n` starts and ends in a loop's order of `total` items."""
    return k * n, min(total, (k + 1) * n)


# What loops over batches run through when set: `progress(batches, count, data_type_name)` gives
# the same batches, e.g. behind a progress bar (the notebook sets it: shapescript/notebook/progress.py).
# None by default, so that scripts, the command line and the tests loop as they are.
progress: Callable[[Iterator[Any], int, str], Iterator[Any]] | None = None

# What each call from Python into a program (api.Function) runs inside, when set: the notebook's
# progress bars keep one bar per loop for the whole call, and close them when it ends.
call_scope: AbstractContextManager[Any] | None = None


def with_progress(batches: Iterator[Any], count: int, what: str) -> Iterator[Any]:
    """`batches` through the `progress` hook, if one is set, and in a background run, a step a batch
    (runtime/steps.py)."""
    hook = progress
    shown = batches if hook is None else hook(batches, count, what)
    run = current()
    return shown if run is None else run.steps_of(shown, count, what)


class _Batches:
    """The batches of a dataset, re-iterable; the last one may be smaller. `seeds` are the
    shuffles' seeds, outermost first (none: the dataset's own order)."""

    def __init__(self, base: Any, seeds: tuple[int, ...], n: int, spec: DataSpec,
                 device: torch.device | str | None = None) -> None:
        self.base, self.seeds, self.n, self.spec = base, seeds, n, spec
        self.device = device if device is not None and torch.device(device).type != "cpu" else None
        self.total = _length(base, "batches")

    def __len__(self) -> int:
        return -(-self.total // self.n)

    @functools.cached_property
    def order(self) -> Sequence[int]:
        """The loop's order of the underlying dataset's items (drawn once, when first asked for)."""
        return shuffle_order(self.total, self.seeds).tolist() if self.seeds else range(self.total)

    def size_of(self, k: int) -> int:
        start, end = batch_bounds(self.total, self.n, k)
        return end - start

    def items_of(self, k: int) -> list[int]:
        """Batch k's items, as indices into the underlying dataset."""
        start, end = batch_bounds(self.total, self.n, k)
        return list(self.order[start:end])

    def indices(self) -> Iterator[list[int]]:
        """Each batch's items, as indices into the underlying dataset."""
        for k in range(len(self)):
            yield self.items_of(k)

    def __iter__(self) -> Iterator[Batch]:
        return with_progress(self.load(), len(self), self.spec.name)

    @functools.cached_property
    def order_tensor(self) -> torch.Tensor:
        """`order` as a tensor of indices, which a TensorDataset's batches are sliced from (no list of
        ints made into a tensor at every step). On the dataset's device when its fields share one: a
        dataset kept on a GPU gets its order there once a pass, not its indices uploaded each step
        (the upload of a pageable tensor waits for the device)."""
        order = shuffle_order(self.total, self.seeds) if self.seeds else torch.arange(self.total)
        home = self.base.home if isinstance(self.base, TensorDataset) else None
        return order if home is None else order.to(home)  # to the CPU: the order itself

    def load(self) -> Iterator[Batch]:
        """The batches, loaded and checked one by one (what iterating yields, without `progress`)."""
        sliced = isinstance(self.base, TensorDataset)
        trusted = sliced and self.base.fits_as_given(self.spec)  # checked whole once: not each batch again
        for k in range(len(self)):
            start, end = batch_bounds(self.total, self.n, k)
            indices = self.order_tensor[start:end] if sliced else self.items_of(k)
            lengths: dict[str, torch.Tensor] = {}
            if trusted:
                fields = self.base.__getitems__(indices)
            else:
                fields, lengths = load_items(self.base, indices, self.spec)
            if self.device is not None:  # loaded and checked on the CPU, then sent to the device
                fields = {k: v.to(self.device, non_blocking=True) for k, v in fields.items()}
                lengths = {k: v.to(self.device, non_blocking=True) for k, v in lengths.items()}
            yield trusted_batch(self.spec, fields, lengths)


def batches(ds: Any, n: int, spec: DataSpec, device: torch.device | str | None = None) -> _Batches:
    """Checked batches of `n` items of `ds` (the last may be smaller, none is empty)."""
    n = int_arg(n, "batches", "the batch size")
    if n <= 0:
        raise DomainError(f"batches: the batch size must be positive, got {n}")
    # Unwrap shuffled views so items are fetched from the base and errors name its indices.
    seeds: list[int] = []
    while isinstance(ds, _Shuffled):
        seeds.append(ds.seed)
        ds = ds.base
    return _Batches(ds, tuple(seeds), n, spec, device)
