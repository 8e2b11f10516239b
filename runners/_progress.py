"""Where training is: the train loop's step and epoch counters as one object (docs/architecture.md#run-options).

The loop in ``runners/base.py`` advances it (:meth:`Progress.step_done`, :meth:`Progress.epoch_done`);
checkpoints save its position and a resume restores it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["Progress"]


@dataclass
class Progress:
    """The counters of a runner's training (one per runner, across its runs)."""

    global_step: int = 0
    """Optimizer steps taken, counted across resumed runs (what checkpoints are named by)."""
    epoch: int = 0
    """The epoch being trained, 0-based, counted across resumed runs."""
    epoch_step: int = 0
    """Optimizer steps taken in that epoch."""
    run_start: Optional[int] = None
    """The global step this run started at; None before training starts."""
    run_steps: int = 0
    """The steps this run takes (its step budget)."""
    samples_streamed: int = 0
    """Samples the train loader yielded this run (a restartable loader's worker state)."""

    @property
    def run_step(self) -> int:
        """Steps taken in this run, 1-based after its first step (what log and checkpoint steps count)."""
        return self.global_step - (self.run_start or 0)

    def start_run(self, steps: int) -> None:
        """A run of ``steps`` steps starts at the current global step."""
        self.run_start, self.run_steps, self.samples_streamed = self.global_step, steps, 0

    def step_done(self, samples: int) -> None:
        """One optimizer step over ``samples`` samples (all its micro-batches) is done."""
        self.global_step += 1
        self.epoch_step += 1
        self.samples_streamed += samples

    def epoch_done(self) -> None:
        """The epoch ended: the next starts at its step 0."""
        self.epoch, self.epoch_step = self.epoch + 1, 0
