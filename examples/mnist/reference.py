"""net.ss written by hand in PyTorch with the structure of pytorch/examples' MNIST `Net`
(mnist/main.py, BSD-3-Clause licence, the PyTorch contributors): nn.Conv2d conv1 and conv2,
nn.Linear fc1 and fc2, F.max_pool2d, two nn.Dropout, torch.flatten and F.log_softmax, trained with
Adadelta and F.nll_loss. Our own code, written for the tests.

nn.Linear keeps its weight as [out, in] and net.ss as [in out]: `load_shapescript` copies a net.ss
model's params in, transposing those; a convolution's weight is [out, in, kh, kw] in both.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)

    @torch.no_grad()
    def load_shapescript(self, state: dict[str, torch.Tensor]) -> None:
        """Copy in a net.ss model's params (its `state_dict()`), each to the param of the same layer."""
        own = dict(self.named_parameters())
        assert len(state) == len(own), (sorted(state), sorted(own))
        for name, value in state.items():
            target, transpose = torch_name(name)
            own[target].copy_(value.T if transpose else value)


def torch_name(name: str) -> tuple[str, bool]:
    """The torch param of a net.ss param, and whether it is transposed there: `fc1` is `fc1.weight`
    ([out, in]), `conv1_bias` is `conv1.bias`."""
    layer, _, bias = name.partition("_")
    return f"{layer}.{'bias' if bias else 'weight'}", layer.startswith("fc") and not bias


# The example's normalization of MNIST's pixels (transforms.Normalize((0.1307,), (0.3081,))).
MEAN, STD = 0.1307, 0.3081
