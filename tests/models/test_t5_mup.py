"""t5's muP (t5_model.py of Release 2.10: mup_base_d_model / mup_base_d_ff / mup_base_d_kv) against numbers worked
out by hand: width multiplier m = 32 / 8 = 4, FFN ratio 16 / 128 = 1/8, 2 encoder and 3 decoder layers (the
vendor's depth factor is 2 * layers: 4 and 6), initializer_factor 1. The forward is checked against transformers'
T5ForConditionalGeneration with the muP factors folded into its weights by hand."""

from __future__ import annotations

import pytest
import torch

from cs_run.models.t5.config import T5Config
from cs_run.models.t5.hf import hf_config, to_hf_state_dict
from cs_run.models.t5.model import build
from cs_run.optim.param_groups import configure_param_groups

MUP = dict(src_vocab_size=64, d_model=32, d_kv=8, num_heads=4, d_ff=128, encoder_num_hidden_layers=2,
           decoder_num_hidden_layers=3, dropout_rate=0.0, norm_type="rmsnorm", mup_base_d_model=8, mup_base_d_ff=16,
           encoder_attention_logits_alpha=4.0, decoder_attention_logits_alpha=2.0, output_logits_alpha=2.22,
           embeddings_alpha=14.6)


def make(**overrides):
    torch.manual_seed(0)
    return build(T5Config(**{**MUP, **overrides})).eval()


def _scales(model) -> dict[str, float]:
    """Each parameter's learning-rate factor in the optimizer's param groups (1.0 where a group carries none)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: g.get("adjust_learning_rate", 1.0) for g in configure_param_groups(model, {})
            for p in g["params"]}


@pytest.mark.parametrize("d_kv_base", [None, 2])
def test_learning_rate_groups_by_hand(d_kv_base):
    scales = _scales(make(mup_base_d_kv=d_kv_base))
    qkv, out = (0.5, 0.5) if d_kv_base is None else (1 / 4, 2 / 8)  # 1/sqrt(m) both, or 1/m and base_d_kv / d_kv
    for name, scale in scales.items():
        if "embedding" in name:  # the word embeddings and the relative position biases (both *embedding*weight)
            want = 0.5
        elif "attn.proj_output" in name:
            want = out
        elif "attn.proj_" in name:
            want = qkv
        elif "ffn.ffn.0" in name:
            want = 1 / 4
        elif "ffn.ffn.1" in name:
            want = 16 / 128
        else:  # the norms
            want = 1.0
        assert scale == pytest.approx(want), name
    assert sum("ffn.ffn.1" in n for n in scales) == 5  # 2 encoder + 3 decoder layers


def test_without_mup_no_group_is_scaled():
    model = make(mup_base_d_model=None, mup_base_d_ff=None)
    assert set(_scales(model).values()) == {1.0} and model.model.output_logits_scale is None
    assert model.model.embeddings_scale == 14.6  # embeddings_alpha alone, without d_model**0.5


def _std(t: torch.Tensor) -> float:
    return t.float().std().item()


def test_initializer_stds_by_hand():
    """std of the embedding d_model^-0.5 (1 * 32^-0.5, not 1), of the attention output d_model^-0.5 * 2L and of
    the FFN output d_ff^-0.5 * 2L with L each stack's layers; q stays (d_model * d_kv)^-0.5."""
    m = make(src_vocab_size=4096).model
    assert _std(m.encoder_embeddings.word_embeddings.weight) == pytest.approx(32 ** -0.5, rel=0.03)
    for stack, depth in ((m.encoder, 4), (m.decoder, 6)):
        weights = [getattr(layer, a) for layer in stack.layers for a in ("self_attn", "multihead_attn") if
                   getattr(layer, a) is not None]
        out = torch.cat([a.proj_output_dense_layer.weight.flatten() for a in weights])
        assert _std(out) == pytest.approx(32 ** -0.5 * depth, rel=0.05)
        q = torch.cat([a.proj_q_dense_layer.weight.flatten() for a in weights])
        assert _std(q) == pytest.approx((32 * 8) ** -0.5, rel=0.05)
        ffn_out = torch.cat([layer.ffn.ffn[1].linear_layer.weight.flatten() for layer in stack.layers])
        assert _std(ffn_out) == pytest.approx(128 ** -0.5 * depth, rel=0.05)


def test_an_untied_head_is_drawn_with_std_over_root_d_model():
    head = make(share_embedding_weights=False, src_vocab_size=2048).model.lm_head.weight
    assert _std(head) == pytest.approx(32 ** -0.5, rel=0.03)


@pytest.mark.parametrize("by_d", [False, True])
def test_logits_are_transformers_with_the_mup_factors_folded_into_its_weights(by_d):
    """HF's T5 scales nothing: its shared embedding is ours times embeddings_alpha * d_model**0.5, each q weight
    ours times alpha / (m * d_kv) (k and q are each times m^-0.5, the dot / d_kv), v times m^-0.5, the attention
    output times m^0.5; the head is applied by hand, times output_logits_alpha / m**0.5 (/ m with
    scale_output_logits_by_d), without the tied head's d_model**-0.5."""
    transformers = pytest.importorskip("transformers")
    model = make(scale_output_logits_by_d=by_d)
    sd = to_hf_state_dict(model)
    emb = sd["shared.weight"].clone()
    folded = dict(sd, **{"shared.weight": emb * 14.6 * 32 ** 0.5})
    for name in sd:
        alpha = 4.0 if name.startswith("encoder.") else 2.0
        if name.endswith(".q.weight"):
            folded[name] = sd[name] * alpha / (4 * 8)
        elif name.endswith(".v.weight"):
            folded[name] = sd[name] * 4 ** -0.5
        elif name.endswith(".o.weight"):
            folded[name] = sd[name] * 4 ** 0.5
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(**hf_config(model.config))).eval()
    hf.load_state_dict(folded, strict=False)
    hf.tie_weights()
    g = torch.Generator().manual_seed(1)
    ids, dec = torch.randint(0, 64, (2, 12), generator=g), torch.randint(0, 64, (2, 5), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0
    with torch.no_grad():
        hidden = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec,
                    output_hidden_states=True).decoder_hidden_states[-1]
        ours = model.model(ids, mask, dec)
    expected = hidden @ emb.T * (2.22 / (4 if by_d else 2))
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("keys, match", [
    (dict(mup_base_d_ff=None), "mup_base_d_ff: muP needs both"),
    (dict(mup_base_d_model=None, mup_base_d_kv=2), "mup_base_d_model: muP needs both"),
    (dict(use_transformer_initialization=True), "use_transformer_initialization: t5's muP"),
    (dict(mup_base_d_model=0.5), "mup_base_d_model: the base model's width"),
])
def test_inconsistent_mup_keys_are_errors_naming_the_key(keys, match):
    with pytest.raises(ValueError, match=match):
        T5Config(**{**MUP, **keys})
