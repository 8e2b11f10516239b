"""Scalar summaries of a run: a CSV always, TensorBoard event files when tensorboard is installed.

The runners write loss, learning rate, loss scale, throughput and eval metrics here, one writer per
folder (``model_dir/train``, ``model_dir/eval``). ``cs-run plot`` reads the CSVs back, so a run can
be looked at without TensorBoard.
"""

from __future__ import annotations

import csv
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cs_run.errors import CsRunError

__all__ = ["CSV_NAME", "ScalarWriter", "read_scalars"]

logger = logging.getLogger(__name__)

CSV_NAME = "scalars.csv"
_HEADER = ["step", "tag", "value", "wall_time"]


def _to_float(tag: str, value: Any) -> float:
    # A tensor here is a host read (sync point): call from a step closure or after the step.
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"ScalarWriter: value of {tag!r} must be a number or a one-element tensor, got {type(value).__name__}"
        ) from err


class ScalarWriter:
    """Appends ``(step, tag, value, wall_time)`` rows to ``log_dir/scalars.csv`` and, when the
    tensorboard package is importable, also to TensorBoard event files in ``log_dir``.

    Appending (not truncating) lets a resumed run continue the same file.

    Args:
        log_dir: Folder to write into (created if missing).
        tensorboard: True requires tensorboard, False never uses it, None (default) uses it when
            importable.
    """

    def __init__(
        self, log_dir: str | os.PathLike, tensorboard: bool | None = None
    ) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.log_dir / CSV_NAME
        is_new = not self.csv_path.exists() or self.csv_path.stat().st_size == 0
        self._file = open(self.csv_path, "a", newline="", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._csv = csv.writer(self._file)
        if is_new:
            self._csv.writerow(_HEADER)
        self._tb = self._open_tensorboard(tensorboard)

    def _open_tensorboard(self, wanted: bool | None) -> Any:
        if wanted is False:
            return None
        try:  # imported lazily: tensorboard is an optional extra and slow to import
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            if wanted:
                raise
            logger.debug("tensorboard is not installed: writing %s only", self.csv_path)
            return None
        return SummaryWriter(log_dir=str(self.log_dir))

    @property
    def writes_tensorboard(self) -> bool:
        return self._tb is not None

    def add_scalar(
        self, tag: str, value: Any, step: int, wall_time: float | None = None
    ) -> None:
        """Records one scalar (a number or a one-element tensor) at ``step``."""
        if self._file.closed:
            raise RuntimeError(f"ScalarWriter for {self.log_dir} is closed")
        value = _to_float(tag, value)
        wall_time = time.time() if wall_time is None else wall_time
        self._csv.writerow([int(step), tag, repr(value), f"{wall_time:.3f}"])
        if self._tb is not None:
            self._tb.add_scalar(tag, value, int(step), walltime=wall_time)

    def add_scalars(self, scalars: Mapping[str, Any], step: int) -> None:
        """Records several scalars at ``step`` (same wall time)."""
        now = time.time()
        for tag, value in scalars.items():
            self.add_scalar(tag, value, step, wall_time=now)

    def flush(self) -> None:
        self._file.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> ScalarWriter:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_scalars(log_dir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` from ``log_dir/scalars.csv`` (empty when there is none).

    Rows of a resumed run that repeat a step replace the earlier value; steps come back sorted.
    """
    path = Path(log_dir) / CSV_NAME
    if not path.exists():
        return {}
    series: dict[str, dict[int, float]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        try:
            for row in reader:
                try:
                    tag, step, value = row["tag"], int(row["step"]), float(row["value"])
                except (KeyError, TypeError, ValueError):
                    logger.warning("%s: skipping malformed row %r", path, row)
                    continue
                series.setdefault(tag, {})[step] = value
        except (UnicodeDecodeError, csv.Error) as e:  # a damaged or foreign file, not a traceback
            reason = f"byte 0x{e.object[e.start]:02x} is not UTF-8" if isinstance(e, UnicodeDecodeError) else str(e)
            raise CsRunError(f"{path} is not a scalars CSV written by cs-run ({reason}, after line "
                             f"{reader.line_num}); move it away or delete it") from None
    return {tag: sorted(points.items()) for tag, points in series.items() if points}
