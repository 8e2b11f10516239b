"""The Model Zoo run helpers a vendor ``run.py`` / ``data.py`` / ``model.py`` imports, on cs-run.

One module stands in for several vendor modules (see :data:`cs_run.frontends.compat.PROVIDED`): 1.x
``modelzoo.common.pytorch.{run_utils, utils, input_utils, half_dtype, PyTorchBaseModel}``,
``modelzoo.common.run_utils.cli_pytorch`` and 2.x ``cerebras.modelzoo.common.{run_utils, input_utils,
pytorch_utils, utils.run.cli_pytorch}``.
"""

from __future__ import annotations

from typing import Any

import torch

from cs_run import amp
from cs_run.backend import use_cs
from cs_run.distributed import get_streaming_batch_size
from cs_run.frontends.modelzoo import PyTorchBaseModel, get_params_from_args, main, run

__all__ = ["HalfDType", "PyTorchBaseModel", "SampleGenerator", "get_input_dtype", "get_params_from_args",
           "get_streaming_batch_size", "half_dtype_instance", "main", "run"]


class HalfDType:
    """The 1.x half type switch, a view of ``cs_run.amp``'s half dtype (run/main set it from params)."""

    @property
    def use_bfloat16(self) -> bool:
        return amp.get_half_dtype() == torch.bfloat16

    @use_bfloat16.setter
    def use_bfloat16(self, value: bool) -> None:
        amp.set_half_dtype(torch.bfloat16 if value else torch.float16)

    @property
    def half_dtype(self) -> torch.dtype:
        return amp.get_half_dtype()


half_dtype_instance = HalfDType()


def get_input_dtype(to_float16: bool) -> torch.dtype:
    """The 1.x input dtype: the half type when ``to_float16`` on CSX or a GPU, else float32 (the vendor's
    CPU workflow has no float16 inputs)."""
    if to_float16 and (use_cs() or torch.cuda.is_available()):
        return half_dtype_instance.half_dtype
    return torch.float32


class SampleGenerator:
    """Yields the same ``data`` ``sample_count`` times: a stand-in DataLoader for synthetic data."""

    def __init__(self, data: Any, sample_count: int) -> None:
        self._data, self._sample_count, self._count = data, sample_count, 0

    def __iter__(self) -> SampleGenerator:
        return SampleGenerator(self._data, self._sample_count)

    def __len__(self) -> int:
        return self._sample_count

    def __next__(self) -> Any:
        if self._count >= self._sample_count:
            raise StopIteration
        self._count += 1
        return self._data

    next = __next__
