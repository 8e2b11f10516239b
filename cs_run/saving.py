"""``cstorch.save``: the checkpoint format's save, where the run's strategy says who writes.

The checkpoint package (a leaf) writes whatever it is told to; who writes, and the whole form of a
sharded state, are the strategy's (:mod:`cs_run.parallel`), asked here, one layer up
(docs/architecture.md#layers).
"""

from __future__ import annotations

from typing import Any

from cs_run import parallel
from cs_run.checkpoint import h5

__all__ = ["save"]


def save(state_dict: Any, ckpt_path: h5.PathLike, *, compression: str | None = None,
         allow_pickle: bool = False) -> None:
    """:func:`cs_run.checkpoint.save` for a script that several replicas run: every replica calls it
    (a sharded state is gathered whole, a collective) and validates ``state_dict``, ordinal 0 alone
    writes the file (the replicas' gathered states are the same)."""
    strategy = parallel.current()
    h5.save(strategy.gather(state_dict), ckpt_path, compression=compression, allow_pickle=allow_pickle,
            write=strategy.writes)
