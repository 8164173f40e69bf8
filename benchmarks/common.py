"""What the benchmark scripts share."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import torch


def cpu_model() -> str:
    """The CPU's model name, for the machine line every benchmark prints."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class HostDigits:
    """Digits held in host memory, a batch at a time through `__getitems__` (PyTorch's protocol for
    loading many items at once, which the loader checks as one batch): a dataset that workers load on
    the CPU and copy to their GPUs, where a TensorDataset would be kept on the GPUs. In this module,
    not a script's, so that the workers can import it and the dataset is sent to them."""

    def __init__(self, img: Any, label: Any) -> None:
        self.img, self.label = img, label

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"img": self.img[i], "label": self.label[i]}

    def __getitems__(self, indices: list[int]) -> dict[str, Any]:
        rows = torch.as_tensor(indices, dtype=torch.long)
        return {"img": self.img[rows], "label": self.label[rows]}
