"""What a run reports besides its log lines: scalar summaries in model_dir (throughput: cs_run.batches.RateMeter)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from cs_run import replicas
from cs_run.summaries import ScalarWriter
from cs_run.tracing import step_closure

__all__ = ["SparsityLog", "Summaries"]


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


class SparsityLog:
    """The vendor's ``LogSparsity``: each update's target level (``sparsity/<weights>*/target``) and each
    mask's actual sparsity (``sparsity/<weight>/actual``), from the algorithm's hooks through a step
    closure (a traced step's values are read after it runs); the latest values go into the train
    summaries on log steps."""

    def __init__(self, sparsity: Any) -> None:
        self.latest: dict[str, float] = {}
        record = step_closure(self._record)
        sparsity.register_target_sparsity_hook(lambda _, name, target: record(f"sparsity/{name}/target", target))
        sparsity.register_computed_sparsity_hook(lambda _, name, actual: record(f"sparsity/{name}/actual", actual))

    def _record(self, tag: str, value: Any) -> None:
        self.latest[tag] = float(value)
