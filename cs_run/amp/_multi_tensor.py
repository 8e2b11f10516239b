"""When the gradient step's tensor-list work is one multi-tensor op instead of an op per tensor.

torch picks its multi-tensor (``foreach``) paths only for plain tensors, so inside a CSX trace (fake
tensors) clipping and unscaling ran tensor by tensor: on CUDA a kernel or two per parameter (GPT-2
small's clipping alone: 197 norms and 196 scalings, H200, 2026-11-27). On CUDA they are asked for
explicitly; ATen's multi-tensor kernels are called by inductor as they are. On the CPU the per-tensor
ops stay: inductor fuses them into the step's C++ kernels, and an ahead-of-time CPU library cannot call
these ops (they would need torch's proxy executor).
"""

from __future__ import annotations

import torch


def multi_tensor_kernels(tensors: list[torch.Tensor]) -> bool:
    """Whether ``tensors`` (one device) get one multi-tensor op: on CUDA."""
    return bool(tensors) and tensors[0].device.type == "cuda"
