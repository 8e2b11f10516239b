"""bloom (ALiBi, embedding LayerNorm, fused per-head qkv) against transformers' BLOOM: HF weights through
models/bloom/hf.py give transformers' logits and loss (float32, hf_helpers.TOL); the way back is exact.
ALiBi slopes by hand for a head count that is not a power of two."""

from __future__ import annotations

import math

import pytest
import torch
from hf_helpers import assert_same, build, tiny_hf

from cs_run.models.bloom import hf as bloom_hf
from cs_run.models.common.alibi import alibi_slopes


@pytest.mark.parametrize("heads", [4, 6])
def test_bloom_gives_transformers_logits_and_loss(heads):
    hf = tiny_hf("BloomConfig", "BloomForCausalLM", vocab_size=89, hidden_size=48, n_layer=2, n_head=heads,
                 hidden_dropout=0.0, attention_dropout=0.0)
    keys = bloom_hf.model_keys_from_hf_config(hf.config.to_dict())
    model = build(keys)
    bloom_hf.from_hf_state_dict(model, hf.state_dict())
    assert_same(hf, model, 89, seq=32)
    back = bloom_hf.to_hf_state_dict(model)
    theirs = hf.state_dict()
    assert back.keys() == theirs.keys()
    for k in back:
        assert torch.equal(back[k], theirs[k]), k


def test_alibi_slopes_follow_the_paper():
    # 8 heads: 2^-1 ... 2^-8; 6 heads: the 4-head series 2^-2, 2^-4, 2^-6, 2^-8, then 8-head odd ones 2^-1, 2^-3
    assert alibi_slopes(8) == pytest.approx([2 ** -i for i in range(1, 9)])
    assert alibi_slopes(6) == pytest.approx([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3])


def test_alibi_bias_is_minus_slope_times_distance_and_trainable_slopes_train():
    m = build({"name": "bloom", "vocab_size": 31, "hidden_size": 16, "num_hidden_layers": 1, "num_heads": 2,
               "filter_size": 32, "position_embedding_type": "alibi", "alibi_trainable_slopes": True,
               "pos_scaling_factor": 2.0})
    helper = m.model.embedding_layer.position_embed_helper
    assert helper.slopes.requires_grad and "model.embedding_layer.position_embed_helper.slopes" in dict(
        m.named_parameters())
    bias = helper(3, 3)
    s = helper.slopes.detach()
    torch.testing.assert_close(bias[1].detach(), -s[1] / 2 * torch.tensor([[0., 1, 2], [1, 0, 1], [2, 1, 0]]))
    assert not math.isclose(float(s.abs().sum()), 0.0)  # initialized with the model's initializer
