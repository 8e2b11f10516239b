"""What a run reports besides its log lines: scalar summaries in model_dir (throughput: cs_run.batches.RateMeter)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from cs_run import replicas
from cs_run.summaries import ScalarWriter

__all__ = ["Summaries"]


class Summaries:
    """One :class:`~cs_run.summaries.ScalarWriter` per split folder (``train``, ``eval``), opened on first use;
    written by ordinal 0 only when there are several replicas."""

    def __init__(self, model_dir: Path) -> None:
        self._model_dir = Path(model_dir)
        self._writers: dict[str, Any] = {}

    def add_scalars(self, split: str, scalars: Mapping[str, float], step: int, *, flush: bool = False) -> None:
        if not replicas.is_master():
            return
        if split not in self._writers:
            self._writers[split] = ScalarWriter(self._model_dir / split)
        self._writers[split].add_scalars(dict(scalars), step)
        if flush:
            self._writers[split].flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
