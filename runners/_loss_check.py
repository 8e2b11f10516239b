"""The training loss's NaN/inf check after every step (``PyTorchBaseRunner``): at once, or deferred.

Reading a CPU tensor costs nothing, so the CPU runner reads each step's loss and stops at the bad step
itself. On a GPU, and for the CSX engine's compiled step, a read per step would make the host wait for the
step (and not prepare the next batch while it runs): there the first bad step and its loss are kept on the
device and read on log and checkpoint steps only, before any checkpoint of the weights it produced.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

__all__ = ["LossCheck"]


class LossCheck:
    """``track`` each step's loss; ``raise_if_bad`` on log and checkpoint steps. ``on_bad(value, step)``
    raises the run's error for the first bad step."""

    def __init__(self, deferred: bool, on_bad: Callable[[float, int], None]) -> None:
        self.deferred = deferred
        self._on_bad = on_bad
        self._first_step: Optional[torch.Tensor] = None
        self._value: Optional[torch.Tensor] = None

    def track(self, loss: torch.Tensor, step: int) -> None:
        if not self.deferred:
            value = float(loss)
            if not math.isfinite(value):
                self._on_bad(value, step)
            return
        bad = ~torch.isfinite(loss.detach())
        if self._first_step is None:
            self._first_step = torch.zeros((), dtype=torch.int64, device=loss.device)
            self._value = torch.zeros((), dtype=loss.dtype, device=loss.device)
        first = bad & (self._first_step == 0)
        self._first_step = torch.where(first, step, self._first_step)
        self._value = torch.where(first, loss.detach(), self._value)

    def raise_if_bad(self) -> None:
        if self._first_step is not None:
            step = int(self._first_step)  # host sync point: log and checkpoint steps only
            if step:
                self._on_bad(float(self._value), step)
