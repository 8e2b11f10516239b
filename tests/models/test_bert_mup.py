"""bert's muP (bert_model.py / bert_pretrain_models.py, Release 2.10), by hand: the MLM and NSP logits are the
same model's without muP times output_logits_alpha / width (scale_output_logits_by_d), the learning-rate groups
scale by the base sizes, and the encoder's initializers by width^-0.5 (output layers also by depth)."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import build

KEYS = dict(name="bert", vocab_size=40, hidden_size=32, num_hidden_layers=2, num_heads=4, filter_size=64,
            max_position_embeddings=16, pooler_nonlinearity="tanh", dropout_rate=0.0)
MUP = dict(mup_base_hidden_size=8, mup_base_filter_size=16, output_logits_alpha=2.0)


@pytest.mark.parametrize("by_d, scale", [(True, 2.0 / 4), (False, 2.0 / 4 ** 0.5)])
def test_mup_logits_are_the_plain_logits_scaled(by_d, scale):
    mup = build({**KEYS, **MUP, "scale_output_logits_by_d": by_d})
    plain = build({**KEYS, "scale_qk_dot_by_d": True})  # muP's attention scaling (1/d), without its logit scale
    plain.load_state_dict(mup.state_dict())
    ids = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        (m_mlm, m_nsp), (p_mlm, p_nsp) = mup.model(ids), plain.model(ids)
    torch.testing.assert_close(m_mlm, p_mlm * scale, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(m_nsp, p_nsp * scale, rtol=1e-6, atol=1e-7)


def test_mup_learning_rate_groups_and_initializers():
    torch.manual_seed(0)
    mup = build({**KEYS, "hidden_size": 256, "filter_size": 1024, "mup_base_hidden_size": 64,
                 "mup_base_filter_size": 128, "initializer_range": 0.02})
    groups = {name: g["scale"] for name, g in mup.lr_adjustment_groups.items()}
    assert groups == {"embedding": 1.0, "encoder_attention": 64 / 256, "encoder_input_ffn": 64 / 256,
                      "encoder_output_ffn": 128 / 1024, "pooler": 64 / 256}
    layer = mup.model.bert_encoder.transformer_encoder.layers[0]
    std = 0.02 * 0.8796  # a normal cut at two standard deviations keeps 0.8796 of its std
    depth = (2 * 2) ** -0.5
    for weight, expected in ((layer.self_attn.proj_q_dense_layer.weight, std * 4 ** -0.5),
                             (layer.self_attn.proj_output_dense_layer.weight, std * 4 ** -0.5 * depth),
                             (layer.ffn.ffn[0].linear_layer.weight, std * 4 ** -0.5),
                             (layer.ffn.ffn[1].linear_layer.weight, std * 8 ** -0.5 * depth),
                             (mup.model.bert_encoder.embedding_layer.word_embeddings.weight, std)):
        assert weight.std().item() == pytest.approx(expected, rel=0.05)
