"""Scalar summaries of a run: a CSV always, TensorBoard event files when tensorboard is installed.

The runners write loss, learning rate, loss scale, throughput and eval metrics here, one writer per
folder (``model_dir/train``, ``model_dir/eval``). ``cs-run plot`` reads the CSVs back, so a run can
be looked at without TensorBoard.

CSV columns: ``step, tag, value, wall_time, run``. ``run`` names the process that wrote the row
(:data:`RUN_ID`, the same in every folder a process writes), so a reader can tell the invocations that
appended to one file apart: a resume, a restart from an earlier checkpoint, an eval run. Files written
before the column existed keep their four columns when appended to.
"""

from __future__ import annotations

import csv
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from cs_run.errors import CsRunError

__all__ = ["CSV_NAME", "RUN_ID", "ScalarRow", "ScalarWriter", "read_scalar_rows", "read_scalars"]

logger = logging.getLogger(__name__)

CSV_NAME = "scalars.csv"
_HEADER = ["step", "tag", "value", "wall_time", "run"]

RUN_ID = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
"""This process's run id, the ``run`` column of every row it writes (a start time and the pid)."""


class ScalarRow(NamedTuple):
    """One row of a scalars CSV; ``run`` is "" in files written before the column existed."""

    step: int
    tag: str
    value: float
    wall_time: float
    run: str


def _to_float(tag: str, value: Any) -> float:
    # A tensor here is a host read (sync point): call from a step closure or after the step.
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"ScalarWriter: value of {tag!r} must be a number or a one-element tensor, got {type(value).__name__}"
        ) from err


def _leave_writer_thread_errors_to_the_run() -> None:
    """tensorboard's event-file thread keeps a write error (model_dir made read-only or full mid-run) for
    the run's next write, flush or close to raise, and then re-raises it in the thread, whose traceback
    the default ``threading.excepthook`` printed before the run's one ``Error:`` line. That second report
    is left out; every other thread's exceptions go to the hook as before."""
    previous = threading.excepthook
    if getattr(previous, "cs_run_tensorboard", False):
        return

    def hook(args: Any) -> None:
        if getattr(args.thread, "exception", None) is args.exc_value and \
                type(args.thread).__module__.startswith("tensorboard."):
            return
        previous(args)

    hook.cs_run_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


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
        # An older four-column file keeps its layout: a row wider than its header would misalign readers.
        self._with_run = is_new or "run" in _header_of(self.csv_path)
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
        _leave_writer_thread_errors_to_the_run()
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
        row = [int(step), tag, repr(value), f"{wall_time:.3f}"]
        self._csv.writerow([*row, RUN_ID] if self._with_run else row)
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


def _header_of(path: Path) -> list[str]:
    with open(path, "rb") as f:
        return f.readline().decode("utf-8", errors="replace").strip().split(",")


def read_scalar_rows(log_dir: str | os.PathLike) -> list[ScalarRow]:
    """Every row of ``log_dir/scalars.csv`` in the order written (empty when there is none).

    Raises:
        CsRunError: the file is not a CSV (not UTF-8, or broken quoting); malformed rows are skipped
            with a warning.
    """
    path = Path(log_dir) / CSV_NAME
    if not path.exists():
        return []
    rows: list[ScalarRow] = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        try:
            for row in reader:
                try:
                    wall = row.get("wall_time")
                    rows.append(ScalarRow(int(row["step"]), row["tag"], float(row["value"]),
                                          float(wall) if wall else math.nan, row.get("run") or ""))
                except (KeyError, TypeError, ValueError):
                    logger.warning("%s: skipping malformed row %r", path, row)
        except (UnicodeDecodeError, csv.Error) as e:  # a damaged or foreign file, not a traceback
            reason = f"byte 0x{e.object[e.start]:02x} is not UTF-8" if isinstance(e, UnicodeDecodeError) else str(e)
            raise CsRunError(f"{path} is not a scalars CSV written by cs-run ({reason}, after line "
                             f"{reader.line_num}); move it away or delete it") from None
    return rows


def read_scalars(log_dir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` from ``log_dir/scalars.csv`` (empty when there is none).

    Rows of a resumed run that repeat a step replace the earlier value; steps come back sorted.
    """
    series: dict[str, dict[int, float]] = {}
    for row in read_scalar_rows(log_dir):
        series.setdefault(row.tag, {})[row.step] = row.value
    return {tag: sorted(points.items()) for tag, points in series.items() if points}
