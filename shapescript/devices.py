"""Which devices a program runs on: `DeviceSet`, and how a batch splits over them.

A leaf module (the standard library only), so that every stage can name devices: the checker
records a program's `devices` line as a DeviceSet, and the worker pool starts one process per
device of one, without either importing the other. Text such as `cuda[0 1 2]` is read by the
language's own grammar (api.parse_devices).
"""

from __future__ import annotations

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


def shares(n: int, devices: int) -> list[int]:
    """How a batch of n examples splits over the devices: as evenly as can be, the first taking one
    more (64 over 3 is 22, 21, 21). The workers cut batches so, and the DeviceTable counts so."""
    return [n // devices + (1 if k < n % devices else 0) for k in range(devices)]
