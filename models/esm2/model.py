"""ESM-2 pretraining (model.name ``esm2``): the Model Zoo's Esm2ForPreTrainingModel of Release 2.10
(``models/nlp/esm2/esm2_model.py``, ``esm2_pretrain_models.py``, ``model.py``), which is bert's (see
:mod:`cs_run.models.bert.model`) with three differences:

- ``position_embedding_type: rotary`` is built (bert's BertModelConfig takes it; the ESM-2 files use it): q and k
  rotate in every encoder layer (:mod:`cs_run.models.common.rotary`), ``rotary_dim`` defaulting to a quarter of
  the head as the vendor's post_init sets it;
- ``token_dropout`` (Esm2Model.compute_input_embeddings): the ``mask_token_id`` rows of the token embeddings are
  zeroed and every row is scaled by ``(1 - 0.15 * 0.8) / (1 - masked / length)``, the masked share of each
  sequence's unpadded length; positions and segments are added after;
- ``norm_first`` defaults to true (pre-norm layers).

Loss, heads, metrics, module names and checkpoint keys are bert's, so a vendor ESM-2 checkpoint loads key for key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from cs_run.models.bert.model import BertConfig, BertForPreTrainingModel, BertModel, BertPretrainModel, log_hardware_keys
from cs_run.models.common.config import config_signature, key

__all__ = ["Esm2Config", "Esm2Model", "Esm2ForPreTrainingModel", "build", "build_model", "MASK_RATIO_TRAIN"]

MASK_RATIO_TRAIN = 0.15 * 0.8
"""The masked share ESM-2 was trained with (esm2_model.py hard-codes it for token dropout)."""


@dataclass
class Esm2Config(BertConfig):
    """The ``model:`` keys of the Model Zoo's ``esm2`` (Release 2.10): bert's plus token dropout."""

    norm_first: bool = key(True, "2.2.1", "pre-norm encoder layers (ESM-2's default; bert's is false)")
    token_dropout: bool = key(False, "2.2.1", "zero the mask token's embeddings and rescale by the masked share")
    mask_token_id: Optional[int] = key(None, "2.2.1", "the mask token's id; required with token_dropout")

    POSITION_TYPES = (None, "learned", "fixed", "rotary")
    FAMILY = "ESM-2"

    def resolved(self) -> "Esm2Config":
        """bert's post_init and checks, then ESM-2's: rotary_dim (default a quarter of the head, even, at most
        the head) and mask_token_id with token_dropout. Raises ValueError naming the key."""
        c = super().resolved()
        if c.token_dropout and c.mask_token_id is None:
            raise ValueError("mask_token_id: must be given when token_dropout is true")
        if c.mask_token_id is not None and not 0 <= c.mask_token_id < c.vocab_size:
            raise ValueError(f"mask_token_id: {c.mask_token_id} is not an id of the vocabulary (0..{c.vocab_size - 1})")
        if c.position_embedding_type == "rotary":
            head = c.hidden_size // c.num_heads
            if c.rotary_dim is None:
                c.rotary_dim = int(head * 0.25)
            if not 0 < c.rotary_dim <= head or c.rotary_dim % 2:
                raise ValueError(f"rotary_dim: must be an even number in 2..{head} (hidden_size / num_heads), "
                                 f"got {c.rotary_dim}")
        return c


class Esm2Model(BertModel):
    """bert's encoder with ESM-2's token dropout in its input embeddings."""

    def __init__(self, c: Esm2Config) -> None:
        super().__init__(c)
        self.token_dropout = c.token_dropout
        self.mask_token_id = c.mask_token_id

    def compute_input_embeddings(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                 segment_ids: Optional[torch.Tensor]) -> torch.Tensor:
        """Token dropout, as esm2_model.py applies it in training and eval alike."""
        if not self.token_dropout:
            return super().compute_input_embeddings(input_ids, attention_mask, segment_ids)
        layer = self.embedding_layer
        is_mask = input_ids == self.mask_token_id
        x = layer.word_embeddings(input_ids).masked_fill(is_mask[..., None], 0.0)
        lengths = attention_mask.to(x.dtype).sum(-1)
        observed = 1 - is_mask.to(x.dtype).sum(-1) / lengths
        x = (x * (1 - MASK_RATIO_TRAIN) / observed[:, None, None]).to(x.dtype)
        return layer.add_positions_and_segments(x, input_ids, segment_ids)


class Esm2PretrainModel(BertPretrainModel):
    def build_encoder_model(self, c: Esm2Config) -> Esm2Model:
        return Esm2Model(c)


class Esm2ForPreTrainingModel(BertForPreTrainingModel):
    """bert's loss and metrics over :class:`Esm2PretrainModel` (``.model``)."""

    def build_model(self, c: Esm2Config) -> Esm2PretrainModel:
        return Esm2PretrainModel(c)


def build(config: Esm2Config) -> Esm2ForPreTrainingModel:
    """The family's builder (:attr:`cs_run.registry.ModelSpec.builder`): the model of one config."""
    log_hardware_keys(config)
    return Esm2ForPreTrainingModel(config)


def build_model(**keys: Any) -> Esm2ForPreTrainingModel:
    """Model function of ``model.name: esm2``: the keys are :class:`Esm2Config`'s fields."""
    return build(Esm2Config(**keys))


build_model.__signature__ = config_signature(Esm2Config)
