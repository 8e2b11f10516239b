"""The decoder's additive attention masks (transformer_utils.create_broadcasted_autoregressive_mask):
causal, optionally a sliding window (a query sees itself and the ``window - 1`` keys before it), whose
first ``sink_tokens`` keys stay visible to every later query (StreamingLLM's attention sinks).
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["causal_mask", "position_mask"]


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


def position_mask(q_positions: torch.Tensor, k_positions: torch.Tensor, k_valid: torch.Tensor, dtype: torch.dtype,
                  window: Optional[int] = None, sink_tokens: Optional[int] = None) -> torch.Tensor:
    """:func:`causal_mask`'s rule over each sequence's own token positions (incremental decoding with a
    KV cache, left-padded batches): [batch, 1, queries, keys] for queries at ``q_positions`` [batch, q]
    and the cached keys at ``k_positions`` [batch, k], of which ``k_valid`` are tokens (False: padding,
    never attended). With positions 0..n-1 and every key valid it equals ``causal_mask(n, ...)``."""
    q, k = q_positions[:, :, None], k_positions[:, None, :]
    masked = (k > q) | ~k_valid[:, None, :]
    if window is not None:
        outside = q - k > window - 1
        if sink_tokens:
            outside = outside & (k >= sink_tokens)
        masked = masked | outside
    zeros = torch.zeros(masked.shape, device=q_positions.device, dtype=dtype)
    return zeros.masked_fill(masked, torch.finfo(dtype).min)[:, None]
