"""What a run reports besides its log lines: throughput and scalar summaries in model_dir."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

__all__ = ["RateMeter", "Summaries"]


class RateMeter:
    """Samples/sec over the last log interval (Rate) and since the run started (GlobalRate)."""

    def __init__(self) -> None:
        self._start = self._mark = time.perf_counter()
        self._total = self._since_mark = 0

    def add(self, samples: int) -> None:
        self._total += samples
        self._since_mark += samples

    def rate(self) -> float:
        """Rate since the previous call (each log step), then start a new interval."""
        now = time.perf_counter()
        rate = self._since_mark / max(now - self._mark, 1e-9)
        self._mark, self._since_mark = now, 0
        return rate

    def global_rate(self) -> float:
        return self._total / max(time.perf_counter() - self._start, 1e-9)


class Summaries:
    """One :class:`~cs_run.summaries.ScalarWriter` per split folder (``train``, ``eval``), opened on first use."""

    def __init__(self, model_dir: Path) -> None:
        self._model_dir = Path(model_dir)
        self._writers: dict[str, Any] = {}

    def add_scalars(self, split: str, scalars: Mapping[str, float], step: int, *, flush: bool = False) -> None:
        if split not in self._writers:
            from cs_run.summaries import ScalarWriter

            self._writers[split] = ScalarWriter(self._model_dir / split)
        self._writers[split].add_scalars(dict(scalars), step)
        if flush:
            self._writers[split].flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
