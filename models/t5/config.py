"""The t5 ``model:`` keys, declared once: names, types and Model Zoo 2.10 defaults (t5_model.py
T5ForConditionalGenerationModelConfig plus model.py T5ModelConfig's loss keys). :meth:`T5Config.__post_init__`
applies the vendor's post_init (tgt_vocab_size, decoder layers, relu dropout and decoder activation default
to their encoder twins) and checks every key once, naming it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["T5Config", "T5_ACTIVATIONS", "LOSS_SCALINGS"]

T5_ACTIVATIONS = ("relu", "gelu", "reglu", "geglu", "swiglu")
"""t5_model.py's accepted encoder/decoder nonlinearities."""
LOSS_SCALINGS = ("num_masked", "precomputed_num_masked", "batch_size")
_POSITIONS = ("relative", "fixed", None)
_NORMS = ("layernorm", "rmsnorm")


def key(default: Any, since: str, doc: str) -> Any:
    """A ``model:`` key's field: its default (a list or dict copied), the first Model Zoo release whose t5 model
    code, params files or loss name it (``git grep -w`` of each tag from R_1.6.0), its meaning."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"since": since, "doc": doc})
    return field(default=default, metadata={"since": since, "doc": doc})


@dataclass
class T5Config:
    """``model.name: t5``: encoder-decoder with relative attention bias, shared embeddings, LM head."""

    src_vocab_size: int = key(32128, "1.6.0", "source vocabulary (extra_ids are added to it)")
    tgt_vocab_size: Optional[int] = key(None, "1.6.0", "target vocabulary; None: src_vocab_size")
    extra_ids: int = key(0, "1.6.0", "sentinel tokens appended to both vocabularies")
    d_model: int = key(512, "1.6.0", "model width")
    d_kv: int = key(64, "1.6.0", "q/k/v width per head (need not be d_model / num_heads)")
    d_ff: int = key(2048, "1.6.0", "FFN inner width")
    encoder_num_hidden_layers: int = key(6, "1.6.0", "encoder layers")
    decoder_num_hidden_layers: Optional[int] = key(None, "1.6.0", "decoder layers; None: encoder_num_hidden_layers")
    num_heads: int = key(8, "1.6.0", "attention heads")
    relative_attention_num_buckets: int = key(32, "1.6.0", "relative position buckets (max distance 128)")
    norm_type: str = key("rmsnorm", "2.0.2", "rmsnorm (T5's) or layernorm")
    use_t5_layer_norm: Optional[bool] = key(None, "1.6.0", "Releases 1.6-1.9's norm switch, norm_type since 2.0: "
                                            "true rmsnorm (T5LayerNorm), false layernorm")
    dropout_rate: float = key(0.1, "1.6.0", "dropout of every residual branch and around the stacks")
    relu_dropout_rate: Optional[float] = key(None, "1.6.0", "encoder FFN inner dropout; None: dropout_rate")
    layer_norm_epsilon: float = key(1e-5, "1.6.0", "the norms' epsilon")
    initializer_factor: float = key(1.0, "1.7.0", "factor on every initializer's std")
    encoder_nonlinearity: str = key("relu", "1.6.0", "FFN activation (relu, gelu, reglu, geglu, swiglu)")
    decoder_nonlinearity: Optional[str] = key(None, "1.6.0", "read and checked; the vendor's decoder uses "
                                              "encoder_nonlinearity")
    use_projection_bias_in_attention: bool = key(False, "1.6.0", "q/k/v biases")
    attention_softmax_fp32: bool = key(True, "1.8.0", "softmax in float32 under mixed precision")
    attention_kernel: Optional[str] = key(None, "1.9.1", "a Cerebras attention kernel; same attention here")
    enable_vts: bool = key(False, "1.6.0", "set by Releases 1.6-1.8's files: strip the padding on Cerebras hardware "
                           "(cbtorch StripPadding, training only); the padding is masked either way, same loss here")
    use_cache: bool = key(False, "1.7.0", "inference key/value cache (refused: training only)")
    decoder_start_token_id: Optional[int] = key(None, "1.7.0", "read by no forward here (the data shifts labels)")
    pad_token_id: int = key(0, "1.7.0", "the pad token")
    position_embedding_type: Optional[str] = key("relative", "1.6.0", "relative (T5), fixed (sin-cos) or None")
    src_max_position_embeddings: Optional[int] = key(None, "1.6.0", "longest source (fixed positions)")
    tgt_max_position_embeddings: Optional[int] = key(None, "1.6.0", "longest target (fixed positions)")
    use_dropout_outside_residual_path: bool = key(True, "1.6.0", "dropout after each stack's final norm")
    share_encoder_decoder_embedding: bool = key(True, "1.6.0", "one token embedding for encoder and decoder")
    share_embedding_weights: bool = key(True, "1.6.0", "tie the LM head to the embedding (logits * d_model^-0.5)")
    tie_encoder_decoder: bool = key(False, "1.7.0", "refused, as the vendor refuses it")
    use_pre_encoder_decoder_dropout: bool = key(False, "1.6.0", "an extra dropout after the embeddings")
    use_pre_encoder_decoder_layer_norm: bool = key(True, "1.6.0", "pre-norm blocks (post-norm when false)")
    use_ffn_bias: bool = key(False, "1.6.0", "FFN biases (forced off with gelu, as the vendor does)")
    label_smoothing: float = key(0.0, "1.6.0", "label smoothing of the training loss")
    use_transformer_initialization: bool = key(False, "1.6.0", "the Transformer's scaled Xavier initializers and "
                                               "scaled dot-product attention")
    lr_adjustment_groups: Optional[dict] = key(None, "2.3.0", "muP LR groups (set by the model; refused)")
    mup_base_d_model: Optional[int] = key(None, "2.3.0", "muP base width: with mup_base_d_ff, a muP run")
    mup_base_d_ff: Optional[int] = key(None, "2.3.0", "muP base FFN width (muP needs it with mup_base_d_model)")
    mup_base_d_kv: Optional[int] = key(None, "2.3.0", "muP base head width: q/k/v as hidden weights")
    embeddings_alpha: Optional[float] = key(1.0, "2.3.0", "factor on the embeddings (muP: times d_model**0.5)")
    encoder_attention_logits_alpha: float = key(1.0, "2.3.0", "factor on the encoder attention logits")
    decoder_attention_logits_alpha: float = key(1.0, "2.3.0", "factor on the decoder attention logits")
    scale_encoder_qk_dot_by_d: Optional[bool] = key(None, "2.3.0", "encoder logits / d, not sqrt(d) (scaled only)")
    scale_decoder_qk_dot_by_d: Optional[bool] = key(None, "2.3.0", "decoder logits / d, not sqrt(d) (scaled only)")
    scale_output_logits_by_d: bool = key(False, "2.3.0", "muP output scaling (muP only)")
    output_logits_alpha: Optional[float] = key(None, "2.3.0", "muP output factor (muP only; None: 1.0)")
    attention_module: str = key("aiayn_attention", "2.1.0", "aiayn_attention only here")
    extra_attention_params: dict = key({}, "1.9.1", "multiquery settings (refused)")
    dtype: Optional[str] = key(None, "1.6.0", "embedding dtype; it follows the run's precision here")
    mlm_loss_scaling: str = key("batch_size", "1.7.0", "num_masked, precomputed_num_masked (batch loss_weight) or "
                                "batch_size (times lm_loss_weight)")
    lm_loss_weight: float = key(1.0, "1.6.0", "factor of batch_size scaling: 1 / mean target tokens")
    compute_eval_metrics: bool = key(True, "1.6.0", "eval/accuracy_lm and eval/perplexity_lm")

    def __post_init__(self) -> None:
        """The vendor's post_init, then every check once (ValueError naming the key)."""
        if self.tgt_vocab_size is None:
            self.tgt_vocab_size = self.src_vocab_size
        if self.decoder_num_hidden_layers is None:
            self.decoder_num_hidden_layers = self.encoder_num_hidden_layers
        if self.relu_dropout_rate is None:
            self.relu_dropout_rate = self.dropout_rate
        if self.decoder_nonlinearity is None:
            self.decoder_nonlinearity = self.encoder_nonlinearity
        if self.use_t5_layer_norm is not None:  # R_1.6-1.9 t5/model.py: RMSNorm if use_t5_layer_norm else LayerNorm
            if self.use_t5_layer_norm and self.norm_type == "layernorm":
                raise ValueError("use_t5_layer_norm: true asks for rmsnorm and norm_type is layernorm; give one of "
                                 "them (norm_type since Release 2.0)")
            self.norm_type = "rmsnorm" if self.use_t5_layer_norm else "layernorm"
        for name in ("src_vocab_size", "tgt_vocab_size"):
            if not 1 <= getattr(self, name) <= 512000:
                raise ValueError(f"{name}: must be in [1, 512000], got {getattr(self, name)}")
        for name in ("d_model", "d_kv", "d_ff", "num_heads", "relative_attention_num_buckets"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("extra_ids", "encoder_num_hidden_layers", "decoder_num_hidden_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        for name in ("dropout_rate", "relu_dropout_rate", "label_smoothing"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}: must be in [0, 1], got {getattr(self, name)}")
        for name in ("encoder_nonlinearity", "decoder_nonlinearity"):
            if getattr(self, name) not in T5_ACTIVATIONS:
                raise ValueError(f"{name}: {getattr(self, name)!r} is not one of {', '.join(T5_ACTIVATIONS)}")
        choices = {"norm_type": _NORMS, "position_embedding_type": _POSITIONS, "mlm_loss_scaling": LOSS_SCALINGS,
                   "attention_module": ("aiayn_attention",)}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: {getattr(self, name)!r} is not one of "
                                 f"{', '.join(str(a) for a in allowed)} (t5 in cs-run)")
        if self.position_embedding_type == "fixed":
            for name in ("src_max_position_embeddings", "tgt_max_position_embeddings"):
                if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                    raise ValueError(f"{name}: fixed position embeddings need a length, got {getattr(self, name)!r}")
        if self.share_encoder_decoder_embedding and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(f"share_encoder_decoder_embedding: src_vocab_size {self.src_vocab_size} != "
                             f"tgt_vocab_size {self.tgt_vocab_size}; set it false or make them equal")
        refused = {"tie_encoder_decoder": self.tie_encoder_decoder, "use_cache": self.use_cache,
                   "extra_attention_params": {k: v for k, v in (self.extra_attention_params or {}).items()
                                              if k != "attention_kernel"},
                   "lr_adjustment_groups": self.lr_adjustment_groups}
        for name, value in refused.items():
            if value:
                raise ValueError(f"{name}: {value!r} is not supported by cs-run's t5 (leave it at its default)")
        if self.layer_norm_epsilon <= 0 or self.initializer_factor <= 0:
            raise ValueError("layer_norm_epsilon / initializer_factor: must be > 0")
        self._check_mup()

    @property
    def is_mup(self) -> bool:
        """A muP run (the vendor's is_mup: any mup_base_* key set)."""
        return any(getattr(self, k) for k in ("mup_base_d_model", "mup_base_d_ff", "mup_base_d_kv"))

    def _check_mup(self) -> None:
        """t5_model.py's post_init rules for the mup_base_* keys."""
        for name in ("mup_base_d_model", "mup_base_d_ff", "mup_base_d_kv"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}: the base model's width, an integer >= 1, got {value!r}")
        if not self.is_mup:
            return
        if self.use_transformer_initialization:
            raise ValueError("use_transformer_initialization: t5's muP (mup_base_* keys) needs T5's initializers; "
                             "set it false or drop the mup_base_* keys")
        for name in ("mup_base_d_model", "mup_base_d_ff"):
            if not getattr(self, name):
                raise ValueError(f"{name}: muP needs both mup_base_d_model and mup_base_d_ff (the vendor's rule)")
