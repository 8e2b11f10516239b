"""The Model Zoo 1.x ``modelzoo.common.pytorch.cb_model`` helpers a data or model function calls.

Locally there is one process and one input stream; CSX means the current backend is the CSX engine
(which plays the appliance's part, so ``is_appliance()`` agrees with ``use_cs()``).
"""

from __future__ import annotations

from cs_run.backend import use_cs
from cs_run.distributed import (
    get_ordinal,
    get_streaming_rank,
    get_world_size,
    is_master_ordinal,
    is_streamer,
    num_streamers,
    num_tasks,
)

__all__ = ["get_ordinal", "get_streaming_rank", "get_world_size", "is_appliance", "is_master_ordinal", "is_streamer",
           "is_sync_mode", "num_streamers", "num_tasks", "rendezvous", "use_cs"]


def is_appliance() -> bool:
    """True on CSX: the 1.x appliance flow is the CSX flow here."""
    return use_cs()


def is_sync_mode() -> bool:
    """The 1.x multi-process pipeline mode: never, locally."""
    return False


def rendezvous(tag: str = "") -> None:
    """Wait for every process of the job: one process here, so it returns at once."""
    return None
