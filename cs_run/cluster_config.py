"""The cluster options of a run (``cstorch.distributed.ClusterOptions``), in a module of their own.

They are the params files' runconfig keys and the run flags too (``cs_run.params.RunConfig`` embeds
them, :mod:`cs_run.frontends.flags` renders the flags), so reading a params file or ``cs-run --help`` must not
import what :mod:`cs_run.distributed` needs to run replicas (torch.distributed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ClusterOptions"]


@dataclass
class ClusterOptions:
    """The cluster options of a run, declared once: runconfig keys of the same names (``RunConfig`` embeds
    them), ``cs-run`` and run.py flags and the Trainer's CSX backend are all generated from these fields
    (see :mod:`cs_run.frontends.flags`). Field order and defaults are the vendor's ``ClusterConfig``'s."""

    num_csx: int = field(default=1, metadata={"min": 1, "flag": {}})
    """Data-parallel replicas, one process each (launched here, or joined under torchrun); batch sizes
    in the params are the global batch, split evenly over them."""
    max_wgt_servers: int = field(default=24, metadata={"min": 1, "flag": {}, "appliance_only": True})
    """Weight servers (appliance only)."""
    max_act_per_csx: int = field(default=1, metadata={"min": 1, "flag": {}, "appliance_only": True})
    """Activation servers per system (appliance only)."""
    num_workers_per_csx: int = field(default=1, metadata={"min": 1, "flag": {}})
    """Input workers per replica: with more than one, each is a process calling the data function with its
    own streaming rank (docs/architecture.md#streaming-workers)."""
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
