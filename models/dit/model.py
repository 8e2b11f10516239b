"""dit: the Model Zoo's DiT (model.py DiTModel around modeling_dit.py DiT). The batch (from
DiffusionLatentImageNet1KProcessor) holds the clean latent, the label (the null class where dropped), the
noise and the timestep; the model noises the latent, predicts the noise and the loss is their mean squared
error. Sampling (DDPM / DDIM, the ``reverse_process`` keys) is not built.

Checkpoint keys are the vendor's: ``model.patch_embedding_layer.*``, ``model.timestep_embedding_layer.*``,
``model.label_embedding_layer.weight``, ``model.transformer_decoder.layers.N.*``, ``model.final_norm.*``,
``model.noise_head.*``, ``model.gaussian_diffusion.*``.
"""

from __future__ import annotations

import dataclasses
import typing

import torch
from torch import nn

from cs_run.models.common.initializers import make_initializer
from cs_run.models.dit.config import DiTConfig
from cs_run.models.dit.diffusion import GaussianDiffusion
from cs_run.models.dit.layers import AdaLayerNorm, DiTDecoder, DiTDecoderLayer, DiTPatchEmbedding, RegressionHead, TimestepEmbeddingLayer
from cs_run.models.vision_transformer.config import ViTModelConfig

__all__ = ["DiT", "DiTModel", "build", "build_model"]


def _embedding_config(cfg: DiTConfig) -> ViTModelConfig:
    """The ViT trunk's keys of the patch embedding (the rest of its config is unused here)."""
    return ViTModelConfig(hidden_size=cfg.hidden_size, num_heads=cfg.num_heads, image_size=list(cfg.latent_size),
                          patch_size=list(cfg.patch_size), num_channels=cfg.latent_channels,
                          embedding_dropout_rate=cfg.embedding_dropout_rate, prepend_cls_token=False,
                          position_embedding_type="learned" if cfg.position_embedding_type == "learned" else None,
                          use_conv_patchified_embedding=cfg.use_conv_patchified_embedding,
                          initializer_range=cfg.initializer_range, projection_initializer=cfg.projection_initializer,
                          position_embedding_initializer=cfg.position_embedding_initializer)


class DiT(nn.Module):
    """(clean latent, label, noise, timestep) -> (predicted noise, None: no learned variance in 2.10)."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.patch_embedding_layer = DiTPatchEmbedding(_embedding_config(cfg), cfg.position_embedding_type == "fixed",
                                                       cfg.init_conv_like_linear)
        self.timestep_embedding_layer = TimestepEmbeddingLayer(
            cfg.num_diffusion_steps, cfg.hidden_size, cfg.frequency_embedding_size, cfg.embedding_nonlinearity,
            cfg.timestep_embedding_initializer)
        # one more row, the null class, when labels are dropped for classifier-free guidance
        self.label_embedding_layer = nn.Embedding(cfg.num_classes + int(cfg.label_dropout_rate > 0), cfg.hidden_size)
        with torch.no_grad():
            make_initializer(cfg.label_embedding_initializer)(self.label_embedding_layer.weight)
        self.transformer_decoder = DiTDecoder([DiTDecoderLayer(
            cfg.hidden_size, cfg.num_heads, cfg.filter_size, dropout=cfg.dropout_rate, activation=cfg.nonlinearity,
            layer_norm_eps=cfg.layer_norm_epsilon, norm_first=cfg.norm_first,
            attention_dropout_rate=cfg.attention_dropout_rate, attention_type=cfg.attention_type,
            attention_softmax_fp32=cfg.attention_softmax_fp32,
            use_projection_bias_in_attention=cfg.use_projection_bias_in_attention,
            use_ffn_bias_in_attention=cfg.use_ffn_bias_in_attention, use_ffn_bias=cfg.use_ffn_bias,
            attention_initializer=cfg.attention_initializer, ffn_initializer=cfg.ffn_initializer)
            for _ in range(cfg.num_hidden_layers)])
        self.noise_head = RegressionHead(list(cfg.latent_size), cfg.latent_channels, list(cfg.patch_size),
                                         cfg.hidden_size, cfg.use_conv_transpose_unpatchify, cfg.head_initializer)
        self.final_norm = AdaLayerNorm(cfg.hidden_size, cfg.layer_norm_epsilon)
        self.gaussian_diffusion = GaussianDiffusion(cfg.num_diffusion_steps, cfg.beta_start, cfg.beta_end)

    def forward(self, input: torch.Tensor, label: torch.Tensor, diffusion_noise: torch.Tensor,  # noqa: A002 - vendor's
                timestep: torch.Tensor) -> tuple[torch.Tensor, None]:
        noised = self.gaussian_diffusion(input, diffusion_noise, timestep)
        return self.forward_dit(noised, label, timestep)

    def forward_dit(self, noised_latent: torch.Tensor, label: torch.Tensor,
                    timestep: torch.Tensor) -> tuple[torch.Tensor, None]:
        """The denoiser alone: noised latents -> predicted noise."""
        x = self.patch_embedding_layer(noised_latent)
        context = self.timestep_embedding_layer(timestep) + self.label_embedding_layer(label.long())
        x = self.final_norm(self.transformer_decoder(x, context), context)
        return self.noise_head(x), None


class DiTModel(nn.Module):
    """``forward(batch) -> loss``, the runners' contract; ``config`` is the resolved keys."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.config = dataclasses.asdict(cfg)
        self.model = DiT(cfg)
        self.mse_loss = nn.MSELoss()

    def forward(self, data: dict) -> torch.Tensor:
        pred_noise, _ = self.model(input=data["input"], label=data["label"], diffusion_noise=data["diffusion_noise"],
                                   timestep=data["timestep"])
        return self.mse_loss(pred_noise, data["diffusion_noise"])


def build(config: DiTConfig) -> DiTModel:
    """Builder of ``model.name: dit`` (ModelSpec.builder): the model of one config object."""
    return DiTModel(config)


def build_model(**keys: typing.Any) -> DiTModel:
    """Model function of ``model.name: dit``: the ``model:`` keys (checked against :class:`DiTConfig`), built."""
    return build(DiTConfig(**keys))
