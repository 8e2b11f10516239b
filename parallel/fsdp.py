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

Checkpoints are sharded (:mod:`cs_run.checkpoint.sharded`): each replica writes its own rows of every
sharded tensor into one folder, committed by ordinal 0 once all are written (:meth:`save_checkpoint`);
no replica gathers the whole state to save. Loading, each replica reads only the rows it keeps of every
sharded tensor (:meth:`read_checkpoint`): from the shards that hold them of a sharded folder (of any
number of replicas), or from a one-file checkpoint (``checkpoint_<step>.mdl`` of a data-parallel run or
``cstorch.save``); so no host holds a whole copy of the model. Only a torch or safetensors file, which has
no rows to read alone, is loaded whole by each replica.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
from typing import Any, Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from cs_run import replicas
from cs_run.checkpoint import sharded
from cs_run.checkpoint.atomic import resolve
from cs_run.checkpoint.files import check_pieces, read_rows
from cs_run.errors import CheckpointError, CsRunError, ParamsError
from cs_run.parallel.layout import Offload, Sharding
from cs_run.parallel.strategy import ReplicaGroup, Strategy, map_tensors

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

    sharding = Sharding.FSDP

    def __init__(self, offload: str = Offload.NONE, param_dtype: Optional[torch.dtype] = None) -> None:
        self.offload = Offload(offload)
        self.param_dtype = param_dtype
        """bfloat16 when the params ask for it: FSDP2's MixedPrecisionPolicy gathers each block's parameters
        in it and reduce-scatters gradients in float32; the sharded parameters, optimizer state and
        checkpoints stay float32. None: parameters as they are."""
        self._mesh: Any = None
        self._values: Optional[list[torch.Tensor]] = None
        """Between :meth:`build` and :meth:`shard`, when the other replicas built on meta: ordinal 0's whole
        parameters (its own model's; an empty list elsewhere), whose values :meth:`shard` sends to every shard."""

    def traced_group(self) -> Optional[ReplicaGroup]:
        """Never: the CSX engine traces whole-model steps (its in-graph all-reduce is data parallel)."""
        raise ParamsError(f"params: runconfig.sharding: the CSX engine traces whole-model steps, not "
                          f"sharding={self.sharding} / offload={self.offload}; run those on --device CPU or GPU, or "
                          "set sharding: none and offload: none for --device CSX")

    def build(self, builder: Any, device: torch.device) -> torch.nn.Module:
        """Ordinal 0 builds the model whole (one process's initialisation); every other replica builds it on the
        meta device (no storage), so one host holds one whole copy, not one per replica. :meth:`shard` then
        sends ordinal 0's values to every shard, and every replica continues with ordinal 0's random streams
        (a meta build draws nothing). A model the others cannot build on meta (values read in its
        ``__init__``): every replica builds it whole, as without meta initialisation, with one warning."""
        if not replicas.joined() or dist.get_world_size() == 1:
            return self.place(builder.whole()[0], device)
        streams = _streams()
        failed: Optional[BaseException] = None
        model: Any = None
        made: list = []
        why: Optional[str] = None
        if self.ordinal == 0:
            try:
                model, made = builder.whole()
            except BaseException as exc:  # noqa: BLE001  (raised below, once the others know)
                failed = exc
        else:
            model, made, why = builder.on_meta()
        on_meta = model is not None and any(t.is_meta for t in [*model.parameters(), *model.buffers()])
        outcomes = replicas.all_gather_object((failed is not None, why, on_meta, len(made)))
        if failed is not None:
            raise failed
        whys = [(rank, w) for rank, (_, w, _, _) in enumerate(outcomes) if w]
        counts = {n for *_, n in outcomes}
        if whys or len(counts) > 1 or any(f for f, *_ in outcomes):
            if self.ordinal == 0 and (whys or len(counts) > 1):
                rank, reason = whys[0] if whys else (1, "the replicas' builds made different numbers of metrics")
                logger.warning("sharding: fsdp: replica %d cannot build the model on the meta device (%s): every replica "
                               "builds the whole model before sharding it", rank, reason)
            if self.ordinal != 0:
                _set_streams(streams)  # as if the meta build never ran
                model = builder.whole()[0]
            return self.place(model, device)
        if not any(m for _, _, m, _ in outcomes):  # a model built before (the Trainer's): whole everywhere already
            return self.place(model, device)
        _set_streams(replicas.broadcast_object(_streams() if self.ordinal == 0 else None))
        for metric in made:  # small: whole on every replica, as the whole build's
            state = replicas.broadcast_object(_tensor_state(metric) if self.ordinal == 0 else None)
            if self.ordinal != 0:
                _set_tensor_state(metric, state)
        built = sum(p.nbytes for p in model.parameters() if not p.is_meta)
        logger.info("sharding: fsdp: replica %d built %d bytes of parameters%s", self.ordinal, built,
                    "" if self.ordinal == 0 else " (on the meta device; its shards get ordinal 0's values)")
        self._values = [p.detach() for p in model.parameters()] if self.ordinal == 0 else []
        return self.place(model, device)

    def place(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """In host memory: :meth:`shard` moves it to the device one block at a time (FSDP2 moves each unit's
        tensors, then keeps this replica's shard), so the whole model never sits on one device."""
        return model

    def shard(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """Shards ``model`` in place (each block of :func:`shard_units`, then the model): called before
        the optimizer is built, which then holds the sharded parameters and creates sharded state."""
        if isinstance(model, FSDPModule):
            return model
        if not replicas.joined():  # one replica (offload alone): FSDP2 still needs a process group
            replicas.join_alone(device.type)
        self._mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        # pin_memory needs an accelerator; on a CPU run the host memory is the device's anyway.
        policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if self.offload is Offload.CPU else None
        kwargs: dict[str, Any] = {"mesh": self._mesh, **({"offload_policy": policy} if policy else {})}
        if self.param_dtype is not None:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=torch.float32)
        units = shard_units(model)
        for unit in units:
            fully_shard(unit, **kwargs)
        fully_shard(model, **kwargs)
        if self._values is not None:
            self._fill(model, torch.device("cpu") if self.offload is Offload.CPU else device)
        logger.info("sharding: fsdp over %d replica(s), %d block(s) + the model's other parameters%s%s",
                    dist.get_world_size(), len(units), "; offload: cpu" if self.offload is Offload.CPU else "",
                    f"; mixed precision: {_name(self.param_dtype)} parameters, float32 gradient reductions"
                    if self.param_dtype is not None else "")
        return model

    def _fill(self, model: torch.nn.Module, device: torch.device) -> None:
        """Ordinal 0's values into every replica's shards and buffers, one whole tensor at a time (a broadcast,
        then each keeps its rows): the replicas built on meta get storage here, never a whole model."""
        values, self._values = self._values or [], None
        if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
            model.to_empty(device=device)
        comm = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                whole = values[i].to(comm) if values else torch.empty(p.shape, dtype=p.dtype, device=comm)
                dist.broadcast(whole, src=0)
                if isinstance(p, DTensor):
                    offset, rows = _rows(p)
                    p.to_local().copy_(whole[offset:offset + rows])
                else:
                    p.copy_(whole)
                del whole
                if values:
                    values[i] = None  # type: ignore[call-overload]  (ordinal 0's whole copy goes tensor by tensor)
            for b in model.buffers():
                whole = b.to(comm)
                dist.broadcast(whole, src=0)
                b.copy_(whole)

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """The sharded model itself: its hooks gather and reduce-scatter (no DDP on top)."""
        return model

    @contextlib.contextmanager
    def holding_gradients(self, model: torch.nn.Module) -> Iterator[None]:
        """Whole gradients accumulate on each replica (every FSDP group of the model, recursively), then the
        last micro-batch's backward reduce-scatters them: one reduce-scatter per group per step, not per
        micro-batch."""
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def gather(self, state: Any) -> Any:
        """Every sharded tensor whole (an all-gather each, in the state's order on every replica), on
        the CPU: the one-file checkpoint holds the same tensors as an unsharded run's."""
        def whole(t: torch.Tensor) -> torch.Tensor:
            if not isinstance(t, DTensor):
                return t
            with torch.no_grad():
                return t.full_tensor().detach().cpu()
        return map_tensors(state, whole)

    def checkpoint_form(self, state: Any) -> Any:
        """Each sharded tensor as this replica's rows (:class:`~cs_run.checkpoint.sharded.LocalShard`; no
        communication). A tensor under two keys (tied weights) is one LocalShard, stored once."""
        seen: dict[int, sharded.LocalShard] = {}

        def local(t: torch.Tensor) -> Any:
            if not isinstance(t, DTensor):
                return t
            if id(t) not in seen:
                seen[id(t)] = _local_rows(t)
            return seen[id(t)]
        return map_tensors(state, local)

    def agree_keys(self, keys: list[str]) -> list[str]:
        """The union of every replica's ``keys`` (each checked only its own shards), on every replica, so
        all stop or all save: one small all-gather per checkpoint."""
        return list(dict.fromkeys(k for found in replicas.all_gather_object(keys) for k in found))

    def save_checkpoint(self, state: Any, path: Any) -> None:
        """The sharded commit: ordinal 0 makes a temporary folder, every replica writes its shard into it,
        all meet (a replica that failed is named), ordinal 0 writes the index and renames the folder to
        ``path``, all meet again. A replica killed at any point leaves no folder under ``path`` (the others
        wait in the collective until the launcher stops them, at most the collective timeout)."""
        begun, error = replicas.broadcast_object(_attempt(_begin_save, path, state) if self.writes else None)
        if error:
            raise CheckpointError(f"cannot save checkpoint to '{path}': {error}")
        tmp, identity = begun  # every shard records ordinal 0's identity of this save
        written = _attempt(sharded.write_shard, tmp, state, self.ordinal, self.world_size, identity)
        results = replicas.all_gather_object(written)  # every shard is written, or failed
        failed = [(rank, err) for rank, (_, err) in enumerate(results) if err]
        committed: tuple[Any, Optional[str]] = (None, None)
        if self.writes:
            committed = (None, None) if failed else _attempt(sharded.commit, tmp, path, [m for m, _ in results])
            if failed or committed[1]:
                sharded.discard(tmp)
        _, error = replicas.broadcast_object(committed)  # nobody goes on before the commit
        if failed:
            rank, err = failed[0]
            raise CheckpointError(f"cannot save checkpoint to '{path}': replica {rank} of {self.world_size} could not "
                                  f"write its shard: {err}; the previous checkpoints are kept")
        if error:
            raise CheckpointError(f"cannot save checkpoint to '{path}': {error}")

    def read_checkpoint(self, path: Any, live: Any) -> Any:
        """Each replica reads only its rows of every sharded tensor into a host buffer, from a sharded
        folder's shards or from one file (:func:`~cs_run.checkpoint.files.read_rows`), and copies them into
        its shard; everything else (whole tensors, step, schedule, ...) is read whole. One all-gather
        carries every replica's CRC32 pieces of the rows it read (joined, they check every byte of every
        sharded tensor, which no replica read whole) or its error: each replica raises the first error, so
        all stop, or an autoload falls back to an older checkpoint, together."""
        found = resolve(os.fspath(path))
        seen: dict[int, sharded.LocalShard] = {}

        def rows(t: torch.Tensor) -> Any:
            if isinstance(t, DTensor) and id(t) not in seen:  # tied: one buffer
                offset, count = _rows(t)
                seen[id(t)] = sharded.LocalShard(torch.empty((count, *t.shape[1:]), dtype=t.dtype), tuple(t.shape), offset)
            return seen.get(id(t), t)
        state: Any = None
        try:
            state, pieces = read_rows(found, map_tensors(live, rows))
            outcome: tuple[list, Optional[CheckpointError]] = (pieces, None)
        except CheckpointError as err:
            outcome = ([], err)
        except OSError as err:
            outcome = ([], CheckpointError(f"cannot read checkpoint '{found}': {err}"))
        results = replicas.all_gather_object(outcome)
        errors = [err for _, err in results if err is not None]
        if errors:
            raise errors[0]  # the same on every replica
        check_pieces(found, [piece for mine, _ in results for piece in mine])
        logger.info("checkpoint %s: this replica read its rows of %d sharded tensor(s) (%d of their %d bytes)", found,
                    len(seen), sum(s.tensor.nbytes for s in seen.values()),
                    sum(math.prod(s.shape) * s.tensor.element_size() for s in seen.values()))
        return _place(live, state)

    def load_target(self, target: Any, device: Optional[torch.device] = None) -> Any:
        """An empty whole tensor for each sharded one (on the CPU, or ``meta`` for a shape check that reads no
        data); :meth:`read_checkpoint` reads this replica's rows only."""
        return map_tensors(target, lambda t: torch.empty(t.shape, dtype=t.dtype, device=device or "cpu")
                           if isinstance(t, DTensor) else t)


def _rows(t: DTensor) -> tuple[int, int]:
    """``(offset, rows)`` of this replica's rows of a DTensor sharded on dim 0 over a 1-D mesh (FSDP2's
    ``Shard(0)``, torch.chunk's split)."""
    if t.device_mesh.ndim != 1 or tuple(t.placements) != (Shard(0),):
        raise CheckpointError(f"cannot save or load a tensor placed as {t.placements} on a {t.device_mesh.ndim}-D "
                              "mesh: sharded checkpoints hold dim-0 shards over one mesh dimension (FSDP2's Shard(0))")
    rank, world = t.device_mesh.get_local_rank(), t.device_mesh.size()
    offset, rows = sharded.rows_of(rank, world, t.shape[0])
    if t.to_local().shape[0] != rows:
        raise CheckpointError(f"cannot save or load a tensor of shape {list(t.shape)}: replica {rank} holds "
                              f"{t.to_local().shape[0]} rows, torch.chunk's split gives it {rows}")
    return offset, rows


def _local_rows(t: DTensor) -> sharded.LocalShard:
    """This replica's rows of a sharded DTensor (:func:`_rows`), on the host."""
    offset, _ = _rows(t)
    return sharded.LocalShard(t.to_local().detach().cpu(), tuple(t.shape), offset)


def _streams() -> dict[str, Any]:
    """The random streams a model build draws from: torch's CPU (and this device's CUDA) generator, numpy's,
    Python's."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_streams(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["random"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _tensor_state(module: torch.nn.Module) -> dict[str, Any]:
    """A small module's own tensors (a metric's state buffers and initial values), on the host."""
    def host(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.detach().cpu()
        return {k: t.detach().cpu() for k, t in v.items()}
    return {"buffers": {k: host(b) for k, b in module._buffers.items() if b is not None},
            "attrs": {k: host(v) for k, v in vars(module).items() if k not in ("_parameters", "_buffers") and (
                isinstance(v, torch.Tensor) or (isinstance(v, dict) and v and all(
                    isinstance(t, torch.Tensor) for t in v.values())))}}


def _set_tensor_state(module: torch.nn.Module, state: dict[str, Any]) -> None:
    module._buffers.update(state["buffers"])
    vars(module).update(state["attrs"])


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _attempt(fn: Any, *args: Any) -> tuple[Any, Optional[str]]:
    """``(fn(*args), None)``, or ``(None, the error's line)``: a replica's failure is told to the others
    in the next collective instead of leaving them waiting in it."""
    try:
        return fn(*args), None
    except (CsRunError, OSError) as err:
        return None, str(err)


def _begin_save(path: Any, state: Any) -> tuple[str, sharded.Identity]:
    """Ordinal 0's start of a sharded save: its temporary folder and the save's identity."""
    return sharded.new_temp_folder(path), sharded.new_identity(state)


def _place(live: Any, read: Any) -> Any:
    if isinstance(live, DTensor) and isinstance(read, sharded.LocalShard):  # this replica's rows, read alone
        with torch.no_grad():
            live.to_local().copy_(read.tensor)
        return live
    if isinstance(live, dict) and isinstance(read, dict):
        return type(read)((k, _place(live.get(k), v)) for k, v in read.items())
    if isinstance(live, (list, tuple)) and isinstance(read, (list, tuple)) and len(live) == len(read):
        return type(read)(_place(a, b) for a, b in zip(live, read))
    return read
