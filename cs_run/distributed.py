"""Cluster configuration and the streaming topology (``cstorch.distributed``).

cs-run runs one process per replica: ``num_csx = N`` is N data-parallel processes on
``torch.distributed``, launched by cs-run itself or by ``torchrun`` (:mod:`cs_run.replicas`,
docs/architecture.md#replicas). The helpers below read the process group when one is initialised,
else the ``RANK`` / ``WORLD_SIZE`` environment variables, else a single process.

``num_workers_per_csx = W`` is the number of input workers per replica. With ``W = 1`` the replica
process itself streams (it calls the ``input_fn``); with ``W > 1`` each of W worker processes calls the
``input_fn`` (see docs/architecture.md#streaming-workers). The streaming topology is the vendor's: the
``N x W`` streamers are numbered replica-major, worker ``w`` of replica ``r`` has streaming rank
``r * W + w``, and every streamer yields whole per-replica batches (``get_streaming_batch_size``), the
replica's step ``k`` taking its batch from worker ``k % W``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields
from typing import Any, Iterator

from cs_run import replicas
from cs_run.cluster_config import ClusterOptions

__all__ = [
    "ClusterConfig",
    "ClusterOptions",
    "DataLoaderCheckpoint",
    "get_worker_state",
    "num_workers_per_csx",
    "set_num_workers_per_csx",
    "streaming_worker",
    "num_streamers",
    "get_streaming_rank",
    "get_streaming_batch_size",
    "get_ordinal",
    "get_world_size",
    "is_master_ordinal",
    "is_streamer",
    "num_tasks",
]


@dataclass
class ClusterConfig(ClusterOptions):
    """The cluster a run uses (fields and defaults of the vendor's ``ClusterConfig`` / ``configure``).

    Fields that only mean something on the vendor's appliance (weight/activation servers, transfer
    processes, mounts, labels, the management connection) are kept so configs and scripts run unchanged;
    they do not change what cs-run does.
    """

    mgmt_address: str | None = None
    """Address of the appliance's management service (appliance only)."""
    credentials_path: str | None = None
    """TLS credentials for the management service (appliance only)."""
    job_time_sec: int | None = None
    """Time limit of the appliance job (appliance only)."""
    disable_version_check: bool = False
    """Skip the appliance's software version check (appliance only)."""

    def __post_init__(self) -> None:
        for f in fields(ClusterOptions):
            value = getattr(self, f.name)
            if "min" in f.metadata and (not isinstance(value, int) or isinstance(value, bool)
                                        or value < f.metadata["min"]):
                raise ValueError(f"Invalid ClusterConfig.{f.name}: {value!r} (must be an integer >= 1)")
            if f.default_factory is list:
                setattr(self, f.name, [] if value is None else [str(v) for v in value])
        for label in self.job_labels:
            if "=" not in label:
                raise ValueError(f"Invalid job label {label!r}: expected 'key=value'")


def get_world_size() -> int:
    """Number of replica processes."""
    if _REPLICA is not None:  # an input worker process: the replica it was started for
        return _REPLICA[1]
    return replicas.world_size()


def get_ordinal() -> int:
    """This process's replica index (0-based)."""
    if _REPLICA is not None:
        return _REPLICA[0]
    return replicas.ordinal()


def is_master_ordinal(local: bool = False) -> bool:
    """True on the process that writes checkpoints and logs (ordinal 0). ``local`` is the vendor's
    (XLA-compatible) argument; with one host it means the same."""
    return replicas.is_master()


def num_tasks() -> int:
    """Number of tasks (processes) of the job."""
    return get_world_size()


# The streaming topology of this process: W (the run's num_workers_per_csx) and, inside an input worker
# (or while the replica builds a worker's loader for its length and first state), that worker's local id.
_WORKERS_PER_CSX = 1
_LOCAL_WORKER: int | None = None
_REPLICA: tuple[int, int] | None = None  # (ordinal, world size) a worker process was started for


def _check_workers(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"Invalid num_workers_per_csx: {value!r} (must be an integer >= 1)")
    return value


def set_num_workers_per_csx(value: int) -> None:
    """Set this process's input workers per replica (the run's ``num_workers_per_csx``): the runners and
    :class:`cs_run.backend.Backend` call it, so :func:`num_streamers` is right everywhere."""
    global _WORKERS_PER_CSX
    _WORKERS_PER_CSX = _check_workers(value)


def num_workers_per_csx() -> int:
    """Input workers per replica (1 unless the run's ``num_workers_per_csx`` says otherwise)."""
    return _WORKERS_PER_CSX


@contextlib.contextmanager
def streaming_worker(local_id: int, workers_per_csx: int, replica: tuple[int, int] | None = None) -> Iterator[None]:
    """Inside the block this process is input worker ``local_id`` of its replica (of ``workers_per_csx``):
    :func:`get_streaming_rank` returns ``ordinal * workers_per_csx + local_id``. A worker process enters it
    for its whole life, with ``replica`` = the (ordinal, world size) of the replica that started it; the
    replica enters it while it builds a copy of a worker's loader."""
    global _LOCAL_WORKER, _WORKERS_PER_CSX, _REPLICA
    _check_workers(workers_per_csx)
    if not 0 <= local_id < workers_per_csx:
        raise ValueError(f"Invalid local worker id {local_id} (must be in [0, {workers_per_csx}))")
    saved = _LOCAL_WORKER, _WORKERS_PER_CSX, _REPLICA
    _LOCAL_WORKER, _WORKERS_PER_CSX = local_id, workers_per_csx
    _REPLICA = replica if replica is not None else _REPLICA
    try:
        yield
    finally:
        _LOCAL_WORKER, _WORKERS_PER_CSX, _REPLICA = saved


def is_streamer() -> bool:
    """True on a process that runs the input pipeline: an input worker, or the replica itself when it has
    one worker (``num_workers_per_csx = 1``). With more workers the replica only assembles their batches."""
    return _LOCAL_WORKER is not None or _WORKERS_PER_CSX == 1


def num_streamers() -> int:
    """Number of input streams of the job: ``num_csx x num_workers_per_csx``."""
    return get_world_size() * _WORKERS_PER_CSX


def get_streaming_rank() -> int:
    """Index of this input stream among :func:`num_streamers` (``ordinal * W + local worker id``), for
    sharding the data in an ``input_fn``.

    Raises:
        RuntimeError: called on a replica that has several input workers, outside its workers (the vendor
            asserts the same: only streamers have a streaming rank).
    """
    if not is_streamer():
        raise RuntimeError(f"get_streaming_rank() was called on replica {get_ordinal()}, which streams through "
                           f"{_WORKERS_PER_CSX} input workers and has no streaming rank itself; call it inside "
                           "the input_fn (each worker runs it with its own rank)")
    return get_ordinal() * _WORKERS_PER_CSX + (_LOCAL_WORKER or 0)


def get_streaming_batch_size(effective_batch_size: int, global_rank: int | None = None) -> int:
    """The per-replica batch size every streamer yields: ``effective_batch_size / num_csx`` (the vendor's
    per-box batch size, :func:`cs_run.replicas.split_batch`; the W workers of a replica take turns, each
    yielding whole batches), equal for every rank here, so ``global_rank``, the vendor's argument, does
    not change it.

    Raises:
        ValueError: the effective batch size does not split evenly over the replicas.
    """
    return replicas.split_batch(effective_batch_size, get_world_size())

@dataclass
class DataLoaderCheckpoint:
    """What an input worker knows about itself when its loader's ``state_dict`` is called (the vendor's
    ``DataLoaderCheckpoint``; read it with :func:`get_worker_state`). The counters start at 0 each time
    the workers start (a new run, a resume, a new epoch: see docs/architecture.md#streaming-workers)."""

    local_worker_id: int
    num_workers_per_csx: int
    num_csx: int
    wse_id: int
    appliance_step: int
    """Replica steps streamed since the workers started."""
    worker_step: int
    """Batches this worker yielded since it started."""
    samples_streamed: int
    """Samples in those batches."""
    user_state_dict: dict[str, Any] | None = None

    @property
    def global_worker_id(self) -> int:
        """The worker's streaming rank."""
        return self.wse_id * self.num_workers_per_csx + self.local_worker_id

    @property
    def total_num_workers(self) -> int:
        return self.num_workers_per_csx * self.num_csx


_WORKER_STATE: DataLoaderCheckpoint | None = None


@contextlib.contextmanager
def _worker_state(state: DataLoaderCheckpoint) -> Iterator[None]:
    """Makes ``state`` what :func:`get_worker_state` returns (once) inside the block."""
    global _WORKER_STATE
    _WORKER_STATE = state
    try:
        yield
    finally:
        _WORKER_STATE = None


def get_worker_state() -> DataLoaderCheckpoint:
    """This input worker's :class:`DataLoaderCheckpoint`; valid once, inside a restartable loader's
    ``state_dict`` (the vendor's rule).

    Raises:
        RuntimeError: called anywhere else, or twice in one ``state_dict``.
    """
    global _WORKER_STATE
    state, _WORKER_STATE = _WORKER_STATE, None
    if state is None:
        raise RuntimeError("Unable to fetch the input worker's state: cstorch.distributed.get_worker_state() must "
                           "be called once, inside your dataloader's implementation of `state_dict`")
    return state
