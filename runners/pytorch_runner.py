"""PyTorchRunner: the eager CPU/GPU runner, the numerical reference of every other runner."""

from __future__ import annotations

from typing import Any

import torch

from cs_run import replicas
from cs_run.runners._step import eval_step, train_step
from cs_run.runners.base import PyTorchBaseRunner

__all__ = ["PyTorchRunner"]


class PyTorchRunner(PyTorchBaseRunner):
    """Runs each step eagerly: the step's Python runs every call, values are readable at once. With
    several replicas the train step runs through torch DDP (:func:`cs_run.replicas.replicate`), which
    averages the gradients over them in backward; ``self.model`` stays the plain module."""

    devices = ("CPU", "GPU")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._replica_model = replicas.replicate(self.model, self.torch_device)

    @property
    def device_name(self) -> str:  # the Model Zoo log names the torch device type
        return self.torch_device.type

    def _train_step(self, micro_batches: list) -> torch.Tensor:
        return train_step(self._replica_model, micro_batches, self.optimizer, self.lr_scheduler, self.grad_scaler,
                          self.step_config)

    def _eval_step(self, batch: Any) -> torch.Tensor:
        return eval_step(self.model, batch, self.step_config)
