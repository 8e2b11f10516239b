"""multimodal_simple: the Model Zoo's multimodal_simple (Release 2.10 ``models/multimodal/multimodal_simple``:
MMSimpleModel around MultimodalSimple). How it differs from llava: several image encoders read the same images
(``image_model_list.image_models``: each the ViT trunk and an optional projection), their features are
concatenated along the patches and go through one ``global_image_projection``; a sample holds up to
``max_num_img`` images ([b, I, c, h, w]) and ``image_data_loc`` [b, I, num_patches] names the text position of
each image feature (the sequence length for an unused slot: written into an extra column that is dropped), so
images and text intermingle anywhere in the sequence. The Llama text model (the decoder families' own) reads
the result, causal plus ``key_padding_mask``. ``token_modality_idx`` changes nothing here: the vendor reads it
only for ``constant_pos_embedding`` and the static dual expert FFN, both refused by name. Loss
(GPTLMHeadModelLoss): :func:`~cs_run.models.common.lm.masked_lm_loss`.

Checkpoint keys are the vendor's: ``model.image_model.image_model_list.N.0.*`` (ViTModel),
``model.image_model.image_model_list.N.1.ffn.M.linear_layer.*`` (a projection),
``model.image_model.projection.ffn.M.linear_layer.*`` (the global projection), ``model.text_model.*``.
"""

from __future__ import annotations

import typing
from typing import Optional

import torch
from torch import nn

from cs_run.models.common.freeze import freeze_modules
from cs_run.models.common.lm import build as build_decoder
from cs_run.models.common.lm import masked_lm_loss
from cs_run.models.multimodal_simple.config import MultimodalSimpleConfig
from cs_run.models.vision_transformer.trunk import ViTModel
from cs_run.models.vision_transformer.vision_tower import Projector, image_features

__all__ = ["MultimodalSimple", "MultimodalSimpleImageEncoders", "MultimodalSimpleModel", "build", "build_model",
           "FEATURES"]

FEATURES = ("image_data", "image_data_loc", "text_input_ids", "loss_mask", "labels", "key_padding_mask",
            "token_modality_idx")
"""The batch a MultimodalSimpleModel reads (MultimodalSimpleHDF5MapDataProcessor's)."""


class MultimodalSimpleImageEncoders(nn.Module):
    """Images [b, I, c, h, w] -> features [b, I, num_patches, width]: each encoder's (its block
    ``image_layer_idx``, the patches' only with ``patch``, then its projection), concatenated, then the global
    projection."""

    def __init__(self, cfg: MultimodalSimpleConfig) -> None:
        super().__init__()
        self.image_model_list = nn.ModuleList([
            nn.ModuleList([ViTModel(e.vit), Projector(e.projection) if e.projection else nn.Identity()])
            for e in cfg.encoders])
        self.projection = Projector(cfg.global_projection) if cfg.global_projection else nn.Identity()
        self.image_layer_idx_list = [e.vit.image_layer_idx for e in cfg.encoders]
        self.image_feature_select_mode = cfg.image_feature_select_mode

    def forward(self, image_data: torch.Tensor) -> torch.Tensor:
        b, i = image_data.shape[:2]
        images = image_data.reshape(b * i, *image_data.shape[2:])
        out = [projection(image_features(vit, images, idx, self.image_feature_select_mode))
               for (vit, projection), idx in zip(self.image_model_list, self.image_layer_idx_list)]
        features = self.projection(torch.cat(out, dim=1))
        return features.reshape(b, i, *features.shape[1:])


class MultimodalSimple(nn.Module):
    """Images, their positions and token ids -> logits of the intermingled sequence."""

    def __init__(self, cfg: MultimodalSimpleConfig) -> None:
        super().__init__()
        self.image_model = MultimodalSimpleImageEncoders(cfg)
        lm = build_decoder(cfg.text)
        self.text_model = lm.model
        self.text_config = lm.config

    def compute_input_embeddings(self, image_data: torch.Tensor, text_input_ids: torch.Tensor,
                                 image_data_loc: torch.Tensor) -> torch.Tensor:
        """The text embeddings with each image feature at its ``image_data_loc`` position (the vendor's
        compute_embeddings: a scatter into the text plus one zero column that takes the unused slots)."""
        features = self.image_model(image_data)
        b, i, n, h = features.shape
        if image_data_loc.shape[0] != b or image_data_loc[0].numel() != i * n:
            raise ValueError(f"image_data_loc: {list(image_data_loc.shape)} but the images give {i} x {n} features "
                             "per sample; write it with the model's num_patches (every encoder's patches)")
        features = features.reshape(b, i * n, h)
        text = self.text_model.input_embeddings(text_input_ids)
        text = torch.cat([text, text.new_zeros(b, 1, h)], dim=1)
        index = image_data_loc.reshape(b, -1).to(torch.int64).unsqueeze(-1).expand(b, i * n, h)
        return text.scatter(1, index, features.to(text.dtype))[:, :-1]

    def forward(self, image_data: torch.Tensor, text_input_ids: torch.Tensor, image_data_loc: torch.Tensor,
                key_padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits [b, s, vocab]; ``key_padding_mask`` is additive (0 attends, the dtype's minimum does not)."""
        embeddings = self.compute_input_embeddings(image_data, text_input_ids, image_data_loc)
        return self.text_model(None, input_embeddings=embeddings, key_padding_mask=key_padding_mask)


class MultimodalSimpleModel(nn.Module):
    """``forward(batch) -> loss``, the runners' contract; ``config`` is the resolved keys."""

    def __init__(self, cfg: MultimodalSimpleConfig) -> None:
        super().__init__()
        self.config = cfg.keys()
        self.model = MultimodalSimple(cfg)
        self.loss_scaling, self.loss_weight = cfg.loss_scaling, float(cfg.loss_weight)
        if cfg.freeze:
            freeze_modules(self.model, cfg.freeze, "'^image_model.image_model_list', '^text_model'")

    def logits(self, batch: dict) -> torch.Tensor:
        images = batch["image_data"]
        padding = batch["key_padding_mask"].to(images.dtype) * torch.finfo(images.dtype).min
        return self.model(images, batch["text_input_ids"], batch["image_data_loc"], padding)

    def forward(self, batch: dict) -> torch.Tensor:
        return masked_lm_loss(self.logits(batch), batch["labels"], batch["loss_mask"], self.loss_scaling,
                              self.loss_weight)


def build(config: MultimodalSimpleConfig) -> MultimodalSimpleModel:
    """Builder of ``model.name: multimodal_simple`` (ModelSpec.builder): the model of one config object."""
    return MultimodalSimpleModel(config)


def build_model(**keys: typing.Any) -> MultimodalSimpleModel:
    """Model function of ``model.name: multimodal_simple``: the ``model:`` keys (checked against
    :class:`MultimodalSimpleConfig`) as a config, built. ``compute_eval_metrics`` is dropped: the vendor's
    multimodal_simple has no eval metrics."""
    keys.pop("compute_eval_metrics", None)
    return build(MultimodalSimpleConfig(**keys))
