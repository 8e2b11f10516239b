"""The run's :class:`~cs_run.parallel.Strategy`: built from its :class:`~cs_run.parallel.Layout` and made the
process's current one, so code that is not handed one (``cstorch.save``) asks the same strategy; without a
run it is data parallel."""

from __future__ import annotations

from typing import Optional

import torch

from cs_run.parallel.fsdp import FullyShardedStrategy
from cs_run.parallel.layout import DATA_PARALLEL, Layout
from cs_run.parallel.strategy import Strategy

__all__ = ["build_strategy", "current", "use"]

_current: Strategy = Strategy()


def build_strategy(layout: Layout = DATA_PARALLEL, autocast: Optional[torch.dtype] = None) -> Strategy:
    """The strategy for ``layout`` (checked by :func:`~cs_run.parallel.resolve_layout`); offload alone on one
    replica runs through FSDP2 over that replica. ``autocast``: the run's autocast dtype; bfloat16 also makes
    FSDP2 gather bfloat16 parameters and reduce gradients in float32."""
    if layout.sharded:
        return FullyShardedStrategy(offload=layout.offload, param_dtype=autocast if autocast == torch.bfloat16 else None)
    return Strategy()


def use(strategy: Strategy) -> Strategy:
    """Make ``strategy`` the process's current one (the runner does, for its run); returns it."""
    global _current
    _current = strategy
    return strategy


def current() -> Strategy:
    """The strategy of this process's run; data parallel when no run made one."""
    return _current
