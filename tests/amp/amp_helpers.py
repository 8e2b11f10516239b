"""Helpers for the amp tests (imported as a module: a unique name, unlike conftest): a tiny compliant optimizer and a make_fx step tracer.

``trace_step`` does what the CSX engine does (docs/architecture.md#the-csx-engine-cs_runengine): parameters, optimizer state and grad
scaler buffers become graph inputs, the step is traced once with fake tensors, and the graph is
replayed on the real tensors, which it mutates in place.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch.fx.experimental.proxy_tensor import make_fx


class PreinitSGD(torch.optim.Optimizer):
    """SGD with momentum and weight decay whose state exists from construction (cs_run.optim style)."""

    def __init__(
        self, params, lr: float = 0.1, momentum: float = 0.9, weight_decay: float = 0.01
    ) -> None:
        super().__init__(
            params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}
        )
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p)
                self.state[p]["step"] = torch.zeros((), dtype=torch.float32)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                grad = p.grad + group["weight_decay"] * p
                state["momentum_buffer"].mul_(group["momentum"]).add_(grad)
                p.add_(state["momentum_buffer"], alpha=-group["lr"])
                state["step"].add_(1)


def _swap(module: torch.nn.Module, name: str, value: torch.Tensor) -> torch.Tensor:
    path, _, attr = name.rpartition(".")
    sub = module.get_submodule(path)
    container = sub._parameters if attr in sub._parameters else sub._buffers
    old = container[attr]
    container[attr] = value
    return old


@contextmanager
def _bound(modules, optimizer, flat):
    """Points modules' tensors and the optimizer at ``flat`` (same order as ``_state``), restores after."""
    it = iter(flat)
    restore = []
    param_map = {}
    try:
        for mod in modules:
            for name, t in list(mod.named_parameters()) + list(mod.named_buffers()):
                new = next(it)
                param_map[t] = new
                restore.append((mod, name, _swap(mod, name, new)))
        old_groups = [g["params"] for g in optimizer.param_groups]
        old_state = optimizer.state
        new_state = {}
        for p, entry in old_state.items():
            new_state[param_map[p]] = {
                k: next(it) if isinstance(v, torch.Tensor) else v
                for k, v in entry.items()
            }
        for g in optimizer.param_groups:
            g["params"] = [param_map[p] for p in g["params"]]
        optimizer.state = new_state
        yield
    finally:
        for mod, name, old in reversed(restore):
            _swap(mod, name, old)
        if "old_groups" in locals():
            for g, params in zip(optimizer.param_groups, old_groups):
                g["params"] = params
            optimizer.state = old_state


def _state(modules, optimizer) -> list[torch.Tensor]:
    flat = []
    for mod in modules:
        flat += [t for _, t in mod.named_parameters()] + [
            t for _, t in mod.named_buffers()
        ]
    for entry in optimizer.state.values():
        flat += [v for v in entry.values() if isinstance(v, torch.Tensor)]
    return flat


def trace_step(
    modules: list[torch.nn.Module], optimizer, step_fn: Callable, *batch: torch.Tensor
) -> Callable:
    """Traces ``step_fn(*batch)`` once (fake tensors) and returns ``replay(*batch)`` running the graph."""
    state = _state(modules, optimizer)

    def traced(flat, batch):
        with _bound(modules, optimizer, flat):
            return step_fn(*batch)

    graph = make_fx(traced, tracing_mode="fake")(state, list(batch))

    @torch.no_grad()
    def replay(*new_batch):
        return graph(state, list(new_batch))

    replay.graph = graph
    return replay
