"""Data-parallel replicas inside the traced CSX step (docs/architecture.md#replicas-on-csx).

With more than one replica (the group the run's data-parallel :class:`~cs_run.parallel.Strategy` gives
in ``traced_group()``), every traced step averages the parameters' gradients over the replicas *inside
the graph*: functional collectives
(``_c10d_functional.all_reduce`` + ``wait_tensor``) are traced with the rest of the step, so the step
is still captured once and replayed, with no user Python and no host sync. Nobody wraps the model in
DDP on CSX; the semantics are DDP's:

* gradients are averaged (each bucket divided by the world size, then summed: DDP's default hook)
  once, after the last backward of the step and before anything reads them, so gradient
  accumulation reduces once, the grad scaler unscales and checks the *reduced* gradients (every
  replica skips the same steps) and clipping sees the reduced gradient;
* the models' persistent buffers (BatchNorm statistics) are ordinal 0's on every replica after each
  training step (DDP broadcasts them before each forward; only ordinal 0's chain survives either
  way). Non-persistent buffers (metric states, masks) stay per replica; a grad scaler's state needs
  nothing (it sees the reduced gradients, so it is the same everywhere);
* before a new graph first runs, ordinal 0's parameters and persistent buffers are copied to every
  replica (DDP does this at construction).

The replica count and backend are part of ``TracedStep.replicas``, hence of the compile-cache key.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch
import torch.distributed as dist

from cs_run._torch_compat import c10d_functional
from cs_run.engine.state import StateSet
from cs_run.parallel.strategy import ReplicaGroup

__all__ = ["BUCKET_BYTES", "TraceSync", "agree_choice", "broadcast_model_state", "cache_key",
           "common_tier", "first_failure"]

logger = logging.getLogger(__name__)

BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb: one collective per bucket of one dtype/device
_BACKWARDS = (torch.Tensor.backward, torch.autograd.backward)
_GRAD_GET = torch.Tensor.grad.__get__


def cache_key(r: ReplicaGroup | None) -> str:
    """What the compile-cache key hashes about the replicas (a 1-replica graph never replays with 2)."""
    return "replicas=1" if r is None else f"replicas={r.world_size}|{r.backend}|{r.group_name}"


def _wait(t: torch.Tensor) -> torch.Tensor:
    return c10d_functional.wait_tensor(t)


def _buckets(tensors: Sequence[torch.Tensor]) -> list[list[int]]:
    """Indices of ``tensors`` grouped by dtype and device, in order, each group cut at BUCKET_BYTES."""
    open_: dict[tuple, tuple[list[int], list[int]]] = {}
    out: list[list[int]] = []
    for i, t in enumerate(tensors):
        key = (t.dtype, t.device)
        size = t.numel() * t.element_size()
        entry = open_.get(key)
        if entry is None or (entry[0] and entry[1][0] + size > BUCKET_BYTES):
            entry = ([], [0])
            open_[key] = entry
            out.append(entry[0])
        entry[0].append(i)
        entry[1][0] += size
    return out


def _flat(ts: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ts]) if len(ts) > 1 else ts[0].reshape(-1)


def _pieces(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [p.view(t.shape) for p, t in zip(flat.split([t.numel() for t in like]), like)]


def _model_slots(state: StateSet) -> tuple[list[int], list[int]]:
    """Slot indices of the parameters and of the models' persistent buffers (what a checkpoint holds of a
    module that has parameters; not a grad scaler's counters, not metric states, which are non-persistent)."""
    models = [top for top in state.modules if next(top.parameters(), None) is not None]
    owners = {id(m._buffers): m for top in models for m in top.modules()}
    params, buffers = [], []
    for i, slot in enumerate(state.slots):
        if slot.kind == "parameter":
            params.append(i)
        elif slot.kind == "buffer":
            owner = owners.get(id(slot.container))
            if owner is not None and slot.key not in owner._non_persistent_buffers_set:
                buffers.append(i)
    return params, buffers


class TraceSync:
    """The replicas' side of one trace: called by the trace's function mode around every torch call.

    A backward marks the gradients pending; the first read of a parameter's ``.grad`` after that (the
    grad scaler's unscale, clipping, the optimizer, the user) first averages every pending gradient
    over the replicas. ``finish`` (end of the step) reduces what is still pending and, in a step that
    ran a backward, broadcasts ordinal 0's values of the models' persistent buffers.
    """

    def __init__(self, r: ReplicaGroup, state: StateSet, fakes: Sequence[torch.Tensor]) -> None:
        self.replicas = r
        param_idx, buffer_idx = _model_slots(state)
        self._params = [fakes[i] for i in param_idx]
        self._param_ids = {id(p) for p in self._params}
        self._buffers = [(state.slots[i], fakes[i]) for i in buffer_idx]
        self._pending = False
        self.ran_backward = False
        self.reductions = 0

    def before(self, func: Any, args: tuple) -> None:
        if self._pending and func == _GRAD_GET and args and id(args[0]) in self._param_ids:
            self.reduce_gradients()

    def after(self, func: Any) -> None:
        if func in _BACKWARDS:
            self._pending = self.ran_backward = True

    def reduce_gradients(self) -> None:
        """Averages the parameters' gradients over the replicas (one all-reduce per bucket)."""
        self._pending = False
        params = [p for p in self._params if p.grad is not None]
        grads = [p.grad for p in params]
        n, group = self.replicas.world_size, self.replicas.group_name
        for idx in _buckets(grads):
            like = [grads[i] for i in idx]
            flat = _flat(like) / n  # DDP's allreduce hook: divide by the world size, then sum
            flat = _wait(c10d_functional.all_reduce(flat, "sum", group))
            for i, g in zip(idx, _pieces(flat, like)):
                params[i].grad = g
        self.reductions += 1

    def finish(self) -> None:
        if self._pending:
            self.reduce_gradients()
        if not self.ran_backward:
            return  # eval steps keep their per-replica buffers (metric states are reduced elsewhere)
        # (every one, as DDP does: whether a step wrote a buffer cannot be told reliably at the trace;
        # native_batch_norm updates the running statistics without saying so in its schema)
        changed = [(slot, fake, slot.get()) for slot, fake in self._buffers]
        changed = [c for c in changed if isinstance(c[2], torch.Tensor)]
        values = [v for _, _, v in changed]
        for idx in _buckets(values):
            like = [values[i] for i in idx]
            flat = _wait(c10d_functional.broadcast(_flat(like), 0, self.replicas.group_name))
            for i, v in zip(idx, _pieces(flat, like)):
                slot, fake, value = changed[i]
                if value is fake:
                    fake.copy_(v)
                else:
                    slot.set(v)


def broadcast_model_state(state: StateSet) -> None:
    """Ordinal 0's parameters and persistent buffers into every replica (real tensors, outside the graph)."""
    param_idx, buffer_idx = _model_slots(state)
    tensors = [state.slots[i].tensor for i in param_idx + buffer_idx]
    with torch.no_grad():
        for idx in _buckets(tensors):
            like = [tensors[i] for i in idx]
            flat = _flat(like).clone()
            dist.broadcast(flat, src=0)
            for t, v in zip(like, _pieces(flat, like)):
                t.copy_(v)


def _gather(value: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def common_tier(tier: str) -> str:
    """The resolved compile tier every replica uses: theirs if all agree, else ``fx`` (logged)."""
    tiers = _gather(tier)
    if len(set(tiers)) == 1:
        return tier
    logger.info("compile_tier: the replicas resolved different tiers (%s); all use tier fx",
                ", ".join(f"ordinal {i}: {t}" for i, t in enumerate(tiers)))
    return "fx"


def first_failure(failure: str) -> str:
    """Every replica's build outcome in one: the first failure (naming its ordinal), or ''."""
    for i, f in enumerate(_gather(failure)):
        if f:
            return f"on ordinal {i}: {f}"
    return ""


def agree_choice(choice: str) -> str:
    """Ordinal 0's choice, on every replica (the auto-tier trial: replicas must run the same tier)."""
    box = [choice]
    dist.broadcast_object_list(box, src=0)
    return box[0]
