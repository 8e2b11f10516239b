"""The key/value cache of incremental decoding: a prompt's prefill, then one token at a time.

Each layer's attention keeps its keys (rotated, for RoPE) and values of every token so far, per key/value
head (grouped-query attention stores its ``num_kv_groups`` heads, not the repeated ones), in buffers of
``max_length`` slots allocated at the first write. Slot ``i`` of a sequence holds the token at
``positions[:, i]``: a left-padded batch's sequences start at position 0 at their first real token, and
padding slots are never attended (``valid`` False). Positions, not slots, decide the causal order, the
sliding window, the sink tokens, the ALiBi distance and the position embeddings, so a sequence decodes
to the same logits alone and in a padded batch. A sliding window keeps all slots and masks the old ones.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["KVCache"]


class KVCache:
    """Keys, values and token positions of a batch of ``batch`` sequences of at most ``max_length`` tokens.

    :meth:`advance` places the next tokens (before the model's layers run); each attention layer then
    calls :meth:`update` with their keys and values and attends to what it returns.
    """

    def __init__(self, batch: int, max_length: int, device: torch.device | str = "cpu") -> None:
        self.batch, self.max_length = batch, max_length
        self.length = 0  # slots written
        self._start = 0  # first slot of the tokens being decoded
        self.positions = torch.zeros(batch, max_length, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch, max_length, dtype=torch.bool, device=device)
        self.next_position = torch.zeros(batch, dtype=torch.long, device=device)
        self._keys: dict[int, torch.Tensor] = {}
        self._values: dict[int, torch.Tensor] = {}

    def advance(self, attention_mask: Optional[torch.Tensor], length: int) -> torch.Tensor:
        """Place ``length`` new tokens per sequence (``attention_mask`` [batch, length]: 1 for a token, 0 for
        left padding; None: all tokens) and return their positions [batch, length] (padding at 0)."""
        if self.length + length > self.max_length:
            raise ValueError(f"the KV cache holds {self.max_length} tokens per sequence; {self.length} are "
                             f"cached and {length} more do not fit")
        device = self.positions.device
        if attention_mask is None:
            attention_mask = torch.ones(self.batch, length, dtype=torch.bool, device=device)
        tokens = attention_mask.to(device=device, dtype=torch.bool)
        positions = self.next_position[:, None] + torch.cumsum(tokens.long(), dim=1) - 1
        positions = positions.masked_fill(~tokens, 0)
        self._start, end = self.length, self.length + length
        self.positions[:, self._start:end] = positions
        self.valid[:, self._start:end] = tokens
        self.next_position += tokens.long().sum(dim=1)
        self.length = end
        return positions

    def keys_positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions, valid) of every cached slot, [batch, length] each."""
        return self.positions[:, :self.length], self.valid[:, :self.length]

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a layer's keys and values of the tokens :meth:`advance` placed ([batch, heads, new, head_dim])
        and return all of the layer's cached ones, [batch, heads, length, head_dim]."""
        if layer not in self._keys:
            shape = (self.batch, keys.shape[1], self.max_length, keys.shape[-1])
            self._keys[layer] = keys.new_zeros(shape)
            self._values[layer] = values.new_zeros(shape)
        k, v = self._keys[layer], self._values[layer]
        k[:, :, self._start:self.length] = keys
        v[:, :, self._start:self.length] = values
        return k[:, :, :self.length], v[:, :, :self.length]
