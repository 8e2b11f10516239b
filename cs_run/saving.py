"""``cstorch.save``: the checkpoint format's save, where ordinal 0 of several replicas writes.

The checkpoint package (a leaf) writes whatever it is told to; who writes is decided here, one layer up,
where the replicas are known (docs/architecture.md#layers).
"""

from __future__ import annotations

from typing import Any

from cs_run import replicas
from cs_run.checkpoint import h5

__all__ = ["save"]


def save(state_dict: Any, ckpt_path: h5.PathLike, *, compression: str | None = None,
         allow_pickle: bool = False) -> None:
    """:func:`cs_run.checkpoint.save` for a script that several replicas run: every replica validates
    ``state_dict``, ordinal 0 alone writes the file (the replicas' states are the same)."""
    h5.save(state_dict, ckpt_path, compression=compression, allow_pickle=allow_pickle, write=replicas.is_master())
