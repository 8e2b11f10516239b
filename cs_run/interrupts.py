"""Ctrl-C and SIGTERM that keep the work (docs/architecture.md#interrupts).

While a training loop runs inside :func:`stop_on_signal`, the first SIGINT or SIGTERM only sets a flag:
the loop finishes its current step, writes a checkpoint (atomically, as every checkpoint) and raises
:class:`Interrupted` (the runners' loop; the ``DataExecutor`` of a custom loop makes its step a
checkpoint step, so the loop's checkpoint closures save it). A second signal raises :class:`Aborted` at once, wherever the loop is; a
checkpoint being written then is abandoned as a temporary file, so the last complete checkpoint stays
as it was. Exit codes are the shell's: 130 for SIGINT, 143 for SIGTERM.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path
from typing import Iterator, Optional

__all__ = ["Aborted", "Interrupted", "StopFlag", "stop_on_signal"]

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


@contextlib.contextmanager
def stop_on_signal() -> Iterator[StopFlag]:
    """SIGINT / SIGTERM set the yielded flag during the block instead of stopping the process.

    Nested blocks share the outermost flag. Outside the main thread (where Python cannot install
    handlers) the flag never sets and the signals keep their usual effect.
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
        yield flag
    finally:
        _ACTIVE.remove(flag)
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
