"""The decoder's additive attention masks (transformer_utils.create_broadcasted_autoregressive_mask):
causal, optionally a sliding window (a query sees itself and the ``window - 1`` keys before it), whose
first ``sink_tokens`` keys stay visible to every later query (StreamingLLM's attention sinks).
:func:`vsl_mask` is the packed-documents mask of variable sequence length (VSL) batches.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["causal_mask", "position_mask", "vsl_mask", "encoder_vsl_mask"]


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


def vsl_mask(attention_span: torch.Tensor, dtype: torch.dtype, window: Optional[int] = None,
             sink_tokens: Optional[int] = None) -> torch.Tensor:
    """:func:`causal_mask` within each packed document: [batch, 1, seq, seq] from ``attention_span``
    [batch, seq], the number of tokens after each key in its own document (the VSL shards' fourth row).
    Query ``q`` sees key ``k`` when ``0 <= q - k <= attention_span[k]`` (Release 2.10
    ``transformer_utils.create_vsl_mask``, causal), so no document attends to another and a padding
    key (span 0) is seen by itself only. The window and sinks apply on top, as in :func:`causal_mask`."""
    seq = attention_span.shape[1]
    q = torch.arange(seq, device=attention_span.device)[:, None]
    k = torch.arange(seq, device=attention_span.device)[None, :]
    diff = (q - k)[None]  # [1, q, k]
    masked = (diff < 0) | (diff > attention_span[:, None, :].to(diff.dtype))
    if window is not None:
        outside = diff > window - 1
        if sink_tokens:
            outside = outside & (k >= sink_tokens)
        masked = masked | outside
    zeros = torch.zeros(masked.shape, device=attention_span.device, dtype=dtype)
    return zeros.masked_fill(masked, torch.finfo(dtype).min)[:, None]


def encoder_vsl_mask(attention_span: torch.Tensor, position_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The bidirectional VSL mask of an encoder (Release 2.10 ``create_vsl_mask`` with ``is_causal=False``):
    [batch, 1, seq, seq], query ``q`` sees key ``k`` when ``k - position_ids[k] <= q <= k + attention_span[k]``,
    i.e. both lie in the same packed document (a key's position is its offset in its document, its span the
    tokens after it). Padding keys (span 0, position 0) are seen by themselves only."""
    seq = attention_span.shape[1]
    q = torch.arange(seq, device=attention_span.device)[:, None]
    k = torch.arange(seq, device=attention_span.device)[None, :]
    diff = (q - k)[None]  # [1, q, k]
    masked = (diff > attention_span[:, None, :].to(diff.dtype)) | (-diff > position_ids[:, None, :].to(diff.dtype))
    zeros = torch.zeros(masked.shape, device=attention_span.device, dtype=dtype)
    return zeros.masked_fill(masked, torch.finfo(dtype).min)[:, None]
