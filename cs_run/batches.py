"""Batches as nested tensors (tuples, lists, dicts, namedtuples) and the loaders that yield them.

One copy of the device move, the sample count and the loader length, for the runners, the cstorch
data API and the CSX engine; and of the throughput rule: rates leave out compile time.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import Any, Iterable, Iterator

import torch

from cs_run._torch_compat import pytree

__all__ = ["RateMeter", "batch_size", "compile_seconds", "compile_time", "cycle", "loader_length", "move_to_device"]

_compile = {"seconds": 0.0, "depth": 0}


@contextlib.contextmanager
def compile_time() -> Iterator[None]:
    """The block is compile time (the CSX engine's trace and compile): every :class:`RateMeter` leaves it
    out. Nested blocks count once."""
    t0 = time.perf_counter()
    _compile["depth"] += 1
    try:
        yield
    finally:
        _compile["depth"] -= 1
        if _compile["depth"] == 0:
            _compile["seconds"] += time.perf_counter() - t0


def compile_seconds() -> float:
    """Seconds this process has spent in :func:`compile_time` blocks (finished ones)."""
    return _compile["seconds"]


def move_to_device(batch: Any, device: torch.device | None) -> Any:
    """Every tensor of a nested batch on ``device``; the batch itself when nothing has to move.

    The copies are ``non_blocking``: no host sync, so on CUDA the copy overlaps the previous step
    (pin memory in the data function for truly asynchronous copies).
    """
    if device is None:
        return batch
    leaves = pytree.tree_leaves(batch)
    if all(not isinstance(x, torch.Tensor) or x.device == device for x in leaves):
        return batch
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(device, non_blocking=True), batch)


def batch_size(batch: Any) -> int:
    """Samples in a batch: the leading size of its first tensor of rank >= 1 (1 when it holds only
    scalars, 0 when it holds no tensor)."""
    tensors = [x for x in pytree.tree_leaves(batch) if isinstance(x, torch.Tensor)]
    for t in tensors:
        if t.dim() > 0:
            return int(t.shape[0])
    return 1 if tensors else 0


def loader_length(loader: Any) -> int | None:
    """Batches per pass, or None for loaders without a length (iterable datasets)."""
    try:
        return len(loader)
    except TypeError:
        return None


def cycle(iterable: Iterable[Any]) -> Iterator[Any]:
    """Batches forever, restarting ``iterable`` at each epoch end.

    Raises:
        ValueError: a pass over ``iterable`` yielded nothing (cycling it would spin forever).
    """
    while True:
        empty = True
        for x in iterable:
            empty = False
            yield x
        if empty:
            raise ValueError("the dataloader yields no batches; check its dataset size, batch_size and drop_last")


class RateMeter:
    """Throughput in samples/sec: ``rate`` over the last ``window`` steps, ``global_rate`` since the first.

    Host-side timing (no device sync per step): on CUDA the recent rate is the dispatch rate until
    the queue fills; call :meth:`finish` after a sync for an exact ``total_time``. Its clock stops
    during :func:`compile_time` blocks: a step that traced and compiled counts only its run time, and
    ``compile_time`` holds what was left out.
    """

    def __init__(self, window: int = 10) -> None:
        self.total_samples = 0
        self.total_time = 0.0
        self._start: float | None = None
        self._compile_start = compile_seconds()
        self._recent: deque[tuple[float, int]] = deque(maxlen=max(window, 1) + 1)

    @staticmethod
    def _now() -> float:
        return time.perf_counter() - compile_seconds()

    @property
    def compile_time(self) -> float:
        """Compile seconds left out of the rates since the meter was made (or started)."""
        return compile_seconds() - self._compile_start

    def start(self) -> None:
        """Start the clock now (else it starts at the first :meth:`tick`, which then counts no time)."""
        self._start = self._now()
        self._compile_start = compile_seconds()
        self._recent.clear()
        self._recent.append((self._start, self.total_samples))

    def tick(self, samples: int) -> None:
        """One step of ``samples`` samples has been issued."""
        now = self._now()
        if self._start is None:
            self._start = now
            self._recent.append((now, 0))
        self.total_samples += samples
        self.total_time = now - self._start
        self._recent.append((now, self.total_samples))

    def finish(self) -> None:
        """The run ended (after a device sync): ``total_time`` covers all its work."""
        if self._start is not None:
            self.total_time = self._now() - self._start

    @property
    def rate(self) -> float:
        if len(self._recent) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self._recent[0], self._recent[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    @property
    def global_rate(self) -> float:
        return self.total_samples / self.total_time if self.total_time > 0 else 0.0
