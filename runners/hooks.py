"""The runner hooks of the Model Zoo (the vendor's PyTorch runners guide) plus ``on_checkpoint_saved``, declared once.

Override them in a subclass of a runner and call ``super()``. The loop that calls them, in order::

    on_train_start()
    for each epoch:
        on_train_epoch_start()
        for each step:
            batch = on_train_batch_start(batch)
            <forward, backward, clip, optimizer step, LR step, zero_grad>
            on_train_batch_end(loss, epoch, step)
            <log, loss check, periodic eval, checkpoint -> on_checkpoint_saved(path, step)>
        on_train_epoch_end(early_exit)
    on_train_end(early_exit)

Evaluation follows the same shape with the ``on_eval_*`` hooks, then ``on_eval_metrics(metrics, step)``
with the computed loss and metrics. A hook that sets ``self.should_stop = True`` ends training after the
current step, with a checkpoint of it (``runconfig.early_stopping_metric`` does this on an eval value). Every hook runs on the host. On CSX,
the step between ``on_*_batch_start`` and ``on_*_batch_end`` is the traced graph; the ``loss`` given to
``on_*_batch_end`` is then a device tensor of that step whose value must be read in a step closure.
An ``*_end`` hook runs only when the loop it closes finished without an exception.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["RunnerHooks"]


class RunnerHooks:
    """No-op hooks; the runners call them directly (grep finds every caller)."""

    def on_train_start(self) -> None:
        """Runs once before the first training step, after model, optimizer and checkpoint are loaded."""

    def on_train_end(self, early_exit: bool) -> None:
        """Runs once after the training loop finished without an exception.

        ``early_exit`` is True when the loop stopped before its step budget (e.g. the data ran out).
        """

    def on_eval_start(self) -> None:
        """Runs once before the first eval step; the model is in eval mode and metrics are reset."""

    def on_eval_end(self, early_exit: bool) -> None:
        """Runs once after the eval loop finished without an exception, before metrics are computed."""

    def on_train_epoch_start(self) -> None:
        """Runs before the first step of each training epoch."""

    def on_train_epoch_end(self, early_exit: bool) -> None:
        """Runs after the last step of each training epoch (only if the epoch had no exception)."""

    def on_eval_epoch_start(self) -> None:
        """Runs before the first step of each eval epoch."""

    def on_eval_epoch_end(self, early_exit: bool) -> None:
        """Runs after the last step of each eval epoch (only if the epoch had no exception)."""

    def on_train_batch_start(self, data: Any) -> Any:
        """Runs before forward/backward/optimizer step of a training step; returns the (maybe changed) batch.

        With gradient accumulation ``data`` is the list of the step's micro-batches.
        """
        return data

    def on_train_batch_end(self, loss: torch.Tensor, epoch: Optional[int] = None, step: Optional[int] = None) -> None:
        """Runs after the optimizer step and LR update of global step ``step``; gradients are zeroed.

        ``loss`` is the step's mean loss (over micro-batches) as a tensor, not yet checked for NaN.
        """

    def on_eval_batch_start(self, data: Any) -> Any:
        """Runs before the forward pass of an eval step; returns the (maybe changed) batch."""
        return data

    def on_eval_batch_end(self, loss: torch.Tensor, epoch: Optional[int] = None, step: Optional[int] = None) -> None:
        """Runs after the forward pass (and metric updates) of eval step ``step`` (1-based)."""

    def on_eval_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Runs after each evaluation with what it computed (``eval/loss`` and every metric of this run, as
        logged: docs/architecture.md, "A run's metrics"), for the weights of global step ``step``; set
        ``self.should_stop = True`` to end training."""

    def on_checkpoint_saved(self, path: str, step: int) -> None:
        """Runs after the checkpoint of global step ``step`` was written completely to ``path``."""
