"""llava: the Model Zoo's LLaVA (Release 2.10 ``models/multimodal/llava``: LlavaModel around Llava). A CLIP
vision tower (the ViT trunk, ``model.image_model``) reads the image; the output of block
``image_feature_select_layer_idx`` (the patches' only with ``image_feature_select_mode: patch``) goes
through the projector (``model.projector_image_model``) and replaces the text embeddings at positions
``image_start_idx`` .. ``image_start_idx + features`` (the placeholder tokens the preprocessing wrote
there); the Llama text model (``model.text_model``, the decoder families' own) reads the spliced
sequence, causal plus ``key_padding_mask`` (1: a key no query attends: padding, and the image positions
of a sample without an image). Loss (GPTLMHeadModelLoss): cross entropy of ``labels`` under
``loss_mask``, summed, / the scored tokens (``num_tokens``) or / batch size * ``loss_weight``.

Checkpoint keys are the vendor's: ``model.image_model.*`` (ViTModel), ``model.text_model.*``
(GPT2LMHeadModel), ``model.projector_image_model.ffn.N.linear_layer.*``.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Optional

import torch
from torch import nn

from cs_run.models.common.freeze import freeze_modules
from cs_run.models.common.lm import build as build_decoder
from cs_run.models.common.lm import masked_lm_loss
from cs_run.models.llava.config import LlavaConfig
from cs_run.models.vision_transformer.trunk import ViTModel
from cs_run.models.vision_transformer.vision_tower import Projector, image_features

__all__ = ["Llava", "LlavaModel", "build", "build_model", "FEATURES"]

FEATURES = ("image_data", "text_input_ids", "loss_mask", "labels", "key_padding_mask")
"""The batch a LlavaModel reads (LlavaHDF5MapDataProcessor's); Release 2.2's samples add ``attention_span`` and
``position_ids``."""


class Llava(nn.Module):
    """Image and token ids -> logits of the spliced sequence."""

    def __init__(self, cfg: LlavaConfig) -> None:
        super().__init__()
        self.image_model = ViTModel(cfg.vit)
        lm = build_decoder(cfg.text)
        self.text_model = lm.model
        self.text_config = lm.config
        self.resolved = {"image_model": dataclasses.asdict(cfg.vit), "text_model": lm.config,
                         "projector": dataclasses.asdict(cfg.projector_config) if cfg.projector_config else None,
                         "image_feature_select_layer_idx": cfg.image_feature_select_layer_idx,
                         "image_feature_select_mode": cfg.image_feature_select_mode,
                         "image_start_idx": cfg.image_start_idx}
        """Every key as the model computes with it (the HF adapter compares them)."""
        self.projector_image_model = Projector(cfg.projector_config) if cfg.projector_config is not None else None
        self.image_start_idx = cfg.image_start_idx
        self.image_feature_select_layer_idx = cfg.image_feature_select_layer_idx
        self.image_feature_select_mode = cfg.image_feature_select_mode

    def compute_input_embeddings(self, image_data: torch.Tensor, text_input_ids: torch.Tensor,
                                 position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The text embeddings (a position table read at ``position_ids`` when given) with the projected image
        features in place of the image's placeholders."""
        features = image_features(self.image_model, image_data, self.image_feature_select_layer_idx,
                                  self.image_feature_select_mode)
        if self.projector_image_model is not None:
            features = self.projector_image_model(features)
        text = self.text_model.input_embeddings(text_input_ids, position_ids)
        start, n = self.image_start_idx, features.shape[1]
        if start + n > text.shape[1]:
            raise ValueError(f"image_start_idx: {start} + {n} image features exceed the sequence of {text.shape[1]} "
                             "tokens; write longer samples or fewer patches")
        return torch.cat([text[:, :start], features.to(text.dtype), text[:, start + n:]], dim=1)

    def forward(self, image_data: torch.Tensor, text_input_ids: torch.Tensor,
                key_padding_mask: Optional[torch.Tensor] = None, attention_span: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits [b, s, vocab]; ``key_padding_mask`` is additive (0 attends, the dtype's minimum does not).
        Release 2.2's samples add ``attention_span`` (the VSL mask: each key seen only within its document) and
        ``position_ids``, which 2.2's Llava reads in the text embeddings only (its decoder, given embeddings,
        takes the rotary angles of positions 0 .. seq - 1)."""
        embeddings = self.compute_input_embeddings(image_data, text_input_ids, position_ids)
        return self.text_model(None, attention_span, input_embeddings=embeddings, key_padding_mask=key_padding_mask)


class LlavaModel(nn.Module):
    """``forward(batch) -> loss``, the runners' contract; ``config`` is the resolved keys."""

    def __init__(self, cfg: LlavaConfig) -> None:
        super().__init__()
        self.config = cfg.keys()
        self.model = Llava(cfg)
        self.vocab_size = cfg.text.vocab_size
        self.loss_scaling, self.loss_weight = cfg.loss_scaling, float(cfg.loss_weight)
        if cfg.freeze:
            freeze_modules(self.model, cfg.freeze, "'^image_model', '^text_model', '^projector_image_model'")

    def logits(self, batch: dict) -> torch.Tensor:
        images = batch["image_data"]
        padding = batch["key_padding_mask"].to(images.dtype) * torch.finfo(images.dtype).min
        return self.model(images, batch["text_input_ids"], padding, batch.get("attention_span"),
                          batch.get("position_ids"))

    def forward(self, batch: dict) -> torch.Tensor:
        logits = self.logits(batch)
        return masked_lm_loss(logits, batch["labels"], batch["loss_mask"], self.loss_scaling, self.loss_weight)


def build(config: LlavaConfig) -> LlavaModel:
    """Builder of ``model.name: llava`` (ModelSpec.builder): the model of one config object."""
    return LlavaModel(config)


def build_model(**keys: typing.Any) -> LlavaModel:
    """Model function of ``model.name: llava``: the ``model:`` keys (checked against :class:`LlavaConfig`) as
    a config, built. ``compute_eval_metrics`` (what the HF adapter passes every family) is dropped: the
    vendor's llava has no eval metrics."""
    keys.pop("compute_eval_metrics", None)
    return build(LlavaConfig(**keys))
