"""Runners (``--runner sharded_runners:...``) for the sharded-checkpoint tests, run inside the launched
replicas: one that also writes the all-gathered one-file form beside each sharded checkpoint (the
reference a conversion must equal), one whose replica 1 stalls inside a sharded save (so a test can kill
it there, or let the collective timeout end the job), one whose replica 1 alone finds a nan in its shard,
one that counts its gradient reduce-scatters
(and the parameter bytes it built before sharding)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import cs_run as cstorch
from cs_run.checkpoint import sharded
from cs_run.parallel.fsdp import FullyShardedStrategy
from cs_run.runners import PyTorchRunner
from cs_run.runners._checkpoint_files import nonfinite_keys

STALL_STEP = 20  # a checkpoint step of the tests' runs (checkpoint_steps: 10)


class GatheredRunner(PyTorchRunner):
    """After each sharded checkpoint, every replica also calls ``cstorch.save`` of the live model and
    optimizer state: FSDP2's ``full_tensor()`` all-gather of each sharded tensor, written by ordinal 0 as
    ``gathered_<step>.mdl`` (a name the runner does not list as a checkpoint)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        save, runner = self.checkpoints.save, self

        def save_and_gather() -> Path:
            path = save()
            state = {"model": runner.model.state_dict(), "optimizer": runner.optimizer.state_dict()}
            cstorch.save(state, path.with_name(f"gathered_{runner.global_step}.mdl"))
            return path

        self.checkpoints.save = save_and_gather  # this runner's checkpoints only


class StallingSaveRunner(PyTorchRunner):
    """Replica 1 writes its shard of step STALL_STEP's checkpoint, then records its pid in
    ``<model_dir>/../stalled`` and sleeps before the commit's collective (the others wait in it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.strategy.ordinal != 1:
            return
        write, runner = sharded.write_shard, self

        def stalling(tmp: str, state: Any, rank: int, world_size: int, identity: sharded.Identity) -> dict:
            manifest = write(tmp, state, rank, world_size, identity)
            if runner.global_step == STALL_STEP:
                (Path(runner.model_dir).parent / "stalled").write_text(str(os.getpid()))
                time.sleep(600)
            return manifest

        sharded.write_shard = stalling  # this replica process only: the strategy calls sharded.write_shard


class NonFiniteShardRunner(PyTorchRunner):
    """At step STALL_STEP's checkpoint, replica 1 puts a nan into the first of its rows of the model's last
    sharded tensor (the checkpoint form only, after the state is taken) and records that key in
    ``<model_dir>/../nan_key``: replica 0's shards stay finite, so only ``agree_keys`` can tell it that
    the weights are not."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.strategy.ordinal != 1:
            return
        state, runner = self.checkpoints.state, self

        def with_nan() -> dict:
            taken = state()
            if runner.global_step == STALL_STEP:
                key, shard = [(k, v) for k, v in taken["model"].items() if isinstance(v, sharded.LocalShard)][-1]
                assert shard.offset > 0 and shard.tensor.numel(), (key, shard)
                shard.tensor.view(-1)[0] = float("nan")
                assert nonfinite_keys(taken) == [f"model.{key}"]  # this replica finds it: the others must be told
                (Path(runner.model_dir).parent / "nan_key").write_text(f"model.{key}")
            return taken

        self.checkpoints.state = with_nan


class CountingReduceScatterRunner(PyTorchRunner):
    """Counts FSDP2's gradient reduce-scatters (``torch.distributed.reduce_scatter_single``, what its
    default reduce-scatter calls) in this replica; at each checkpoint writes ``<step> <count>`` to
    ``<model_dir>/../reduce_scatters_<ordinal>``. Also counts the bytes of parameters with storage (not
    on the meta device) that modules register while the strategy builds the model (before sharding), and
    writes them to ``<model_dir>/../built_<ordinal>``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        built, build = [0], FullyShardedStrategy.build

        def registered(module: torch.nn.Module, name: str, param: Any) -> None:
            if param is not None and not param.is_meta:
                built[0] += param.nbytes

        def counted_build(strategy: FullyShardedStrategy, *a: Any) -> torch.nn.Module:
            hook = torch.nn.modules.module.register_module_parameter_registration_hook(registered)
            try:
                return build(strategy, *a)
            finally:
                hook.remove()

        FullyShardedStrategy.build = counted_build  # this replica process only
        super().__init__(*args, **kwargs)
        (Path(self.model_dir).parent / f"built_{self.strategy.ordinal}").write_text(str(built[0]))
        count, original, save, runner = [0], dist.reduce_scatter_single, self.checkpoints.save, self

        def counting(*a: Any, **k: Any) -> Any:
            count[0] += 1
            return original(*a, **k)

        def save_and_record() -> Path:
            path = save()
            (Path(runner.model_dir).parent / f"reduce_scatters_{runner.strategy.ordinal}").write_text(
                f"{runner.global_step} {count[0]}")
            return path

        dist.reduce_scatter_single = counting  # this replica process only
        self.checkpoints.save = save_and_record
