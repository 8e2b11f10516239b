"""``cstorch.utils.tensorboard``: the vendor's SummaryWriter / SummaryReader over cs-run's summaries.

Scalars go to ``log_dir/scalars.csv`` (and TensorBoard event files when the tensorboard package is
installed, see :class:`cs_run.summaries.ScalarWriter`); the reader reads them back. Only scalars are
supported: tensors, histograms and images are not written here.
"""

from __future__ import annotations

import re
from collections import namedtuple
from pathlib import Path
from typing import Any, Optional

from cs_run.summaries import ScalarWriter, read_scalars
from cs_run.tracing import step_closure

__all__ = ["ScalarEvent", "SummaryReader", "SummaryWriter", "pop_summarized_scalars", "summarize_scalar"]

ScalarEvent = namedtuple("ScalarEvent", ["wall_time", "step", "value"])

_SUMMARIZED: dict[str, float] = {}


@step_closure
def _record_scalar(name: str, value: Any) -> None:
    _SUMMARIZED[name] = float(value)  # host read, after the step (a traced step's values are ready)


def summarize_scalar(name: str, value: Any) -> None:
    """The Model Zoo's ``summarize_scalar``: a model's scalar of this train step, written by the runner into
    model_dir/train under ``name`` on log steps (the latest step's value), beside the loss."""
    _record_scalar(name, value.detach() if hasattr(value, "detach") else value)


def pop_summarized_scalars() -> dict[str, float]:
    """The scalars summarized since the last call (the latest value of each), for the runner to write."""
    out = dict(_SUMMARIZED)
    _SUMMARIZED.clear()
    return out


class SummaryWriter:
    """Writes scalars of a run (``add_scalar(tag, value, global_step)``), the vendor's signature.

    Args:
        log_dir: first positional argument or keyword, as torch's SummaryWriter (default ``runs``).
        base_step: the step a scalar written without ``global_step`` gets.
    """

    def __init__(self, *args: Any, base_step: int = 1, **kwargs: Any) -> None:
        log_dir = args[0] if args else kwargs.pop("log_dir", None)
        self.log_dir = str(log_dir or "runs")
        self.base_step = base_step
        self._writer = ScalarWriter(self.log_dir)

    def add_scalar(self, tag: str, scalar_value: Any, global_step: Optional[int] = None,
                   walltime: Optional[float] = None) -> None:
        step = self.base_step if global_step is None else global_step
        self._writer.add_scalar(tag, scalar_value, step, wall_time=walltime)

    def add_scalars(self, main_tag: str, tag_scalar_dict: dict, global_step: Optional[int] = None) -> None:
        step = self.base_step if global_step is None else global_step
        self._writer.add_scalars({f"{main_tag}/{k}": v for k, v in tag_scalar_dict.items()}, step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SummaryReader:
    """Reads scalars written by :class:`SummaryWriter` (or a cs-run run's ``model_dir/train``).

    Args:
        log_dirs: a folder or a list of folders.
        filter: a regular expression; only matching scalar names are read.
    """

    def __init__(self, log_dirs: Any, filter: Optional[str] = None, **kwargs: Any) -> None:  # noqa: A002
        dirs = [log_dirs] if isinstance(log_dirs, (str, Path)) else list(log_dirs)
        pattern = re.compile(filter) if filter else None
        self._scalars: dict[str, list[ScalarEvent]] = {}
        for folder in dirs:
            for tag, rows in read_scalars(folder).items():
                if pattern is None or pattern.search(tag):
                    self._scalars.setdefault(tag, []).extend(ScalarEvent(None, s, v) for s, v in rows)

    def scalar_names(self) -> set[str]:
        return set(self._scalars)

    def read_scalar(self, name: str, step: Optional[int] = None) -> Any:
        """Every event of scalar ``name``, or its event at ``step``."""
        if name not in self._scalars:
            raise RuntimeError(f"Could not find scalar {name}. Valid scalar names:\n{sorted(self._scalars)}")
        if step is None:
            return list(self._scalars[name])
        for event in self._scalars[name]:
            if event.step == step:
                return event
        raise KeyError(f"Could not find scalar {name} at step {step}")

    Scalars = read_scalar
