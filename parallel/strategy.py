"""The Strategy: one home for how the replicas share a run (docs/architecture.md#parallelism).

Every decision that depends on how the model is spread over the ``num_csx`` replicas is a method here,
so the runners, ``cstorch.compile`` and ``cstorch.save`` ask the strategy instead of knowing the answer:

* the model: :meth:`Strategy.build` (whole, or on the meta device on the replicas that :meth:`Strategy.shard`
  fills from ordinal 0), :meth:`Strategy.shard` (before the optimizer is built on its parameters),
  :meth:`Strategy.wrap` (what the eager train step calls) and :meth:`Strategy.holding_gradients` (its
  micro-batches but the last, accumulated without a reduction);
* who writes (:attr:`Strategy.writes`: model_dir, logs, summaries, checkpoints);
* host reductions (the logged loss, eval sums), the broadcast of ordinal 0's choices and the stop
  agreement after every step;
* checkpoint state: :meth:`Strategy.checkpoint_form` turns the live state into what the replicas write
  and :meth:`Strategy.save_checkpoint` writes it (here the one-file form of :meth:`Strategy.gather`,
  by ordinal 0); :meth:`Strategy.read_checkpoint` reads one back (:meth:`Strategy.load_target` says what
  into, also for the shape checks that read no data).

This class is ``sharding: none``, data parallel: every replica holds the whole model and optimizer
state, the eager step runs through torch DDP (:func:`cs_run.replicas.replicate`) and the CSX engine
traces the all-reduce into its graph (``engine/replica_sync``). ``fsdp`` is :mod:`cs_run.parallel.fsdp`.
The process machinery (launch, join, the host group) stays in :mod:`cs_run.replicas`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from cs_run import checkpoint, replicas
from cs_run.checkpoint.tree import map_tensors
from cs_run.parallel.layout import Offload, Sharding

__all__ = ["ReplicaGroup", "Strategy", "map_tensors"]


@dataclass(frozen=True)
class ReplicaGroup:
    """The replicas a step traced by the CSX engine averages its gradients over, inside the graph (more
    than one): functional collectives name the group; its size and backend are part of the compile-cache
    key, so a graph traced for 2 replicas never replays with 4."""

    world_size: int
    backend: str
    group_name: str


class Strategy:
    """Data parallel (``runconfig.sharding: none``): whole replicas, gradients averaged."""

    sharding = Sharding.NONE
    offload = Offload.NONE

    # ------------------------------------------------------------------------------- topology

    def start(self, num_replicas: int, device_type: str, timeout_s: int) -> None:
        """Make this process one of ``num_replicas`` (launch or join: :func:`cs_run.replicas.start`)."""
        replicas.start(num_replicas, device_type, timeout_s)

    @property
    def world_size(self) -> int:
        return replicas.world_size()

    @property
    def ordinal(self) -> int:
        return replicas.ordinal()

    @property
    def writes(self) -> bool:
        """True on the one replica that writes model_dir (its lock, logs, summaries, checkpoints)."""
        return replicas.is_master()

    # ---------------------------------------------------------------------------------- model

    def build(self, builder: Any, device: torch.device) -> torch.nn.Module:
        """The run's model from ``builder`` (``whole()`` / ``on_meta()``: runners' ``ModelBuild``), placed
        (:meth:`place`). Data parallel: every replica builds it whole."""
        return self.place(builder.whole()[0], device)

    def place(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """The newly built ``model`` where it waits for :meth:`shard`. Data parallel: on the device, whole."""
        return model.to(device)

    def shard(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """The model whose parameters the optimizer is built on. Data parallel: the whole model."""
        return model

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """The module the eager train step calls: DDP with several replicas (gradients averaged in
        backward), the model itself with one."""
        return replicas.replicate(model, device)

    def holding_gradients(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The context of a micro-batch whose gradients stay on this replica, summed there (every micro-batch
        of a step but the last), so the replicas reduce once per step. Data parallel: DDP's ``no_sync`` on
        what :meth:`wrap` made; nothing to hold for one replica."""
        return model.no_sync() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext()

    def traced_group(self) -> Optional[ReplicaGroup]:
        """The replicas of the default process group, for the CSX engine's in-graph all-reduce; None for
        one process."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
            return None
        group = dist.group.WORLD
        return ReplicaGroup(dist.get_world_size(), str(dist.get_backend(group)), group.group_name)

    # ------------------------------------------------------------------------ host reductions

    def mean_value(self, value: float) -> float:
        """The mean over replicas of a host number (the logged loss of the global batch)."""
        return replicas.mean_value(value)

    def sum_values(self, *values: float) -> tuple[float, ...]:
        """Sums over replicas (eval loss sums and batch counts, loader lengths), in float64."""
        return replicas.sum_values(*values)

    def broadcast_object(self, value: Any) -> Any:
        """Ordinal 0's ``value`` on every replica (the checkpoint they all resume from)."""
        return replicas.broadcast_object(value)

    def agree_stop(self, signum: int, stop: bool) -> tuple[int, bool]:
        """Any replica's stop request (a signal number, ``should_stop``) on every replica, so all stop
        after the same step: one tiny MAX all-reduce per step with several replicas."""
        if replicas.world_size() == 1:
            return signum, stop
        agreed_signum, agreed_stop = replicas.max_values(signum, float(stop))
        return int(agreed_signum), bool(agreed_stop)

    def stop_grace(self) -> Optional[int]:
        """Seconds a replica runs on after its first signal (the collective timeout); None alone."""
        return replicas.stop_grace()

    def report_end(self, line: str, exit_code: int) -> None:
        """How a replica that ends itself says why (recorded for the launcher)."""
        replicas.report_end(line, exit_code)

    # ------------------------------------------------------------------------ checkpoint state

    def gather(self, state: Any) -> Any:
        """The checkpoint form of the live ``state`` (a nested dict of model, optimizer, ... state).
        Data parallel: every replica holds it whole already. Every replica calls it (a collective when
        the state is sharded)."""
        return state

    def checkpoint_form(self, state: Any) -> Any:
        """What :meth:`save_checkpoint` writes of the live ``state``: the one-file form (:meth:`gather`)."""
        return self.gather(state)

    def agree_keys(self, keys: list[str]) -> list[str]:
        """Keys a check of the checkpoint form found (non-finite tensors), the same on every replica.
        Data parallel: every replica checked the same whole state."""
        return keys

    def save_checkpoint(self, state: Any, path: Any) -> None:
        """Write :meth:`checkpoint_form`'s ``state`` to ``path``: ordinal 0 writes the one file (atomic),
        the other replicas validate only. Every replica calls it."""
        checkpoint.save(state, str(path), write=self.writes)

    def read_checkpoint(self, path: Any, live: Any) -> Any:
        """The one read of a checkpoint (every replica calls it): ``live``'s tensors are read in place and the
        whole state returned with them. Data parallel: each replica reads the whole file (or folder) into its
        tensors (:meth:`load_target`, :meth:`place_loaded`)."""
        return self.place_loaded(live, checkpoint.load_into(str(path), self.load_target(live)))

    def load_target(self, target: Any, device: Optional[torch.device] = None) -> Any:
        """What a checkpoint is read into, given the live tensors ``target``: the live tensors themselves
        (read in place). ``device="meta"`` asks for shapes only (checks that read no data)."""
        return target

    def place_loaded(self, target: Any, loaded: Any) -> Any:
        """Bring state read into :meth:`load_target`'s tensors into the live ``target``; returns
        ``loaded`` with its leaves the live tensors. Data parallel: they already are."""
        return loaded
