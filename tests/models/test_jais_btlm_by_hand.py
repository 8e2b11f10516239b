"""jais and btlm (not in transformers) against a hand computation of the Model Zoo's formulas.

Both families are the Model Zoo's GPT-2 decoder under their names (Release_2.10.0 models/nlp/jais and
btlm: ``Gpt2Model``), with their params files' features: ALiBi (``layers/AlibiPositionEmbeddingLayer``:
the paper's slopes, ``-slope / pos_scaling_factor * |i - j|``), SwiGLU (``layers/activations.swiglu``:
``linear_layer(x) * silu(linear_layer_for_glu(x))``), biases everywhere, tied embeddings and muP
(``gpt2_model.py``: embeddings times ``embeddings_scale``; ``AttentionLayer``: q and, with
``scale_qk_dot_by_d``, k each divided by sqrt(head_dim), logits times ``attention_logits_alpha``; output
logits times ``output_logits_alpha / (hidden_size / mup_base_hidden_size)``) and the loss of
``loss_scaling: batch_size`` (summed token loss / batch size * ``loss_weight``).

The reference below is written with plain torch ops from those formulas, in float64, reading only the
model's weights by their Model Zoo names (never its modules); the model runs in float32, so the two
agree to float32 rounding over 2 layers: 1e-5 relative and absolute, far below any formula difference
(dropping scale_qk_dot_by_d, the ALiBi scaling, attention_logits_alpha or changing
output_logits_alpha moves the logits by 1e-3 to 1e-1 here).
"""

from __future__ import annotations

import math

import pytest
import torch
from hf_helpers import build

VOCAB, SEQ, BATCH = 97, 12, 3

JAIS = dict(name="jais", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_heads=4, filter_size=40,
            max_position_embeddings=SEQ, position_embedding_type="alibi", nonlinearity="swiglu",
            norm_type="layernorm", layer_norm_epsilon=1e-5, use_ffn_bias=True, use_ffn_bias_in_attention=True,
            use_projection_bias_in_attention=True, share_embedding_weights=True, use_bias_in_output=False,
            dropout_rate=0.0, attention_dropout_rate=0.0, attention_type="scaled_dot_product",
            embeddings_scale=14.6, mup_base_hidden_size=8, mup_base_filter_size=10.0, output_logits_alpha=2.22,
            scale_qk_dot_by_d=True, loss_scaling="batch_size", loss_weight=1 / SEQ)
# btlm: six heads (the slopes of a head count that is not a power of two) and ALiBi position scaling
BTLM = {**JAIS, "name": "btlm", "hidden_size": 48, "num_heads": 6, "filter_size": 64, "mup_base_hidden_size": 16,
        "pos_scaling_factor": 2.0, "attention_logits_alpha": 0.7}


def _slopes(n: int) -> list[float]:
    """AlibiPositionEmbeddingLayer._get_alibi_slopes."""
    if math.log2(n).is_integer():
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    closest = 2 ** math.floor(math.log2(n))
    return _slopes(closest) + _slopes(2 * closest)[0::2][: n - closest]


def _layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def _hand(keys: dict, weights: dict, ids: torch.Tensor) -> torch.Tensor:
    """Logits of the Model Zoo's GPT-2 decoder for ``keys``, step by step."""
    w = {k.removeprefix("model."): v.double() for k, v in weights.items()}
    hidden, heads, eps = keys["hidden_size"], keys["num_heads"], keys["layer_norm_epsilon"]
    d = hidden // heads
    b, s = ids.shape
    x = w["embedding_layer.word_embeddings.weight"][ids] * keys["embeddings_scale"]
    dist = (torch.arange(s)[None, :] - torch.arange(s)[:, None]).abs().double()
    alibi = -torch.tensor(_slopes(heads)).double()[:, None, None] / keys.get("pos_scaling_factor", 1.0) * dist
    causal = torch.full((s, s), float("-inf")).triu(1).double()
    for i in range(keys["num_hidden_layers"]):
        p = f"transformer_decoder.layers.{i}."

        def linear(name, t, p=p):
            return t @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        h = _layer_norm(x, w[p + "norm1.weight"], w[p + "norm1.bias"], eps)
        q, k, v = (linear(f"self_attn.proj_{n}_dense_layer", h).view(b, s, heads, d).transpose(1, 2) for n in "qkv")
        k = k / math.sqrt(d)  # scale_qk_dot_by_d (muP): 1/d in all, with q's 1/sqrt(d) below
        q = q / math.sqrt(d)
        logits = keys.get("attention_logits_alpha", 1.0) * (q @ k.transpose(-1, -2)) + alibi + causal
        attn = (torch.softmax(logits, -1) @ v).transpose(1, 2).reshape(b, s, hidden)
        x = x + linear("self_attn.proj_output_dense_layer", attn)
        h = _layer_norm(x, w[p + "norm3.weight"], w[p + "norm3.bias"], eps)
        up, gate = linear("ffn.ffn.0.linear_layer", h), linear("ffn.ffn.0.linear_layer_for_glu", h)
        x = x + linear("ffn.ffn.1.linear_layer", up * torch.nn.functional.silu(gate))
    x = _layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], eps)
    width_mult = hidden / keys["mup_base_hidden_size"]
    return (x @ w["embedding_layer.word_embeddings.weight"].T) * (keys["output_logits_alpha"] / width_mult)


@pytest.mark.parametrize("keys", [pytest.param(JAIS, id="jais"), pytest.param(BTLM, id="btlm-6-heads-alibi-scaled")])
def test_logits_and_loss_equal_the_model_zoo_formulas_by_hand(keys):
    torch.manual_seed(0)
    model = build(keys)
    with torch.no_grad():  # unit norms and zero biases would hide a swapped or missing term
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(BATCH, SEQ, dtype=torch.int32)
    mask[1, 7:] = 0
    want = _hand(keys, dict(model.state_dict()), ids)
    with torch.no_grad():
        logits = model.model(ids)
        loss = model({"input_ids": ids.int(), "labels": labels.int(), "attention_mask": mask})
    torch.testing.assert_close(logits.double(), want, rtol=1e-5, atol=1e-5)
    token_loss = torch.nn.functional.cross_entropy(want.reshape(-1, VOCAB), labels.reshape(-1), reduction="none")
    want_loss = (token_loss * mask.reshape(-1)).sum() / BATCH * keys["loss_weight"]  # loss_scaling: batch_size
    torch.testing.assert_close(loss.double(), want_loss, rtol=1e-5, atol=1e-6)
    assert want.abs().max() > 1.0  # the scalings are exercised, not drowned in a near-zero output
