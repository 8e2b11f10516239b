"""The seeded toy classifier and data the cs_run.Trainer tests fit: a Trainer's model takes an (x, y) batch and
returns its loss."""

from __future__ import annotations

import torch


def toy_model(dropout: float | None = None) -> torch.nn.Sequential:
    """6 -> 8 -> 3 from seed 0, with a Dropout before the head when ``dropout`` is given."""
    torch.manual_seed(0)
    head = [torch.nn.Dropout(dropout)] if dropout is not None else []
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), *head, torch.nn.Linear(8, 3))


class WithLoss(torch.nn.Module):
    """:func:`toy_model` and its cross entropy on the batch's labels."""

    def __init__(self, dropout: float | None = None):
        super().__init__()
        self.net = toy_model(dropout)

    def forward(self, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)


def toy_data(seed: int = 0, n: int = 32) -> torch.utils.data.TensorDataset:
    """``n`` random 6-feature rows and labels of 3 classes from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))
