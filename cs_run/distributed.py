"""Cluster configuration and the streaming topology (``cstorch.distributed``).

cs-run runs one process per replica. ``num_csx > 1`` maps onto ``torch.distributed`` (one process
per replica, launched e.g. with ``torchrun``); the helpers below read the process group when one is
initialised, else the ``RANK`` / ``WORLD_SIZE`` environment variables, else a single process.
``num_workers_per_csx`` is the number of input workers per replica (one here: each process builds its
own DataLoader by calling the ``input_fn``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

__all__ = [
    "ClusterConfig",
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
class ClusterConfig:
    """The cluster a run uses (fields and defaults of the vendor's ``ClusterConfig`` / ``configure``).

    Fields that only mean something on the vendor's appliance (weight/activation servers, transfer
    processes, mounts, labels) are kept so configs and scripts run unchanged; they do not change what
    cs-run does.
    """

    num_csx: int = 1
    max_wgt_servers: int = 24
    max_act_per_csx: int = 1
    num_workers_per_csx: int = 1
    transfer_processes: int = 5
    mount_dirs: list[str] = field(default_factory=list)
    python_paths: list[str] = field(default_factory=list)
    job_labels: list[str] = field(default_factory=list)
    mgmt_address: str | None = None
    credentials_path: str | None = None
    job_time_sec: int | None = None
    disable_version_check: bool = False

    def __post_init__(self) -> None:
        for name in ("num_csx", "max_wgt_servers", "max_act_per_csx", "num_workers_per_csx", "transfer_processes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Invalid ClusterConfig.{name}: {value!r} (must be an integer >= 1)")
        for name in ("mount_dirs", "python_paths", "job_labels"):
            value = getattr(self, name)
            setattr(self, name, [] if value is None else [str(v) for v in value])
        for label in self.job_labels:
            if "=" not in label:
                raise ValueError(f"Invalid job label {label!r}: expected 'key=value'")


def _dist_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def get_world_size() -> int:
    """Number of replica processes."""
    if _dist_ready():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def get_ordinal() -> int:
    """This process's replica index (0-based)."""
    if _dist_ready():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_master_ordinal(local: bool = False) -> bool:
    """True on the process that writes checkpoints and logs (ordinal 0). ``local`` is the vendor's
    (XLA-compatible) argument; with one host it means the same."""
    return get_ordinal() == 0


def num_tasks() -> int:
    """Number of tasks (processes) of the job."""
    return get_world_size()


def is_streamer() -> bool:
    """True on a process that runs the input pipeline: every process here (each streams its own shard)."""
    return True


def num_streamers() -> int:
    """Number of input streams: one per replica process."""
    return get_world_size()


def get_streaming_rank() -> int:
    """Index of this process's input stream, for sharding the data in an ``input_fn``."""
    return get_ordinal()


def get_streaming_batch_size(effective_batch_size: int, global_rank: int | None = None) -> int:
    """Per-stream batch size for a global ``effective_batch_size`` (equal for every rank here, so
    ``global_rank``, the vendor's argument, does not change it).

    Raises:
        ValueError: the effective batch size does not split evenly over the streamers.
    """
    n = num_streamers()
    if effective_batch_size < 1 or effective_batch_size % n:
        raise ValueError(f"Invalid effective batch size {effective_batch_size}: must be a positive multiple of "
                         f"the number of streamers ({n})")
    return effective_batch_size // n
