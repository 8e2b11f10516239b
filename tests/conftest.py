"""Shared, seeded fixtures: a tiny MLP and a synthetic classification loader (Lightning's BoringModel).

Torch is pinned to one thread: results stay deterministic and two-core CI hosts do not thrash.
"""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


class TinyMLP(torch.nn.Module):
    """Two linear layers with a BatchNorm, so tests see parameters *and* buffers."""

    def __init__(self, in_features: int = 8, hidden: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(in_features, hidden)
        self.bn = torch.nn.BatchNorm1d(hidden)
        self.fc2 = torch.nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def make_batches(n: int = 8, batch_size: int = 4, in_features: int = 8, classes: int = 4, seed: int = 0):
    """A deterministic list of (inputs, labels) batches."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch_size, in_features, generator=g), torch.randint(0, classes, (batch_size,), generator=g))
        for _ in range(n)
    ]


@pytest.fixture
def tiny_mlp() -> TinyMLP:
    torch.manual_seed(0)
    return TinyMLP()


@pytest.fixture
def batches():
    return make_batches()


@pytest.fixture
def model_dir(tmp_path):
    path = tmp_path / "model_dir"
    path.mkdir()
    return path
