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
    hosts: int = 1  # `2 x cuda[0 1]`: the same devices on each of 2 hosts

    @property
    def per_host(self) -> int:
        """How many devices each host runs workers on."""
        return len(self.indices) if self.indices else 1

    @property
    def count(self) -> int:
        """How many workers in all: hosts × devices per host."""
        return self.hosts * self.per_host

    @property
    def several_hosts(self) -> bool:
        return self.hosts > 1

    def place(self, rank: int) -> tuple[int, int]:
        """(host, device number) of worker `rank`: ranks go host by host, as torch.distributed and
        Ray Train number them, so `2 x cuda[0 1]`'s ranks 0 1 2 3 are (0, 0) (0, 1) (1, 0) (1, 1)."""
        if not 0 <= rank < self.count:
            raise IndexError(f"no worker {rank} on {self}: its ranks are 0 to {self.count - 1}")
        host, local = divmod(rank, self.per_host)
        return host, (self.indices or (0,))[local]

    def same_workers(self, other: "DeviceSet") -> bool:
        """The same devices, whatever the layout options: the same worker runs where it did."""
        return (self.kind, self.indices, self.hosts) == (other.kind, other.indices, other.hosts)

    def __str__(self) -> str:
        one_host = self.kind if self.indices is None else f"{self.kind}[{' '.join(map(str, self.indices))}]"
        return f"{self.hosts} x {one_host}" if self.hosts > 1 else one_host


def shares(n: int, devices: int) -> list[int]:
    """How a batch of n examples splits over the devices: as evenly as can be, the first taking one
    more (64 over 3 is 22, 21, 21). The workers cut batches so, and the DeviceTable counts so."""
    return [n // devices + (1 if k < n % devices else 0) for k in range(devices)]
