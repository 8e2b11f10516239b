"""``cs_run.parallel``: how the replicas share a run, behind one :class:`Strategy`
(docs/architecture.md#parallelism). ``runconfig.sharding`` picks it: ``none`` (data parallel) or
``fsdp`` (torch FSDP2); ``runconfig.offload: cpu`` keeps the sharded state in host memory.

The runner makes the run's strategy and makes it :func:`current`, so code that is not handed one
(``cstorch.save``) asks the same strategy; without a run it is data parallel.
"""

from __future__ import annotations

from typing import Optional

import torch

from cs_run.errors import ParamsError
from cs_run.parallel.fsdp import FullyShardedStrategy
from cs_run.parallel.strategy import Strategy

__all__ = ["FullyShardedStrategy", "OFFLOADS", "SHARDINGS", "Strategy", "build_strategy", "check_strategy",
           "current", "use"]

SHARDINGS = ("none", "fsdp")
OFFLOADS = ("none", "cpu")
_WORKING = "sharding: fsdp and offload: cpu run on --device CPU and GPU; --device CSX runs sharding: none"

_current: Strategy = Strategy()


def check_strategy(sharding: str, offload: str, num_replicas: int, device: str) -> None:
    """Refuse the combinations that do not work, before anything is built.

    Raises:
        ParamsError: an unknown value; sharding or offload on CSX (the engine traces whole-model,
            data-parallel steps only); offload with several data-parallel replicas (each holds the whole
            model on its device, FSDP2's offload needs the sharded form).
    """
    if sharding not in SHARDINGS:
        raise ParamsError(f"runconfig.sharding: {sharding!r} is not one of {', '.join(SHARDINGS)}")
    if offload not in OFFLOADS:
        raise ParamsError(f"runconfig.offload: {offload!r} is not one of {', '.join(OFFLOADS)}")
    if device.upper() == "CSX" and (sharding != "none" or offload != "none"):
        key = "runconfig.sharding" if sharding != "none" else "runconfig.offload"
        value = sharding if sharding != "none" else offload
        raise ParamsError(f"{key}: {value} with --device CSX: the CSX engine traces data-parallel steps only "
                          f"({_WORKING}); use --device CPU or GPU, or sharding: none and offload: none")
    if offload != "none" and sharding == "none" and num_replicas > 1:
        raise ParamsError(f"runconfig.offload: {offload} with {num_replicas} data-parallel replicas (sharding: none): "
                          "offload keeps FSDP2's sharded state in host memory; set runconfig.sharding: fsdp "
                          "(--sharding fsdp) or num_csx: 1")


def build_strategy(sharding: str = "none", offload: str = "none", autocast: Optional[torch.dtype] = None) -> Strategy:
    """The strategy for ``runconfig.sharding`` / ``offload`` (checked by :func:`check_strategy`); offload
    alone on one replica runs through FSDP2 over that replica. ``autocast``: the run's autocast dtype;
    bfloat16 also makes FSDP2 gather bfloat16 parameters and reduce gradients in float32."""
    if sharding == "fsdp" or offload != "none":
        return FullyShardedStrategy(offload=offload, param_dtype=autocast if autocast == torch.bfloat16 else None)
    return Strategy()


def use(strategy: Strategy) -> Strategy:
    """Make ``strategy`` the process's current one (the runner does, for its run); returns it."""
    global _current
    _current = strategy
    return strategy


def current() -> Strategy:
    """The strategy of this process's run; data parallel when no run made one."""
    return _current
