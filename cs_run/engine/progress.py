"""Compile feedback: a long compile is never silent (issue 16).

``compiling(...)`` logs one line when the compile starts and, from a daemon thread, one line every
``interval`` seconds with the elapsed time until it ends. The thread only logs; it touches no torch
state, so it is safe next to inductor's own worker threads.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Iterator

__all__ = ["compiling"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def compiling(what: str, interval: float = 5.0, log: logging.Logger = logger) -> Iterator[None]:
    """Logs ``what`` at the start and every ``interval`` seconds (with elapsed time) until the block ends."""
    done = threading.Event()
    t0 = time.perf_counter()
    log.info("compiling %s ...", what)

    def beat() -> None:
        while not done.wait(interval):
            log.info("still compiling %s (%.0fs elapsed)", what, time.perf_counter() - t0)

    thread = threading.Thread(target=beat, name="cs-run-compile-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
