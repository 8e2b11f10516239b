"""The Model Zoo GPT-2: a pre-LayerNorm decoder built from torch.nn blocks and scaled_dot_product_attention.

The ``model:`` keys of a Model Zoo GPT-2 params file are the parameters of :func:`build_model`, with
the Model Zoo's meanings and defaults (Release 1.9 ``gpt2/model.py`` and ``gpt2_model.py``). Module
and parameter names follow the Model Zoo's (``model.transformer_decoder.layers.0.self_attn.
proj_q_dense_layer.weight``), so checkpoints line up key for key.

The batch is the Model Zoo's dict of int32 tensors ``input_ids``, ``attention_mask``, ``labels``;
``attention_mask`` is a *loss* mask (attention is always causal), as in the Model Zoo.
"""

from __future__ import annotations

import logging
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from cs_run.metrics import AccuracyMetric, PerplexityMetric

logger = logging.getLogger(__name__)

__all__ = ["GPT2LMHeadModel", "Gpt2Model", "build_model", "model_defaults", "ACTIVATIONS", "POSITION_EMBEDDING_TYPES"]


def _gelu_new(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _gelu_fast(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def _squared_gelu(x: torch.Tensor) -> torch.Tensor:
    g = F.gelu(x)
    return g * g


# The Model Zoo's non-GLU activations (model_utils/activations.py), by their params names.
ACTIVATIONS = {
    "relu": F.relu,
    "leaky_relu": F.leaky_relu,
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "tanh": torch.tanh,
    "gelu_new": _gelu_new,
    "gelu_fast": _gelu_fast,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "squared_gelu": _squared_gelu,
    "mish": F.mish,
    "linear": lambda x: x,
}
POSITION_EMBEDDING_TYPES = ("learned", "fixed")
ATTENTION_TYPES = ("scaled_dot_product", "dot_product")
LOSS_SCALINGS = ("num_tokens", "batch_size")


def _trunc_normal_(tensor: torch.Tensor, std: float) -> None:
    """The Model Zoo's ``truncated_normal`` initializer: mean 0, cut at two standard deviations."""
    nn.init.trunc_normal_(tensor, mean=0.0, std=std, a=-2 * std, b=2 * std)


def fixed_position_embeddings(seq_len: int, width: int, min_timescale: float = 1.0,
                              max_timescale: float = 1.0e4) -> torch.Tensor:
    """Sinusoids with sin/cos interleaved per timescale (tensor2tensor's layout, as the Model Zoo)."""
    position = torch.arange(seq_len, dtype=torch.float32)
    n = width // 2
    increment = math.log(max_timescale / min_timescale) / max(n - 1, 1)
    inv = min_timescale * torch.exp(torch.arange(n, dtype=torch.float32) * -increment)
    scaled = position[:, None] * inv[None, :]
    signal = torch.stack([torch.sin(scaled), torch.cos(scaled)], dim=2).reshape(seq_len, 2 * n)
    return F.pad(signal, (0, width % 2))


class EmbeddingLayer(nn.Module):
    """Token embeddings plus learned or fixed position embeddings (or none)."""

    def __init__(self, vocab_size: int, hidden_size: int, max_position_embeddings: int,
                 position_embedding_type: Optional[str]) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size)
        self.position_embedding_type = position_embedding_type
        if position_embedding_type == "learned":
            self.position_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
        elif position_embedding_type == "fixed":
            self.register_buffer("position_embeddings", fixed_position_embeddings(max_position_embeddings,
                                                                                  hidden_size))
        else:
            self.position_embeddings = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        length = input_ids.shape[1]
        if self.position_embedding_type == "learned":
            x = x + self.position_embeddings.weight[:length]
        elif self.position_embedding_type == "fixed":
            x = x + self.position_embeddings[:length].to(x.dtype)
        return x


class MultiheadAttention(nn.Module):
    """Causal self-attention: separate q/k/v projections (Model Zoo layout), fused SDPA kernel."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float, scaled: bool, use_projection_bias: bool,
                 use_ffn_bias: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.dropout = dropout
        self.scale = 1.0 / math.sqrt(hidden_size // num_heads) if scaled else 1.0
        self.proj_q_dense_layer = nn.Linear(hidden_size, hidden_size, bias=use_projection_bias)
        self.proj_k_dense_layer = nn.Linear(hidden_size, hidden_size, bias=use_projection_bias)
        self.proj_v_dense_layer = nn.Linear(hidden_size, hidden_size, bias=use_projection_bias)
        self.proj_output_dense_layer = nn.Linear(hidden_size, hidden_size, bias=use_ffn_bias)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        return x.view(b, s, self.num_heads, h // self.num_heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self._heads(self.proj_q_dense_layer(x))
        k = self._heads(self.proj_k_dense_layer(x))
        v = self._heads(self.proj_v_dense_layer(x))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale,
                                             dropout_p=self.dropout if self.training else 0.0)
        b, _, s, _ = out.shape
        return self.proj_output_dense_layer(out.transpose(1, 2).reshape(b, s, -1))


class _DenseLayer(nn.Module):
    """One Model Zoo ``SingleFeedForwardLayer``: Linear, optional activation, optional dropout."""

    def __init__(self, inputs: int, outputs: int, bias: bool, activation=None, dropout: float = 0.0) -> None:
        super().__init__()
        self.linear_layer = nn.Linear(inputs, outputs, bias=bias)
        self.activation = activation
        self.dropout_layer = nn.Dropout(dropout) if dropout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear_layer(x)
        if self.activation is not None:
            x = self.activation(x)
        return self.dropout_layer(x) if self.dropout_layer is not None else x


class FeedForwardNetwork(nn.Module):
    def __init__(self, hidden_size: int, filter_size: int, activation, dropout: float, bias: bool) -> None:
        super().__init__()
        # GPT-2 has no dropout after the first layer (use_ff_layer1_dropout=False in the Model Zoo).
        self.ffn = nn.ModuleList([_DenseLayer(hidden_size, filter_size, bias, activation),
                                  _DenseLayer(filter_size, hidden_size, bias, None, dropout)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.ffn:
            x = layer(x)
        return x


class TransformerDecoderLayer(nn.Module):
    """Pre-LN block: x + dropout(attn(norm1(x))), then x + ffn(norm3(x)) (Model Zoo names)."""

    def __init__(self, hidden_size: int, num_heads: int, filter_size: int, activation, dropout: float,
                 attention_dropout: float, layer_norm_epsilon: float, scaled: bool,
                 use_projection_bias_in_attention: bool, use_ffn_bias_in_attention: bool, use_ffn_bias: bool) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, eps=layer_norm_epsilon)
        self.self_attn = MultiheadAttention(hidden_size, num_heads, attention_dropout, scaled,
                                            use_projection_bias_in_attention, use_ffn_bias_in_attention)
        self.dropout1 = nn.Dropout(dropout)
        self.norm3 = nn.LayerNorm(hidden_size, eps=layer_norm_epsilon)
        self.ffn = FeedForwardNetwork(hidden_size, filter_size, activation, dropout, use_ffn_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout1(self.self_attn(self.norm1(x)))
        return x + self.ffn(self.norm3(x))


class TransformerDecoder(nn.Module):
    def __init__(self, layers: list[nn.Module], norm: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class GPT2LMHeadModel(nn.Module):
    """Embeddings, ``num_hidden_layers`` pre-LN decoder blocks, final LayerNorm, LM head -> logits."""

    def __init__(self, *, vocab_size: int, hidden_size: int, num_hidden_layers: int, num_heads: int,
                 filter_size: int, max_position_embeddings: int = 1024,
                 position_embedding_type: Optional[str] = "learned", share_embedding_weights: bool = True,
                 embedding_dropout_rate: float = 0.1, dropout_rate: float = 0.1, attention_dropout_rate: float = 0.1,
                 layer_norm_epsilon: float = 1e-5, attention_type: str = "scaled_dot_product",
                 use_projection_bias_in_attention: bool = True, use_ffn_bias_in_attention: bool = True,
                 nonlinearity: str = "gelu", use_ffn_bias: bool = True, use_bias_in_output: bool = False,
                 embedding_layer_norm: bool = False, embeddings_scale: float = 1.0,
                 output_logits_scale: Optional[float] = None, initializer_range: float = 0.02) -> None:
        super().__init__()
        self.config = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                           num_heads=num_heads, filter_size=filter_size,
                           max_position_embeddings=max_position_embeddings,
                           position_embedding_type=position_embedding_type,
                           share_embedding_weights=share_embedding_weights, layer_norm_epsilon=layer_norm_epsilon,
                           attention_type=attention_type, nonlinearity=nonlinearity,
                           use_projection_bias_in_attention=use_projection_bias_in_attention,
                           use_ffn_bias_in_attention=use_ffn_bias_in_attention, use_ffn_bias=use_ffn_bias,
                           use_bias_in_output=use_bias_in_output, embedding_layer_norm=embedding_layer_norm,
                           embeddings_scale=embeddings_scale, output_logits_scale=output_logits_scale)
        self.max_position_embeddings = max_position_embeddings
        self.embeddings_scale = embeddings_scale
        self.output_logits_scale = output_logits_scale
        self.embedding_layer = EmbeddingLayer(vocab_size, hidden_size, max_position_embeddings,
                                              position_embedding_type)
        self.embedding_ln_f = nn.LayerNorm(hidden_size, eps=layer_norm_epsilon) if embedding_layer_norm else None
        self.drop_embd = nn.Dropout(embedding_dropout_rate)
        activation = ACTIVATIONS[nonlinearity]
        layers = [TransformerDecoderLayer(hidden_size, num_heads, filter_size, activation, dropout_rate,
                                          attention_dropout_rate, layer_norm_epsilon,
                                          attention_type == "scaled_dot_product", use_projection_bias_in_attention,
                                          use_ffn_bias_in_attention, use_ffn_bias)
                  for _ in range(num_hidden_layers)]
        # ln_f and transformer_decoder.norm are one module, registered under both names as in the Model Zoo.
        self.ln_f = nn.LayerNorm(hidden_size, eps=layer_norm_epsilon)
        self.transformer_decoder = TransformerDecoder(layers, self.ln_f)
        self.lm_head = nn.Linear(hidden_size, vocab_size, bias=use_bias_in_output)
        self.share_embedding_weights = share_embedding_weights
        self._init_weights(initializer_range, num_hidden_layers)
        self.tie_weights()

    def _init_weights(self, std: float, num_layers: int) -> None:
        """The Model Zoo's defaults: truncated normal(std) everywhere, std/sqrt(2L) for the output
        projections of attention and FFN, zero biases, unit LayerNorms, normal(std) for an untied head."""
        with torch.no_grad():
            _trunc_normal_(self.embedding_layer.word_embeddings.weight, std)
            if isinstance(self.embedding_layer.position_embeddings, nn.Embedding):
                _trunc_normal_(self.embedding_layer.position_embeddings.weight, std)
            out_std = std / math.sqrt(2 * num_layers) if num_layers else std
            for layer in self.transformer_decoder.layers:
                attn = layer.self_attn
                for linear in (attn.proj_q_dense_layer, attn.proj_k_dense_layer, attn.proj_v_dense_layer):
                    _trunc_normal_(linear.weight, std)
                _trunc_normal_(attn.proj_output_dense_layer.weight, out_std)
                _trunc_normal_(layer.ffn.ffn[0].linear_layer.weight, std)
                _trunc_normal_(layer.ffn.ffn[1].linear_layer.weight, out_std)
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.zero_()
                elif isinstance(module, nn.LayerNorm):
                    module.weight.fill_(1.0)
                    module.bias.zero_()
            if not self.share_embedding_weights:
                self.lm_head.weight.normal_(0.0, std)

    def tie_weights(self) -> None:
        """The LM head reuses the token embedding matrix (share_embedding_weights)."""
        if self.share_embedding_weights:
            self.lm_head.weight = self.embedding_layer.word_embeddings.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] > self.max_position_embeddings:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds model.max_position_embeddings "
                             f"({self.max_position_embeddings}); raise it or write shorter sequences")
        x = self.embedding_layer(input_ids)
        if self.embedding_ln_f is not None:
            x = self.embedding_ln_f(x)
        if self.embeddings_scale != 1.0:
            x = x * self.embeddings_scale
        x = self.drop_embd(x)
        logits = self.lm_head(self.transformer_decoder(x))
        if self.output_logits_scale:
            logits = logits * self.output_logits_scale
        return logits


class Gpt2Model(nn.Module):
    """GPT2LMHeadModel with the Model Zoo's LM loss and eval metrics: ``forward(batch) -> loss``.

    Loss: per-token cross entropy times the loss mask, summed, then divided by the number of unmasked
    tokens (``loss_scaling: num_tokens``) or by the batch size and multiplied by ``loss_weight``
    (``loss_scaling: batch_size``). In eval mode it also updates ``eval/accuracy`` (weighted by the
    loss mask) and ``eval/lm_perplexity`` (from the unscaled summed loss).
    """

    def __init__(self, loss_scaling: str = "num_tokens", loss_weight: float = 1.0, compute_eval_metrics: bool = True,
                 **model_kwargs) -> None:
        super().__init__()
        self.model = GPT2LMHeadModel(**model_kwargs)
        self.vocab_size = model_kwargs["vocab_size"]
        self.loss_scaling = loss_scaling
        self.loss_weight = loss_weight
        self.accuracy_metric = self.perplexity_metric = None
        if compute_eval_metrics:
            self.perplexity_metric = PerplexityMetric("eval/lm_perplexity")
            self.accuracy_metric = AccuracyMetric("eval/accuracy")

    def forward(self, batch: dict) -> torch.Tensor:
        input_ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
        logits = self.model(input_ids)
        token_loss = F.cross_entropy(logits.float().reshape(-1, self.vocab_size), labels.reshape(-1).long(),
                                     reduction="none")
        weights = mask.reshape(-1).to(torch.float32)
        summed = torch.sum(token_loss * weights)
        if self.loss_scaling == "num_tokens":
            loss = summed / torch.sum(weights)
        else:
            loss = summed / labels.shape[0] * self.loss_weight
        if not self.training and self.accuracy_metric is not None:
            lm_weights = mask.to(torch.float32)
            self.accuracy_metric(labels=labels.clone(), predictions=logits.argmax(-1).int(), weights=lm_weights)
            self.perplexity_metric(labels=labels.clone(), loss=summed.detach(), weights=lm_weights)
        return loss


def model_defaults(model: dict) -> None:
    """The Model Zoo GPT-2's params defaults (gpt2/utils.py set_defaults): mixed precision is bfloat16."""
    if model.get("mixed_precision"):
        model.setdefault("use_bfloat16", True)


def _choice(key: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{key}: {value!r} is not supported by cs-run's gpt2; expected one of "
                         f"{', '.join(map(str, choices))}")


def build_model(vocab_size: int, hidden_size: int, num_hidden_layers: int, num_heads: int, filter_size: int,
                dropout_rate: float, attention_type: str, max_position_embeddings: int = 1024,
                use_position_embedding: bool = True, position_embedding_type: str = "learned",
                share_embedding_weights: bool = True, embedding_dropout_rate: Optional[float] = None,
                attention_dropout_rate: Optional[float] = None, layer_norm_epsilon: float = 1.0e-5,
                use_projection_bias_in_attention: bool = True, use_ffn_bias_in_attention: bool = True,
                nonlinearity: str = "gelu", use_ffn_bias: bool = True, use_bias_in_output: bool = False,
                loss_scaling: str = "num_tokens", loss_weight: float = 1.0, embedding_layer_norm: bool = False,
                embeddings_scale: float = 1.0, output_logits_scale: Optional[float] = None,
                initializer_range: float = 0.02, compute_eval_metrics: bool = True) -> Gpt2Model:
    """Model function of ``model.name: gpt2``; its parameters are the Model Zoo GPT-2 ``model:`` keys.

    Required keys are those the Model Zoo requires (sizes, ``dropout_rate``, ``attention_type``);
    ``embedding_dropout_rate`` and ``attention_dropout_rate`` default to ``dropout_rate``.
    Raises ValueError naming the key for values this implementation does not support (rotary, ALiBi
    and relative position embeddings, GLU activations, other loss scalings).
    """
    _choice("attention_type", attention_type, ATTENTION_TYPES)
    _choice("position_embedding_type", position_embedding_type, POSITION_EMBEDDING_TYPES)
    _choice("nonlinearity", nonlinearity, list(ACTIVATIONS))
    loss_scaling = loss_scaling.lower()
    _choice("loss_scaling", loss_scaling, LOSS_SCALINGS)
    for key, value in (("vocab_size", vocab_size), ("hidden_size", hidden_size), ("num_heads", num_heads),
                       ("filter_size", filter_size), ("max_position_embeddings", max_position_embeddings)):
        if value < 1:
            raise ValueError(f"{key}: must be >= 1, got {value}")
    if num_hidden_layers < 0:
        raise ValueError(f"num_hidden_layers: must be >= 0, got {num_hidden_layers}")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size: {hidden_size} is not divisible by num_heads ({num_heads})")
    if position_embedding_type == "fixed" and hidden_size < 4:
        raise ValueError("hidden_size: fixed position embeddings need hidden_size >= 4")
    embedding_dropout_rate = dropout_rate if embedding_dropout_rate is None else embedding_dropout_rate
    attention_dropout_rate = dropout_rate if attention_dropout_rate is None else attention_dropout_rate
    for key, value in (("dropout_rate", dropout_rate), ("embedding_dropout_rate", embedding_dropout_rate),
                       ("attention_dropout_rate", attention_dropout_rate)):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{key}: must be in [0, 1), got {value}")
    if loss_scaling == "num_tokens" and loss_weight != 1.0:
        logger.warning("model.loss_weight=%s has no effect with loss_scaling 'num_tokens' (the loss is divided by "
                       "the number of tokens); using 1.0, as the Model Zoo does", loss_weight)
        loss_weight = 1.0
    if loss_weight <= 0:
        raise ValueError(f"loss_weight: must be > 0, got {loss_weight}")
    return Gpt2Model(
        loss_scaling=loss_scaling, loss_weight=float(loss_weight), compute_eval_metrics=compute_eval_metrics,
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers, num_heads=num_heads,
        filter_size=filter_size, max_position_embeddings=max_position_embeddings,
        position_embedding_type=position_embedding_type if use_position_embedding else None,
        share_embedding_weights=share_embedding_weights, embedding_dropout_rate=embedding_dropout_rate,
        dropout_rate=dropout_rate, attention_dropout_rate=attention_dropout_rate,
        layer_norm_epsilon=float(layer_norm_epsilon), attention_type=attention_type,
        use_projection_bias_in_attention=use_projection_bias_in_attention,
        use_ffn_bias_in_attention=use_ffn_bias_in_attention, nonlinearity=nonlinearity, use_ffn_bias=use_ffn_bias,
        use_bias_in_output=use_bias_in_output, embedding_layer_norm=embedding_layer_norm,
        embeddings_scale=float(embeddings_scale), output_logits_scale=output_logits_scale,
        initializer_range=float(initializer_range))
