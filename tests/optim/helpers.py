"""Small seeded models and a 50-step driver shared by the optim tests."""

from __future__ import annotations

import copy

import torch


class SmallNet(torch.nn.Module):
    """A matrix, a bias and a 3-d weight, so Adafactor sees factored and unfactored states."""

    def __init__(self, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(6, 5, generator=g, dtype=dtype) * 0.5)
        self.b1 = torch.nn.Parameter(torch.randn(6, generator=g, dtype=dtype) * 0.1)
        self.w2 = torch.nn.Parameter(torch.randn(2, 3, 6, generator=g, dtype=dtype) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x @ self.w1.T + self.b1)
        return torch.einsum("bh,kch->bkc", h, self.w2).reshape(x.shape[0], -1)


def batches(n: int = 50, dtype: torch.dtype = torch.float64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 5, generator=g, dtype=dtype), torch.randn(8, 6, generator=g, dtype=dtype)) for _ in range(n)]


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, data, sched=None) -> list[float]:
    """Eager loop: forward, MSE, backward, step, zero_grad(set_to_none=False), scheduler step."""
    losses = []
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        if sched is not None:
            sched.step()
        losses.append(float(loss.detach()))
    return losses


def twins(dtype: torch.dtype = torch.float64) -> tuple[SmallNet, SmallNet]:
    model = SmallNet(dtype)
    return model, copy.deepcopy(model)
