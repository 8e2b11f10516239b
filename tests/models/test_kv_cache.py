"""Incremental decoding with the KV cache (DecoderLM.decode) against the full forward, for every variation
the shared decoder layers build: a prompt's prefill then one token at a time gives, at each position, the
full forward's logits of the whole sequence (float32, 1e-5: the cached attention reduces over the same keys
in other shapes, a few ulps), alone and inside a left-padded batch."""

from __future__ import annotations

import pytest
import torch

from cs_run.errors import DataError
from cs_run.models.common.kv_cache import KVCache
from cs_run.models.common.lm import build_model
from cs_run.models.gptj.model import build_model as build_gptj

TOL = dict(rtol=1e-5, atol=1e-5)
V, SEQ = 61, 14
BASE = dict(vocab_size=V, hidden_size=32, num_heads=4, num_hidden_layers=2, filter_size=48,
            max_position_embeddings=32, dropout_rate=0.0, embedding_dropout_rate=0.0, attention_dropout_rate=0.0)
ROPE = dict(position_embedding_type="rotary", rotary_dim=8, norm_type="rmsnorm", nonlinearity="swiglu")
GQA = dict(attention_module="multiquery_attention", extra_attention_params={"num_kv_groups": 2})

VARIATIONS = {
    "gpt2-learned": {},
    "learned-offset-2": dict(position_embedding_offset=2),
    "fixed": dict(position_embedding_type="fixed"),
    "no-positions": dict(position_embedding_type=None),
    "rotary": ROPE,
    "rotary-partial": {**ROPE, "rotary_dim": 4, "rope_theta": 500.0},
    "rotary-linear": {**ROPE, "pos_scaling_type": "linear", "pos_scaling_factor": 2.0},
    "rotary-yarn": {**ROPE, "pos_scaling_type": "yarn", "pos_scaling_factor": 4.0,
                    "pos_scaling_extra_args": {"original_max_position_embeddings": 8}},
    "rotary-llama3": {**ROPE, "pos_scaling_type": "llama3", "pos_scaling_factor": 8.0,
                      "pos_scaling_extra_args": {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                 "original_max_position_embeddings": 8}},
    "rotary-longrope": {**ROPE, "pos_scaling_type": "longrope",
                        "pos_scaling_extra_args": {"original_max_position_embeddings": 8,
                                                   "long_factor": [1.0, 1.5, 2.0, 4.0]}},
    "alibi": dict(position_embedding_type="alibi"),
    "alibi-trainable-scaled": dict(position_embedding_type="alibi", alibi_trainable_slopes=True,
                                   pos_scaling_factor=2.0),
    "gqa": {**ROPE, **GQA},
    "mqa": {**ROPE, "attention_module": "multiquery_attention"},
    "sliding-window": {**ROPE, **GQA, "attention_sliding_window_length": 4},
    "sliding-window-sinks": {**ROPE, "attention_sliding_window_length": 4, "attention_sink_tokens": 2},
    "every-other-full-first": {**ROPE, "num_hidden_layers": 3, "attention_sliding_window_length": 3,
                               "sliding_window_every_other_decoder_layer": True},
    "every-other-sliding-first": {**ROPE, "num_hidden_layers": 3, "attention_sliding_window_length": 3,
                                  "sliding_window_every_other_decoder_layer": True,
                                  "sliding_window_every_other_decoder_layer_pattern": "sliding_window_first"},
    "gemma2": {**ROPE, **GQA, "attention_logit_softcapping": 5.0, "final_logit_softcapping": 3.0,
               "norm_first_sandwich": True, "attention_sliding_window_length": 4, "embeddings_scale": 5.6,
               "sliding_window_every_other_decoder_layer": True, "nonlinearity": "geglu"},
    "sink-logits": {**ROPE, "use_sink_token": True},
    "moe-shared": {**ROPE, "moe": {"num_experts": 4, "top_k": 2, "num_shared_experts": 1}},
    "mup-layer-idx-dot-product": dict(mup_base_hidden_size=16, mup_base_filter_size=24, embeddings_scale=2.0,
                                      scale_qk_dot_by_layer_idx=True, attention_type="dot_product",
                                      embedding_layer_norm=True),
    "no-layers-rotary": {**ROPE, "num_hidden_layers": 0},
    "gptj-parallel": "gptj",
    "falcon-parallel-tied-norm": "falcon",
}


def _model(name: str):
    keys = VARIATIONS[name]
    torch.manual_seed(0)
    if keys == "gptj":
        model = build_gptj(vocab_size=V, hidden_size=32, num_heads=4, num_hidden_layers=2, filter_size=48,
                           max_position_embeddings=32, rotary_dim=4, dropout_rate=0.0)
    elif keys == "falcon":
        model = build_gptj(vocab_size=V, hidden_size=32, num_heads=4, num_hidden_layers=2, filter_size=48,
                           max_position_embeddings=32, rotary_dim=8, dropout_rate=0.0, use_untied_layer_norm=False,
                           attention_module="multiquery_attention", extra_attention_params={"num_kv_groups": 1})
    else:
        model = build_model(**{**BASE, **keys})
    with torch.no_grad():  # the initializers leave biases at 0, norms at 1 and sinks at 0: perturb all
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.model.eval()


def _full(lm, ids: torch.Tensor) -> torch.Tensor:
    out = lm(ids)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("name", VARIATIONS)
@torch.no_grad()
def test_prefill_then_one_token_at_a_time_gives_the_full_forward_logits(name):
    lm = _model(name)
    ids = torch.randint(0, V, (2, SEQ), generator=torch.Generator().manual_seed(1))
    cache = KVCache(2, SEQ)
    steps = [lm.decode(ids[:, :5], cache)] + [lm.decode(ids[:, t:t + 1], cache) for t in range(5, SEQ)]
    torch.testing.assert_close(torch.cat(steps, dim=1), _full(lm, ids), **TOL)


@pytest.mark.parametrize("name", VARIATIONS)
@torch.no_grad()
def test_a_left_padded_batch_decodes_each_sequence_as_alone(name):
    lm = _model(name)
    gen = torch.Generator().manual_seed(2)
    prompts, steps = (6, 2, 4), 8  # prompt lengths: the shorter ones are left-padded to 6 in the prefill
    seqs = [torch.randint(0, V, (n + steps,), generator=gen) for n in prompts]
    prefill = torch.zeros(len(seqs), max(prompts), dtype=torch.long)
    mask = torch.zeros_like(prefill)
    for row, (s, n) in enumerate(zip(seqs, prompts)):
        prefill[row, max(prompts) - n:], mask[row, max(prompts) - n:] = s[:n], 1
    cache = KVCache(len(seqs), max(prompts) + steps)
    first = lm.decode(prefill, cache, mask)
    got = [[first[row, max(prompts) - n:]] for row, n in enumerate(prompts)]
    for j in range(steps):
        logits = lm.decode(torch.stack([s[n + j:n + j + 1] for s, n in zip(seqs, prompts)]), cache)
        for row in range(len(seqs)):
            got[row].append(logits[row])
    for row, s in enumerate(seqs):
        torch.testing.assert_close(torch.cat(got[row]), _full(lm, s[None])[0], **TOL)


def test_decoding_past_max_position_embeddings_is_one_error_naming_it():
    lm = _model("rotary")
    cache = KVCache(1, 40)
    lm.decode(torch.zeros(1, 32, dtype=torch.long), cache)
    with pytest.raises(DataError, match=r"position 32 is past model.max_position_embeddings \(32\)"):
        lm.decode(torch.zeros(1, 1, dtype=torch.long), cache)


def test_the_cache_refuses_tokens_past_its_length():
    cache = KVCache(1, 3)
    cache.advance(None, 3)
    with pytest.raises(ValueError, match="holds 3 tokens per sequence; 3 are cached and 1 more do not fit"):
        cache.advance(None, 1)


@torch.no_grad()
def test_last_only_gives_the_last_column_s_logits():
    lm = _model("gemma2")
    ids = torch.randint(0, V, (2, SEQ), generator=torch.Generator().manual_seed(5))
    last = lm.decode(ids, KVCache(2, SEQ), last_only=True)
    assert last.shape == (2, 1, V)
    torch.testing.assert_close(last, _full(lm, ids)[:, -1:], **TOL)
