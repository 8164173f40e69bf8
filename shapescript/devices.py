"""Which devices a program runs on: `DeviceSet`, and its spelling as text (`cpu`, `cuda[0 1 2]`).

A leaf module (the standard library only), so that every stage can name devices: the checker
records a program's `devices` line as a DeviceSet, and the worker pool starts one process per
device of one, without either importing the other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceSet:
    kind: str = "cpu"  # cpu | cuda
    indices: tuple[int, ...] | None = None  # None: one device, `cpu` / `cuda`
    shard_params: bool = False
    split: str | None = None

    @property
    def count(self) -> int:
        return len(self.indices) if self.indices else 1

    def same_workers(self, other: "DeviceSet") -> bool:
        """The same devices, whatever the layout options: the same worker runs where it did."""
        return (self.kind, self.indices) == (other.kind, other.indices)

    def __str__(self) -> str:
        if self.indices is None:
            return self.kind
        return f"{self.kind}[{' '.join(map(str, self.indices))}]"


_DEVICES = re.compile(r"^\s*(cpu|cuda)\s*(?:\[\s*((?:\d+\s*)*)\])?\s*$")


def parse_devices(text: str | DeviceSet) -> DeviceSet:
    """`"cpu"`, `"cuda[0 1 2]"` (the program's own spelling) as a DeviceSet. TypeError or
    ValueError, saying how to write it, for anything else."""
    if isinstance(text, DeviceSet):
        return text
    if not isinstance(text, str):
        raise TypeError(f"devices is a str, as 'cpu', 'cpu[0 1]' or 'cuda[0 1 2]', not {type(text).__name__}")
    m = _DEVICES.match(text)
    if not m:
        raise ValueError(f"devices must be written as in a program, e.g. 'cpu', 'cpu[0 1]' or 'cuda[0 1 2]', "
                         f"not {text!r}")
    indices = tuple(int(i) for i in m.group(2).split()) if m.group(2) is not None else None
    if indices is not None and (not indices or len(set(indices)) != len(indices)):
        raise ValueError(f"devices {text!r}: list each device once, and at least one")
    return DeviceSet(m.group(1), indices)


def shares(n: int, devices: int) -> list[int]:
    """How a batch of n examples splits over the devices: as evenly as can be, the first taking one
    more (64 over 3 is 22, 21, 21). The workers cut batches so, and the DeviceTable counts so."""
    return [n // devices + (1 if k < n % devices else 0) for k in range(devices)]
