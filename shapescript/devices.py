"""Which devices a program runs on: `DeviceSet`, and how a batch splits over them.

A leaf module (the standard library only), so that every stage can name devices: the checker
records a program's `devices` line as a DeviceSet, and the worker pool starts one process per
device of one, without either importing the other. Text such as `cuda[0 1 2]` is read by the
language's own grammar (pipeline.parse_devices).
"""

from __future__ import annotations

from dataclasses import dataclass

# The most workers a program may run on, hosts × devices on each: over a million, more than any
# cluster holds, and small enough that everything counted per device (the batch's shares, a
# worker's label) stays small. A devices line beyond it is an error (E1806), never a hang.
MAX_DEVICES = 1 << 20
# torch numbers a machine's CUDA devices with a signed byte (c10::DeviceIndex): `cuda:128` is read
# as `cuda:-128`, and a longer number is refused with a traceback. A device number beyond it is E1806.
MAX_CUDA_INDEX = 127
# The shares of a batch are written one by one up to this many devices ("22/21/21"), and as two
# groups beyond ("16 on each of 40 devices, 15 on each of 24").
SHARES_LISTED = 16


@dataclass(frozen=True)
class DeviceSet:
    kind: str = "cpu"  # cpu | cuda
    indices: tuple[int, ...] | None = None  # None: one device, `cpu` / `cuda`
    shard_params: bool = False
    split: str | None = None
    hosts: int = 1  # `2 x cuda[0 1]`: the same devices on each of 2 hosts
    auto: bool = False  # `layout auto`: the compiler chose `shard_params` and `split` (plan/choose.py)
    memory: int | None = None  # `memory 40 GiB`: the bytes each device may hold

    @property
    def layout_text(self) -> str:
        """The layout in the options' words: "data parallel", "shard params", "split H + shard params"."""
        parts = ([f"split {self.split}"] if self.split else []) + (["shard params"] if self.shard_params else [])
        return " + ".join(parts) or "data parallel"

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

    def impossible(self) -> Impossible | None:
        """Why no machine or cluster could run these devices (E1806), or None if one could."""
        if self.kind == "cuda" and self.indices and max(self.indices) > MAX_CUDA_INDEX:
            return Impossible(f"CUDA device {max(self.indices)}: torch numbers a machine's CUDA devices "
                              f"from 0 to {MAX_CUDA_INDEX}",
                              "number the CUDA devices as `nvidia-smi` lists them, from 0")
        if self.count > MAX_DEVICES:
            return Impossible(f"{self.count:,} devices, but a program runs on at most {MAX_DEVICES:,}",
                              "write the hosts and the devices on each that your machines have, "
                              "as `devices 2 x cuda[0 1 2 3]`")
        return None

    def same_workers(self, other: DeviceSet) -> bool:
        """The same devices, whatever the layout options: the same worker runs where it did."""
        return (self.kind, self.indices, self.hosts) == (other.kind, other.indices, other.hosts)

    def __str__(self) -> str:
        one_host = self.kind if self.indices is None else f"{self.kind}[{' '.join(map(str, self.indices))}]"
        return f"{self.hosts} x {one_host}" if self.hosts > 1 else one_host


@dataclass(frozen=True)
class Impossible:
    """Devices no machine or cluster has: what is wrong, and what to write instead."""

    reason: str
    help: str


def shares(n: int, devices: int) -> list[int]:
    """How a batch of n examples splits over the devices: as evenly as can be, the first taking one
    more (64 over 3 is 22, 21, 21). The workers cut batches so, and the DeviceTable counts so."""
    return [n // devices + (1 if k < n % devices else 0) for k in range(devices)]


def shares_text(n: int, devices: int) -> str:
    """The shares of a batch of n in words, as short for a million devices as for three: "22/21/21";
    beyond SHARES_LISTED devices, "16 on each of 40 devices, 15 on each of 24"."""
    if devices <= SHARES_LISTED:
        return "/".join(map(str, shares(n, devices)))
    whole, rest = divmod(n, devices)
    if rest == 0:
        return f"{whole:,} on each of {devices:,} devices"
    return f"{whole + 1:,} on each of {rest:,} devices, {whole:,} on each of {devices - rest:,}"
