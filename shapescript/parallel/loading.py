"""Batches on several devices: the workers load them.

A loop over a dataset in the controller doesn't load its batches. The dataset is sent to every
worker once (again only if its length changes), and each call sends each worker the indices of its
part of the batch; the worker loads and checks those items itself (a TensorDataset is kept on the
worker's device, checked whole when it arrives, and gathered there). A dataset the workers can't
receive, as one defined in the controller's main script, which they never import, is loaded in the
controller with a warning, and its batches travel through the pipes.
"""

from __future__ import annotations

import itertools
import pickle
import warnings
from typing import Any, Iterator

import torch

from shapescript.runtime.data import Batch, DataSpec, load_items

_handles = itertools.count(1_000_000)  # apart from the models' handles


class RemoteBatch:
    """A batch that the workers load, each its own part. Reading a field in the controller loads
    the batch there (once)."""

    is_remote = True

    def __init__(self, dataset: int, base: Any, indices: list[int], spec: DataSpec) -> None:
        self.dataset, self.base, self.indices, self.spec = dataset, base, indices, spec
        self.size = len(indices)
        self._loaded: Batch | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in {f.name for f in self.spec.fields} | {"lengths"}:
            raise AttributeError(f"a batch of {self.spec.name} has no field `{name}`")
        if self._loaded is None:
            self._loaded = Batch(self.spec, *load_items(self.base, self.indices, self.spec))
        return getattr(self._loaded, name)

    def parts(self, sizes: list[int]) -> list[tuple]:
        """What each worker is sent: its slice of the indices."""
        out, start = [], 0
        for n in sizes:
            out.append(("batchref", self.dataset, self.indices[start:start + n], self.spec.name))
            start += n
        return out

    def __repr__(self) -> str:
        return f"RemoteBatch[{self.size}] {self.spec.name} (loaded by the workers)"


class Datasets:
    """The datasets a program's workers hold, by the dataset object's identity."""

    def __init__(self) -> None:
        self.sent: dict[int, tuple[Any, int, int]] = {}  # id -> (dataset, handle, length)
        self.refused: set[int] = set()

    def handle(self, pool: Any, base: Any, spec: DataSpec) -> int | None:
        """The workers' handle of `base`, sending it first if need be; None if it can't be sent."""
        key = id(base)
        known = self.sent.get(key)
        if known is not None and known[0] is base and known[2] == len(base):
            return known[1]
        if key in self.refused:
            return None
        reason = _why_not_sendable(base)
        if reason:
            self.refused.add(key)
            warnings.warn(f"the dataset {type(base).__name__} can't be sent to the workers ({reason}); the "
                          f"controller loads its batches and sends each worker its part, which costs a copy "
                          f"of every batch through the pipes", stacklevel=5)
            return None
        handle = next(_handles)
        pool.call("keep_dataset", (handle, base, spec.name), where=f"sending the dataset {type(base).__name__}")
        self.sent[key] = (base, handle, len(base))
        return handle


def _why_not_sendable(base: Any) -> str:
    if type(base).__module__ == "__main__":
        return "it is defined in the main script, which the workers never import"
    try:
        pickle.dumps(base)
    except Exception as e:  # noqa: BLE001 (whatever pickle refuses, the answer is the same)
        return f"it can't be pickled: {e}"
    return ""


class RemoteBatches:
    """`data |> batches(n)` in the controller of a program on several devices."""

    def __init__(self, program: Any, batches: Any) -> None:
        self.program, self.batches = program, batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        pool = self.program.workers()
        handle = self.program.datasets.handle(pool, self.batches.base, self.batches.spec)
        if handle is None:
            yield from self.batches
            return
        for indices in self.batches.indices():
            yield RemoteBatch(handle, self.batches.base, indices, self.batches.spec)


def keep(state: Any, base: Any, spec: DataSpec) -> Any:
    """On a worker: a TensorDataset moves to the device, checked whole once; others stay as sent."""
    from shapescript.runtime.data import TensorDataset, check_batch
    if isinstance(base, TensorDataset):
        fields = check_batch(spec, base.fields, range(len(base)))
        base = TensorDataset(**{k: v.to(state.device) for k, v in fields.items()})
        base.checked = True  # type: ignore[attr-defined]
    return base


def load_part(state: Any, base: Any, indices: list[int], spec: DataSpec) -> Batch:
    if getattr(base, "checked", False):  # kept on the device, checked whole: a gather, nothing more
        return Batch(spec, base.__getitems__(indices))
    fields, lengths = load_items(base, indices, spec)
    move = {k: v.to(state.device) for k, v in fields.items()}
    return Batch(spec, move, {k: v.to(state.device) for k, v in lengths.items()})


def needs_agreement(base: Any) -> bool:
    """Whether loading a part can fail, so the workers must agree that each has its part first."""
    return not getattr(base, "checked", False)


def agree(state: Any, failed: bool) -> bool:
    """Every worker says whether it loaded its part; True when all did."""
    import torch.distributed as dist
    flag = torch.tensor([1.0 if failed else 0.0], device=state.device)
    with state.waiting_at("loading the batch"):
        dist.all_reduce(flag)
    return flag.item() == 0
