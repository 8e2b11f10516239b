"""Trace-safe stand-ins and data for the engine tests.

Until ``cs_run.optim`` lands, ``TraceSafeSGD`` / ``ExponentialLR`` stand in for the compliant optimizer
and scheduler: all state created up front, the lr a 0-d tensor updated in place.
"""

from __future__ import annotations

import torch


class TraceSafeSGD(torch.optim.Optimizer):
    """SGD with momentum; buffers preallocated, lr a tensor. Matches torch.optim.SGD's update order."""

    def __init__(self, params, lr: float = 0.1, momentum: float = 0.9, weight_decay: float = 0.0) -> None:
        super().__init__(params, dict(lr=torch.tensor(lr), momentum=momentum, weight_decay=weight_decay))
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad if group["weight_decay"] == 0 else p.grad.add(p, alpha=group["weight_decay"])
                buf = self.state[p]["momentum_buffer"]
                buf.mul_(group["momentum"]).add_(grad)
                p.sub_(buf * group["lr"])


class ExponentialLR:
    """Closed-form lr = base * gamma ** last_epoch; ``last_epoch`` is a tensor, lr copied in place."""

    def __init__(self, optimizer, gamma: float) -> None:
        self.optimizer, self.gamma = optimizer, gamma
        self.base_lrs = [g["lr"].clone() for g in optimizer.param_groups]
        self.last_epoch = torch.tensor(0)

    def step(self) -> None:
        self.last_epoch.add_(1)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"].copy_(base * self.gamma ** self.last_epoch)


class MLP(torch.nn.Module):
    """fc_mnist-like: Linear/BatchNorm/ReLU stack, log-softmax output."""

    def __init__(self, in_features: int = 16, hidden: int = 32, depth: int = 2, classes: int = 4) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = []
        for i in range(depth):
            layers += [torch.nn.Linear(in_features if i == 0 else hidden, hidden), torch.nn.BatchNorm1d(hidden),
                       torch.nn.ReLU()]
        self.body = torch.nn.Sequential(*layers)
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.head(self.body(x)), dim=-1)


def make_dataset(n: int = 256, in_features: int = 16, classes: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_features, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def input_fn(batch_size: int = 32, seed: int = 0) -> torch.utils.data.DataLoader:
    """A seed-000 style input_fn: builds this worker's torch DataLoader."""
    return torch.utils.data.DataLoader(make_dataset(seed=seed), batch_size=batch_size, shuffle=False,
                                       drop_last=True)


def make_sgd_step():
    """A seeded two-layer model and its SGD-with-momentum step, ``(model, step(x) -> loss)``: the small step
    the compile cache, tier and AOT tests build twice and compare."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = TraceSafeSGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return model, step


def built(compiled):
    """The (traced step, executable) a CompiledStep built for its one input signature."""
    (entry,) = compiled._executables.values()
    return entry
