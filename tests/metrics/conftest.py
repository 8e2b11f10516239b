"""Metric tests start with an empty registry and restore it afterwards."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from cs_run.metrics import metric as metric_module


@pytest.fixture(autouse=True)
def _clean_registry():
    saved = {name: list(held) for name, held in metric_module._METRICS.items()}
    metric_module._METRICS.clear()
    yield
    metric_module._METRICS.clear()
    metric_module._METRICS.update(saved)


def _trace_and_replay(
    metric: torch.nn.Module, *args: torch.Tensor, **kwargs: torch.Tensor
) -> torch.Tensor:
    """Traces ``metric(*args, **kwargs)`` with make_fx in fake mode, its state as graph inputs (the
    way the CSX engine does), then runs the graph on the metric's real state tensors (mutating them
    in place) and returns the graph's output."""
    names = [n for n, _ in metric.named_buffers()]
    kw_names = sorted(kwargs)

    def step(state, batch, kw):
        return torch.func.functional_call(
            metric, dict(zip(names, state)), tuple(batch), dict(zip(kw_names, kw))
        )

    state = [b for _, b in metric.named_buffers()]
    kw = [kwargs[k] for k in kw_names]
    graph = make_fx(step, tracing_mode="fake")(state, list(args), kw)
    return graph(state, list(args), kw)


@pytest.fixture
def trace_and_replay():
    return _trace_and_replay
