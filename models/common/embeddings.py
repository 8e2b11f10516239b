"""Token embeddings plus the position embeddings that are added to them (EmbeddingLayer).

``learned``: ``position_embeddings.embed`` (an nn.Embedding of ``max_position_embeddings +
position_embedding_offset`` rows, indexed from the offset); ``fixed``: ``position_embeddings.fpe``,
tensor2tensor sinusoids with sin/cos interleaved per timescale. ``rotary`` and ``alibi`` add nothing
here: the rotary tables and the ALiBi layer (``position_embed_helper``) act inside attention.
Keys are the Model Zoo's since Release 2.0; Release 1.x's ``position_embeddings.weight`` loads too.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from cs_run.errors import DataError
from cs_run.models.common.alibi import AlibiPositionEmbeddingLayer
from cs_run.models.common.initializers import make_initializer
from cs_run.models.common.rotary import RotaryEmbedding

__all__ = ["EmbeddingLayer", "LearnedPositionEmbeddingLayer", "FixedPositionEmbeddingLayer", "fixed_sinusoids",
           "POSITION_EMBEDDING_TYPES"]

POSITION_EMBEDDING_TYPES = ("learned", "fixed", "rotary", "alibi")


def fixed_sinusoids(seq_len: int, width: int, min_timescale: float = 1.0, max_timescale: float = 1.0e4
                    ) -> torch.Tensor:
    position = torch.arange(seq_len, dtype=torch.float32)
    n = width // 2
    increment = math.log(max_timescale / min_timescale) / max(n - 1, 1)
    inv = min_timescale * torch.exp(torch.arange(n, dtype=torch.float32) * -increment)
    scaled = position[:, None] * inv[None, :]
    signal = torch.stack([torch.sin(scaled), torch.cos(scaled)], dim=2).reshape(seq_len, 2 * n)
    return F.pad(signal, (0, width % 2))


class LearnedPositionEmbeddingLayer(nn.Module):
    def __init__(self, max_position_embeddings: int, size: int, offset: int = 0) -> None:
        super().__init__()
        self.offset = offset
        self.embed = nn.Embedding(max_position_embeddings + offset, size)

    def forward(self, length: int) -> torch.Tensor:
        return self.embed.weight[self.offset:self.offset + length]


class FixedPositionEmbeddingLayer(nn.Module):
    def __init__(self, max_position_embeddings: int, size: int) -> None:
        super().__init__()
        self.register_buffer("fpe", fixed_sinusoids(max_position_embeddings, size))

    def forward(self, length: int) -> torch.Tensor:
        return self.fpe[:length]


class EmbeddingLayer(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, max_position_embeddings: int,
                 position_embedding_type: Optional[str], embeddings_initializer: dict,
                 position_embedding_offset: int = 0, num_heads: int = 1, rotary_dim: Optional[int] = None,
                 rope_theta: float = 10000.0, alibi_trainable_slopes: bool = False, alibi_initializer: dict = None,
                 pos_scaling_factor: float = 1.0, pos_scaling_type: str = "linear",
                 pos_scaling_extra_args: Optional[dict] = None) -> None:
        super().__init__()
        self.max_position_embeddings = max_position_embeddings
        self.position_embedding_type = position_embedding_type
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size)
        self.position_embeddings: Optional[nn.Module] = None
        self.position_embed_helper: Optional[nn.Module] = None
        self.rotary: Optional[RotaryEmbedding] = None
        if position_embedding_type == "learned":
            self.position_embeddings = LearnedPositionEmbeddingLayer(max_position_embeddings, hidden_size,
                                                                     position_embedding_offset)
        elif position_embedding_type == "fixed":
            self.position_embeddings = FixedPositionEmbeddingLayer(max_position_embeddings, hidden_size)
        elif position_embedding_type == "rotary":
            self.rotary = RotaryEmbedding(rotary_dim, max_position_embeddings, rope_theta, pos_scaling_type,
                                          pos_scaling_factor, pos_scaling_extra_args)
        elif position_embedding_type == "alibi":
            self.position_embed_helper = AlibiPositionEmbeddingLayer(num_heads, alibi_trainable_slopes,
                                                                     pos_scaling_factor)
        with torch.no_grad():
            make_initializer(embeddings_initializer)(self.word_embeddings.weight)
            if isinstance(self.position_embeddings, LearnedPositionEmbeddingLayer):
                make_initializer(embeddings_initializer)(self.position_embeddings.embed.weight)
            if alibi_trainable_slopes and self.position_embed_helper is not None:
                make_initializer(alibi_initializer)(self.position_embed_helper.slopes)
        self._register_load_state_dict_pre_hook(self._release_1_keys)

    @staticmethod
    def _release_1_keys(state_dict, prefix, *args) -> None:
        """Model Zoo 1.x checkpoints name the learned table ``position_embeddings.weight`` and the
        fixed one ``position_embeddings``."""
        for old, new in (("position_embeddings.weight", "position_embeddings.embed.weight"),
                         ("position_embeddings", "position_embeddings.fpe")):
            if prefix + old in state_dict and prefix + new not in state_dict:
                state_dict[prefix + new] = state_dict.pop(prefix + old)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        if length > self.max_position_embeddings:
            raise DataError(f"the batch's sequence length {length} exceeds model.max_position_embeddings "
                            f"({self.max_position_embeddings}); raise it, or write shorter sequences (the input's "
                            "max_sequence_length, plus any tokens its data_transforms add)")
        x = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(length).to(x.dtype)
        return x

    def position_bias(self, length: int) -> Optional[torch.Tensor]:
        """ALiBi's [heads, q, k] logit bias, or None."""
        return self.position_embed_helper(length, length) if self.position_embed_helper is not None else None

    def embed_at(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` for tokens at each sequence's own ``positions`` [batch, seq] (incremental decoding)."""
        x = self.word_embeddings(input_ids)
        if isinstance(self.position_embeddings, LearnedPositionEmbeddingLayer):
            x = x + self.position_embeddings.embed.weight[self.position_embeddings.offset + positions].to(x.dtype)
        elif isinstance(self.position_embeddings, FixedPositionEmbeddingLayer):
            x = x + self.position_embeddings.fpe[positions].to(x.dtype)
        return x

    def position_bias_at(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> Optional[torch.Tensor]:
        """ALiBi's [batch, heads, q, k] logit bias at the sequences' own positions, or None."""
        if self.position_embed_helper is None:
            return None
        return self.position_embed_helper.bias_at(q_positions, k_positions)
