"""Console and run-log handlers: log lines print above tqdm bars, and model_dir/run.log keeps them.

A params load's notes (:func:`defer`) belong to that load: they are kept with its Params and logged by
each run that uses those params, when its log opens; another load's run never sees them.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from pathlib import Path
from typing import Iterable, Iterator

from tqdm import tqdm

_BAR_LOCK = threading.RLock()
"""The threads of this process writing log lines. Not tqdm's own lock: that one is a multiprocessing
semaphore shared with forked children, so a child killed inside a log line (SIGKILL mid-save) would hold it
forever and the parent's next log line would wait on it for ever."""

_FORMAT = "%(asctime)s %(levelname)s: %(message)s"
_DATEFMT = "%Y-%m-%d %H:%M:%S"


class _TqdmHandler(logging.Handler):
    """Writes through tqdm so a log line never tears a progress bar.

    The stream is looked up per record, so a redirected ``sys.stderr`` (tests, notebooks) is honoured.
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            with _BAR_LOCK:
                with tqdm.external_write_mode(file=sys.stderr, nolock=True):
                    sys.stderr.write(self.format(record) + "\n")
        except Exception:  # logging must never take a run down
            self.handleError(record)


def setup_console_logging(level: str = "INFO") -> None:
    """Used by the CLI only: a library does not configure logging for its caller.

    Python warnings (a recompile, a frozen Python value) become log lines too, so they share the
    format, the progress-bar handling and model_dir/run.log.
    """
    logging.captureWarnings(True)
    for name in ("cs_run", "py.warnings"):
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if not any(isinstance(h, _TqdmHandler) for h in logger.handlers):
            handler = _TqdmHandler()
            handler.setFormatter(logging.Formatter(_FORMAT, _DATEFMT))
            logger.addHandler(handler)


Note = tuple[str, str]
"""(logger name, message): an INFO line a run logs when its log opens."""

_LOADS: list[list[Note]] = []  # the notes of the params loads in progress, innermost last


@contextlib.contextmanager
def collecting_notes() -> Iterator[list[Note]]:
    """A params load: inside the block :func:`defer` adds to the yielded list (the load's own notes)."""
    notes: list[Note] = []
    _LOADS.append(notes)
    try:
        yield notes
    finally:
        _LOADS.remove(notes)


def defer(logger_name: str, message: str) -> None:
    """An INFO line from a params load, before logging is set up: a note of the load in progress, which
    the runs of its params log when their log opens (once per load); outside a load it is logged now."""
    if not _LOADS:
        logging.getLogger(logger_name).info("%s", message)
    elif (logger_name, message) not in _LOADS[-1]:
        _LOADS[-1].append((logger_name, message))


class RunLog:
    """model_dir/run.log while a run holds it: every cs_run log record, plus :meth:`write` for the lines
    the console shows by other means (the ``Error:`` line an entry point prints after the run)."""

    def __init__(self, path: Path, handler: logging.Handler) -> None:
        self.path, self._handler = path, handler

    def write(self, level: int, text: str) -> None:
        """Into run.log only (the console shows ``text`` by itself)."""
        record = logging.LogRecord("cs_run", level, __file__, 0, "%s", (text,), None)
        self._handler.handle(record)


_LOGGERS = ("cs_run", "py.warnings")  # what run.log keeps


def _attach(handler: logging.Handler, level: str) -> list[logging.Logger]:
    """``handler`` on the loggers run.log keeps, each passing at least ``level``."""
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
        if logger.level == logging.NOTSET or logger.level > logging.getLevelName(level):
            logger.setLevel(level)
    return loggers


class _Hold(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def held_records(level: str = "INFO") -> Iterator[list[logging.LogRecord]]:
    """The log records of a run's checks before its model_dir is opened (a data function's lines), kept
    for :func:`run_log` to begin run.log with; the console shows them as they come."""
    hold = _Hold()
    hold.setLevel(level)
    loggers = _attach(hold, level)
    try:
        yield hold.records
    finally:
        for logger in loggers:
            logger.removeHandler(hold)


@contextlib.contextmanager
def run_log(model_dir: str | Path, level: str = "INFO", notes: Iterable[Note] = (),
            earlier: Iterable[logging.LogRecord] = ()) -> Iterator[RunLog]:
    """Append every cs_run log record of the block to ``model_dir/run.log``, first the run's ``notes``
    (its params load's: ``Params.notes``), then the ``earlier`` records (:func:`held_records`)."""
    path = Path(model_dir) / "run.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter(_FORMAT, _DATEFMT))
    loggers = _attach(handler, level)
    for name, message in notes:
        logging.getLogger(name).info("%s", message)
    for record in earlier:  # the console showed them when they came
        handler.handle(record)
    try:
        yield RunLog(path, handler)
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
        handler.close()
