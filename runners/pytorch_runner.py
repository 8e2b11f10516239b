"""PyTorchRunner: the eager CPU/GPU runner, the numerical reference of every other runner."""

from __future__ import annotations

from typing import Any

import torch

from cs_run.runners._step import eval_step, train_step
from cs_run.runners.base import PyTorchBaseRunner

__all__ = ["PyTorchRunner"]


class PyTorchRunner(PyTorchBaseRunner):
    """Runs each step eagerly: the step's Python runs every call, values are readable at once. With
    several replicas the train step runs through what the run's strategy wraps the model in
    (:meth:`cs_run.parallel.Strategy.wrap`): torch DDP for data parallel, which averages the gradients over
    them in backward (``self.model`` stays the plain module), or the FSDP2-sharded model itself."""

    devices = ("CPU", "GPU")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._replica_model = self.strategy.wrap(self.model, self.torch_device)

    @property
    def device_name(self) -> str:  # the Model Zoo log names the torch device type
        return self.torch_device.type

    def _train_step(self, micro_batches: list) -> torch.Tensor:
        return train_step(self._replica_model, micro_batches, self.optimizer, self.lr_scheduler, self.grad_scaler,
                          self.step_config, self.strategy)

    def _eval_step(self, batch: Any) -> torch.Tensor:
        return eval_step(self.model, batch, self.step_config)
