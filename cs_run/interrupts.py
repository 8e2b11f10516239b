"""Ctrl-C and SIGTERM that keep the work (docs/architecture.md#interrupts).

While a training loop runs inside :func:`stop_on_signal`, the first SIGINT or SIGTERM only sets a flag:
the loop finishes its current step, writes a checkpoint (atomically, as every checkpoint) and raises
:class:`Interrupted` (the runners' loop; the ``DataExecutor`` of a custom loop makes its step a
checkpoint step, so the loop's checkpoint closures save it). A second signal raises :class:`Aborted` at once, wherever the loop is; a
checkpoint being written then is abandoned as a temporary file, so the last complete checkpoint stays
as it was. Exit codes are the shell's: 130 for SIGINT, 143 for SIGTERM.

Python runs a signal's handler only when the main thread runs Python code, not while it waits inside a
C++ call (a collective whose peers are gone, a compiled step). So a watchdog thread hears the signals too
(Python's wakeup fd, written by the C-level handler): a second signal that has not ended the process
within ``ABORT_WAIT`` seconds, or a first one ``grace`` seconds old, ends it at once with one line.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

__all__ = ["ABORT_WAIT", "Aborted", "Interrupted", "StopFlag", "stop_on_signal"]

ABORT_WAIT = 10.0  # seconds a second signal leaves the process to stop by itself (Aborted) before it is ended
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


class Interrupted(KeyboardInterrupt):
    """The loop stopped on a signal after a whole step and saved it (a ``KeyboardInterrupt``, so code that
    catches ``Exception`` lets it through, as it does a plain Ctrl-C)."""

    def __init__(self, signum: int, step: int, checkpoint: Optional[Path], saved: str = "") -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + signum
        saved = saved or (f"checkpoint {checkpoint}; rerun to resume" if checkpoint is not None else "no checkpoint")
        super().__init__(f"interrupted ({_NAMES.get(signum, signum)}) at step {step}; {saved}")


class Aborted(KeyboardInterrupt):
    """A second signal: stopped at once, mid-step; model_dir keeps its last complete checkpoint."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"aborted by a second {_NAMES.get(signum, signum)}; the step in flight and any checkpoint "
                         "being written are lost, the last complete checkpoint is kept; rerun to resume from it")


class StopFlag:
    """Set by the first signal; the loop polls :attr:`signum` between steps (no cost per step)."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, _frame: object) -> None:
        if self.signum is not None:
            raise Aborted(signum)
        self.signum = signum


_ACTIVE: list[StopFlag] = []


Report = Callable[[str, int], None]


def _print_line(line: str, exit_code: int) -> None:
    os.write(2, f"Error: {line}\n".encode())


def _end_process(signum: int, why: str, report: Report) -> None:
    """Ends the process now (no cleanup can hang it), after one line; a checkpoint being written stays a
    temporary file (checkpoints are written atomically)."""
    with contextlib.suppress(Exception):
        report(f"{why}; ended at once, the last complete checkpoint is kept; rerun to resume from it", 128 + signum)
    os._exit(128 + signum)


def _watch(read_fd: int, grace: Optional[float], report: Report, done: threading.Event) -> None:
    """The watchdog: counts the signals the C-level handler reports on ``read_fd`` (one byte each) and ends
    the process when a second one, or the first one's grace period, has not. Returns when the fd closes
    or the block has ended (``done``)."""
    with open(read_fd, "rb", buffering=0, closefd=True) as pipe:
        _count(pipe.fileno(), grace, report, done)


def _count(read_fd: int, grace: Optional[float], report: Report, done: threading.Event) -> None:
    first: Optional[tuple[int, float]] = None
    while True:
        if first is not None and grace is not None:
            left = first[1] + grace - time.monotonic()
            if left <= 0:
                if done.is_set():
                    return
                _end_process(first[0], f"still running {grace:g} s after {_NAMES[first[0]]}", report)
            ready, _, _ = select.select([read_fd], [], [], left)
            if not ready:
                continue
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data or done.is_set():  # closed, or the wake-up byte of the block's end
            return
        for signum in (b for b in data if b in _NAMES):
            if first is None:
                first = (signum, time.monotonic())
                continue
            # The process normally ends itself (Aborted) well within this. A program that catches Aborted
            # and goes on (a notebook, a test, a Trainer in a larger program) has left the block: it lives.
            if done.wait(ABORT_WAIT):
                return
            _end_process(signum, f"still running {ABORT_WAIT:g} s after a second {_NAMES[signum]}", report)


@contextlib.contextmanager
def _watchdog(grace: Optional[float], report: Report) -> Iterator[None]:
    """Runs :func:`_watch` during the block (main thread only, and only where no one else uses Python's
    wakeup fd, e.g. an asyncio loop)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:
        previous = -2
    if previous != -1:
        if previous != -2:
            signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        yield
        return
    done = threading.Event()
    watcher = threading.Thread(target=_watch, args=(read_fd, grace, report, done), name="cs_run-signal-watchdog",
                               daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(-1)
        # A child forked during the block (a DataLoader's persistent workers) holds a copy of write_fd, so
        # closing ours is no EOF while it lives: a byte that is no signal number wakes the watchdog to see done.
        with contextlib.suppress(OSError):
            os.write(write_fd, b"\0")
        os.close(write_fd)


@contextlib.contextmanager
def stop_on_signal(grace: Optional[float] = None, report: Optional[Report] = None) -> Iterator[StopFlag]:
    """SIGINT / SIGTERM set the yielded flag during the block instead of stopping the process.

    A second signal raises :class:`Aborted`, and ends the process ``ABORT_WAIT`` seconds later if that did
    not; with ``grace`` (seconds), the process also ends that long after the first signal (a replica
    passes its collective timeout: its peers wait no longer). ``report(line, exit_code)`` says why first
    (default: an ``Error:`` line on stderr). Nested blocks share the outermost flag.
    Outside the main thread (where Python cannot install handlers) the flag never sets and the signals
    keep their usual effect.
    """
    if _ACTIVE:
        yield _ACTIVE[-1]
        return
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    for s in _SIGNALS:
        signal.signal(s, flag._handle)
    _ACTIVE.append(flag)
    try:
        with _watchdog(grace, report or _print_line):
            yield flag
    finally:
        _ACTIVE.remove(flag)
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
