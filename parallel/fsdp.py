"""``runconfig.sharding: fsdp``: parameters, gradients and optimizer state sharded over the replicas with
torch's FSDP2 (``torch.distributed.fsdp.fully_shard``, DTensor), see docs/architecture.md#parallelism.

Each replica holds 1/N of every parameter (dim-0 shards, DTensors); a block's whole parameters exist only
while its forward or backward runs (an all-gather before, freed after), and its gradients are
reduce-scattered so each replica steps the optimizer on its own shard. The optimizer is built on the
sharded parameters, so its state (``zeros_like(p)`` in ``preinitialize``) is sharded too. Clipping by
norm needs nothing extra: ``torch.nn.utils.clip_grad_norm_`` of DTensor gradients computes the global
norm (the per-shard norms are all-reduced), which is what ``amp.apply_gradients`` already calls.

``offload: cpu`` is FSDP2's ``CPUOffloadPolicy``: the sharded parameters, gradients and optimizer state
live in host memory and each block's parameters are copied to the device for its forward and backward.
On a CPU run they are in host memory anyway, so there it changes where nothing lives; it matters with an
accelerator (pinned host memory then).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from cs_run import replicas
from cs_run.parallel.strategy import Strategy, map_tensors

__all__ = ["FullyShardedStrategy", "shard_units"]

logger = logging.getLogger(__name__)


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that get their own FSDP group, outermost first: every block of a ``ModuleList`` (the
    decoder blocks of a transformer) that holds parameters and is not inside another unit. The model
    itself is the last group and takes the rest (embeddings, final norm, head: tied embedding and head
    weights must share a group)."""
    units: list[torch.nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside or not isinstance(module, torch.nn.ModuleList):
            continue
        for block in module:
            if any(True for _ in block.parameters()):
                units.append(block)
                inside.update(id(m) for m in block.modules())
    return units


class FullyShardedStrategy(Strategy):
    """FSDP2 over the replicas: each holds 1/N of the parameters, gradients and optimizer state."""

    sharding = "fsdp"

    def __init__(self, offload: str = "none") -> None:
        self.offload = offload
        self._mesh: Any = None

    def shard(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """Shards ``model`` in place (each block of :func:`shard_units`, then the model): called before
        the optimizer is built, which then holds the sharded parameters and creates sharded state."""
        if isinstance(model, FSDPModule):
            return model
        if not replicas.joined():  # one replica (offload alone): FSDP2 still needs a process group
            replicas.join_alone(device.type)
        self._mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        # pin_memory needs an accelerator; on a CPU run the host memory is the device's anyway.
        policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if self.offload == "cpu" else None
        kwargs: dict[str, Any] = {"mesh": self._mesh, **({"offload_policy": policy} if policy else {})}
        units = shard_units(model)
        for unit in units:
            fully_shard(unit, **kwargs)
        fully_shard(model, **kwargs)
        logger.info("sharding: fsdp over %d replica(s), %d block(s) + the model's other parameters%s",
                    dist.get_world_size(), len(units), "; offload: cpu" if self.offload == "cpu" else "")
        return model

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """The sharded model itself: its hooks gather and reduce-scatter (no DDP on top)."""
        return model

    def gather(self, state: Any) -> Any:
        """Every sharded tensor whole (an all-gather each, in the state's order on every replica), on
        the CPU: the one-file checkpoint holds the same tensors as an unsharded run's."""
        def whole(t: torch.Tensor) -> torch.Tensor:
            if not isinstance(t, DTensor):
                return t
            with torch.no_grad():
                return t.full_tensor().detach().cpu()
        return map_tensors(state, whole)

    def load_target(self, target: Any, device: Optional[torch.device] = None) -> Any:
        """An empty whole tensor for each sharded one (on the CPU, or ``meta`` for a shape check)."""
        return map_tensors(target, lambda t: torch.empty(t.shape, dtype=t.dtype, device=device or "cpu")
                           if isinstance(t, DTensor) else t)

    def place_loaded(self, target: Any, loaded: Any) -> Any:
        """Copies this replica's shard of each whole tensor read into the live sharded one (no
        communication: every replica read the whole file) and returns ``loaded`` holding the live ones."""
        return _place(target, loaded)


def _place(live: Any, read: Any) -> Any:
    if isinstance(live, DTensor) and isinstance(read, torch.Tensor) and not isinstance(read, DTensor):
        with torch.no_grad():
            shard = distribute_tensor(read, live.device_mesh, live.placements, src_data_rank=None).to_local()
            live.to_local().copy_(shard)
        return live
    if isinstance(live, dict) and isinstance(read, dict):
        return type(read)((k, _place(live.get(k), v)) for k, v in read.items())
    if isinstance(live, (list, tuple)) and isinstance(read, (list, tuple)) and len(live) == len(read):
        return type(read)(_place(a, b) for a, b in zip(live, read))
    return read
