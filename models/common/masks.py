"""The decoder's additive attention masks (transformer_utils.create_broadcasted_autoregressive_mask):
causal, optionally a sliding window (a query sees itself and the ``window - 1`` keys before it), whose
first ``sink_tokens`` keys stay visible to every later query (StreamingLLM's attention sinks).
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["causal_mask"]


def causal_mask(seq_len: int, device: torch.device, dtype: torch.dtype, window: Optional[int] = None,
                sink_tokens: Optional[int] = None) -> torch.Tensor:
    """[seq_len, seq_len] of 0 (attend) and the dtype's lowest value (masked)."""
    q = torch.arange(seq_len, device=device)[:, None]
    k = torch.arange(seq_len, device=device)[None, :]
    masked = k > q
    if window is not None:
        outside = q - k > window - 1
        if sink_tokens:
            outside = outside & (k >= sink_tokens)
        masked = masked | outside
    return torch.zeros(seq_len, seq_len, device=device, dtype=dtype).masked_fill(masked, torch.finfo(dtype).min)
