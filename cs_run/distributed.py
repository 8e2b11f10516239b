"""Cluster configuration and the streaming topology (``cstorch.distributed``).

cs-run runs one process per replica: ``num_csx = N`` is N data-parallel processes on
``torch.distributed``, launched by cs-run itself or by ``torchrun`` (:mod:`cs_run.replicas`,
docs/architecture.md#replicas). The helpers below read the process group when one is initialised,
else the ``RANK`` / ``WORLD_SIZE`` environment variables, else a single process.
``num_workers_per_csx`` is the number of input workers per replica (one here: each process builds its
own DataLoader by calling the ``input_fn``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from cs_run import replicas

__all__ = [
    "ClusterConfig",
    "ClusterOptions",
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
class ClusterOptions:
    """The cluster options of a run, declared once: runconfig keys of the same names (``RunConfig`` embeds
    them), ``cs-run`` and run.py flags and the Trainer's CSX backend are all generated from these fields
    (see :mod:`cs_run.options`). Field order and defaults are the vendor's ``ClusterConfig``'s."""

    num_csx: int = field(default=1, metadata={"min": 1, "flag": {}})
    """Data-parallel replicas, one process each (launched here, or joined under torchrun); batch sizes
    in the params are the global batch, split evenly over them."""
    max_wgt_servers: int = field(default=24, metadata={"min": 1, "flag": {}, "appliance_only": True})
    """Weight servers (appliance only)."""
    max_act_per_csx: int = field(default=1, metadata={"min": 1, "flag": {}, "appliance_only": True})
    """Activation servers per system (appliance only)."""
    num_workers_per_csx: int = field(default=1, metadata={"min": 1, "flag": {}, "appliance_only": True})
    """Input streaming workers per system; locally the train loader's own num_workers apply."""
    transfer_processes: int = field(default=5, metadata={"min": 1, "flag": {}, "appliance_only": True})
    """Processes moving data to and from the appliance (appliance only)."""
    mount_dirs: list[str] = field(default_factory=list, metadata={"flag": {}, "appliance_only": True})
    """Folders mounted into the appliance's pods (appliance only; local folders are visible anyway)."""
    python_paths: list[str] = field(default_factory=list, metadata={"flag": {"path": "dir"}})
    """Folders put on sys.path before model and data functions are imported."""
    job_labels: list[str] = field(default_factory=list, metadata={"flag": {"metavar": "KEY=VALUE"},
                                                                  "appliance_only": True})
    """key=value labels of the appliance job (appliance only)."""
    collective_timeout: int = field(default=600, metadata={"min": 1, "flag": {}})
    """Seconds a replica waits in a collective (the gradient all-reduce) for the others before the job
    fails: the bound on how long a dead or stuck replica can hold up the rest."""


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
    return replicas.world_size()


def get_ordinal() -> int:
    """This process's replica index (0-based)."""
    return replicas.ordinal()


def is_master_ordinal(local: bool = False) -> bool:
    """True on the process that writes checkpoints and logs (ordinal 0). ``local`` is the vendor's
    (XLA-compatible) argument; with one host it means the same."""
    return replicas.is_master()


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
    """The batch a replica's input streams, for the global ``effective_batch_size`` (the vendor's rule:
    :func:`cs_run.replicas.split_batch`; equal for every rank here, so ``global_rank``, the vendor's
    argument, does not change it).

    Raises:
        ValueError: the effective batch size does not split evenly over the replicas.
    """
    return replicas.split_batch(effective_batch_size, get_world_size())
