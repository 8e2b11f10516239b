"""The dit ``model:`` keys, declared once: their names, types and Model Zoo 2.10 defaults (modeling_dit.py
DiTConfig and VAEConfig, model.py DiTModelConfig), with the vendor's post_init rules (latent_size and
latent_channels from ``vae``, the embedding initializers from ``initializer_range``).

``since``: the first mirrored Model Zoo tag whose dit code or params files name the key (dit arrived in 2.0.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cs_run.models.common.activations import ACTIVATIONS
from cs_run.models.common.config import Initializer, key
from cs_run.models.common.initializers import initializer_spec

__all__ = ["DiTConfig", "VAE_KEYS"]

VAE_KEYS = {"act_fn": "silu", "in_channels": 3, "out_channels": 3, "block_out_channels": [64],
            "down_block_types": ["DownEncoderBlock2D"], "up_block_types": ["UpDecoderBlock2D"], "latent_channels": 4,
            "latent_size": [32, 32], "layers_per_block": 1, "norm_num_groups": 32, "sample_size": None,
            "scaling_factor": 0.18215}
"""VAEConfig's keys and defaults. Training reads precomputed latents, so the VAE itself is never built here
(the vendor builds it only to decode samples); its latent shape and scaling factor are read."""

_REVERSE_PROCESS_KEYS = ("pipeline", "sampler", "batch_size")


@dataclass
class DiTConfig:
    """``model.name: dit``: a DiT (adaLN-zero blocks over patch embeddings of VAE latents, conditioned on the
    diffusion timestep and the class label) predicting the noise added to the latent; the loss is the MSE to it."""

    # embeddings
    embedding_dropout_rate: float = key(0.1, "2.0.2", "dropout after the patch embedding")
    embedding_nonlinearity: str = key("silu", "2.0.2", "activation of the timestep MLP")
    position_embedding_type: Optional[str] = key("learned", "2.0.2", "learned, fixed (2-D sin-cos, not trained) or None")
    frequency_embedding_size: int = key(256, "2.0.2", "width of the sinusoidal timestep features")
    label_dropout_rate: float = key(0.1, "2.0.2", "share of labels the data replaces by the null class (classifier-free guidance)")
    # transformer
    hidden_size: int = key(768, "2.0.2", "model width")
    num_hidden_layers: int = key(12, "2.0.2", "DiT blocks")
    num_heads: int = key(12, "2.0.2", "attention heads")
    filter_size: int = key(3072, "2.0.2", "FFN inner width")
    layer_norm_epsilon: float = key(1.0e-5, "2.0.2", "the adaptive norms' epsilon")
    dropout_rate: float = key(0.0, "2.0.2", "attention-output and FFN-output dropout")
    nonlinearity: str = key("gelu", "2.0.2", "FFN activation")
    encoder_nonlinearity: str = key("gelu", "2.0.2", "read by no Model Zoo 2.10 DiT code; no effect")
    use_ffn_bias: bool = key(True, "2.0.2", "FFN biases")
    norm_first: bool = key(True, "2.0.2", "pre-norm blocks (post-norm when false)")
    block_type: str = key("adaln_zero", "2.0.2", "adaln_zero, the one block the vendor builds")
    attention_type: str = key("scaled_dot_product", "2.0.2", "scaled_dot_product divides q by sqrt(head width)")
    attention_softmax_fp32: bool = key(True, "2.0.2", "softmax in float32 under mixed precision")
    attention_dropout_rate: float = key(0.0, "2.0.2", "attention-probability dropout")
    use_projection_bias_in_attention: bool = key(True, "2.0.2", "q/k/v biases")
    use_ffn_bias_in_attention: bool = key(True, "2.0.2", "attention output bias")
    # latents and patches
    num_classes: int = key(1000, "2.0.2", "class labels (one more row, the null class, with label dropout)")
    latent_size: Optional[list] = key(None, "2.0.2", "latent [height, width]; None: vae.latent_size")
    latent_channels: Optional[int] = key(None, "2.0.2", "latent channels; None: vae.latent_channels")
    patch_size: list = key([16, 16], "2.0.2", "patch [height, width]")
    use_conv_patchified_embedding: bool = key(False, "2.0.2", "a Conv2d patch projection; else a Linear")
    use_conv_transpose_unpatchify: bool = key(True, "2.0.2", "the head is a ConvTranspose2d; else a Linear and unpatchify")
    vae: Optional[dict] = key(None, "2.0.2", "the VAE's keys; its latent_size, latent_channels and scaling_factor are read")
    # initializers
    initializer_range: float = key(0.02, "2.0.2", "std of the embedding initializers' normal")
    projection_initializer: Initializer = key({"name": "xavier_uniform", "gain": 1.0}, "2.0.2", "patch projection")
    position_embedding_initializer: Initializer = key(None, "2.0.2", "learned positions; None: truncated normal of initializer_range")
    init_conv_like_linear: Optional[bool] = key(None, "2.0.2", "initialize the conv projection as its [out, in*ph*pw] "
                                                "matrix; None: use_conv_patchified_embedding")
    attention_initializer: Initializer = key({"name": "xavier_uniform", "gain": 1.0}, "2.0.2", "q/k/v and output projections")
    ffn_initializer: Initializer = key({"name": "xavier_uniform", "gain": 1.0}, "2.0.2", "FFN layers")
    timestep_embedding_initializer: Initializer = key(None, "2.2.0", "timestep MLP; None: normal of initializer_range")
    label_embedding_initializer: Initializer = key(None, "2.0.2", "label table; None: normal of initializer_range")
    head_initializer: Initializer = key("zeros", "2.0.2", "the noise head's kernel")
    # diffusion
    num_diffusion_steps: int = key(1000, "2.0.2", "timesteps of the forward process")
    schedule_name: str = key("linear", "2.0.2", "beta schedule: linear (Ho et al., scaled to num_diffusion_steps)")
    beta_start: float = key(0.0001, "2.0.2", "first beta (at 1000 steps)")
    beta_end: float = key(0.02, "2.0.2", "last beta (at 1000 steps)")
    reverse_process: Optional[dict] = key(None, "2.0.2", "sampler and pipeline keys of sampling; sampling is not built here")
    var_loss: bool = key(False, "2.3.0", "the vendor's sampler variance flag; the 2.10 loss is the noise MSE either way")

    def __post_init__(self) -> None:
        """Every check once, naming its key (ValueError: the registry words it as a params error)."""
        self._check_vae()
        if self.latent_size is None:
            self.latent_size = self._vae_value("latent_size")
        if self.latent_channels is None:
            self.latent_channels = self._vae_value("latent_channels")
        for name in ("latent_size", "patch_size"):
            value = getattr(self, name)
            if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value)):
                raise ValueError(f"{name}: expected [height, width] of positive integers, got {value!r}")
        for i, (size, patch) in enumerate(zip(self.latent_size, self.patch_size)):
            if size % patch:
                raise ValueError(f"patch_size: {self.patch_size} does not divide latent_size {self.latent_size} "
                                 f"({'height' if i == 0 else 'width'})")
        for name in ("hidden_size", "num_hidden_layers", "num_heads", "filter_size", "frequency_embedding_size",
                     "num_classes", "num_diffusion_steps", "latent_channels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads: {self.num_heads} does not divide hidden_size {self.hidden_size}")
        if self.position_embedding_type == "fixed" and self.hidden_size % 4:
            raise ValueError(f"hidden_size: {self.hidden_size}; fixed 2-D position embeddings need a multiple of 4 "
                             "(sin and cos of rows and of columns)")
        for name in ("dropout_rate", "attention_dropout_rate", "embedding_dropout_rate", "label_dropout_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}: must be in [0, 1], got {getattr(self, name)}")
        for name in ("nonlinearity", "embedding_nonlinearity", "encoder_nonlinearity"):
            if getattr(self, name).lower() not in ACTIVATIONS:
                raise ValueError(f"{name}: unknown {getattr(self, name)!r}; expected one of {', '.join(ACTIVATIONS)}")
        choices = {"position_embedding_type": ("learned", "fixed", None), "block_type": ("adaln_zero",),
                   "attention_type": ("dot_product", "scaled_dot_product"), "schedule_name": ("linear",)}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: {getattr(self, name)!r} is not one of {', '.join(map(str, allowed))}")
        if not 0.0 < self.beta_start <= self.beta_end <= 1.0 or self.beta_end * 1000 / self.num_diffusion_steps > 1.0:
            raise ValueError(f"beta_start, beta_end: {self.beta_start}, {self.beta_end} must satisfy 0 < beta_start <= "
                             f"beta_end and every scaled beta (x 1000 / num_diffusion_steps) <= 1")
        if self.reverse_process is not None:
            if not isinstance(self.reverse_process, dict):
                raise ValueError(f"reverse_process: expected a mapping, got {self.reverse_process!r}")
            for name in self.reverse_process:
                if name not in _REVERSE_PROCESS_KEYS:
                    raise ValueError(f"reverse_process.{name}: unknown key; expected one of "
                                     f"{', '.join(_REVERSE_PROCESS_KEYS)}")
        if self.init_conv_like_linear is None:
            self.init_conv_like_linear = self.use_conv_patchified_embedding
        normal = {"name": "normal", "mean": 0.0, "std": self.initializer_range}
        for name in ("timestep_embedding_initializer", "label_embedding_initializer"):
            if getattr(self, name) is None:
                setattr(self, name, normal)
        if self.position_embedding_initializer is None:
            r = self.initializer_range
            self.position_embedding_initializer = {"name": "truncated_normal", "mean": 0.0, "std": r,
                                                   "a": -2 * r, "b": 2 * r}
        for name in ("projection_initializer", "position_embedding_initializer", "attention_initializer",
                     "ffn_initializer", "timestep_embedding_initializer", "label_embedding_initializer",
                     "head_initializer"):
            setattr(self, name, initializer_spec(getattr(self, name), name))

    def _check_vae(self) -> None:
        if self.vae is None:
            return
        if not isinstance(self.vae, dict):
            raise ValueError(f"vae: expected a mapping of the VAE's keys, got {self.vae!r}")
        for name in self.vae:
            if name not in VAE_KEYS:
                raise ValueError(f"vae.{name}: unknown key; expected one of {', '.join(VAE_KEYS)}")
        self.vae = {**VAE_KEYS, **self.vae}
        scale = self.vae["scaling_factor"]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0:
            raise ValueError(f"vae.scaling_factor: expected a positive number, got {scale!r}")

    def _vae_value(self, name: str):
        if self.vae is None:
            raise ValueError(f"{name}: not set and no vae section to take it from; set model.{name} or "
                             f"model.vae.{name}")
        return self.vae[name]

    @property
    def vae_scaling_factor(self) -> float:
        """The factor the data scales sampled latents by (VAEConfig's default without a vae section)."""
        return float((self.vae or VAE_KEYS)["scaling_factor"])
