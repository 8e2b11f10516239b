"""gptj, gpt-neox and falcon (parallel attention + FFN blocks) against transformers' GPT-J and GPT-NeoX: HF
weights through the family's hf.py adapter give transformers' logits and loss (float32, hf_helpers.TOL);
the way back to HF names is exact."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import assert_same, build, tiny_hf

from cs_run.models.falcon import hf as falcon_hf
from cs_run.models.gpt_neox import hf as neox_hf
from cs_run.models.gptj import hf as gptj_hf


def _round_trip(adapter, model, hf) -> None:
    back = adapter.to_hf_state_dict(model)
    # transformers 5 calls GPT-NeoX's embed_out lm_head; published checkpoints (and ours) say embed_out
    theirs = {("embed_out.weight" if k == "lm_head.weight" and "embed_out.weight" in back else k): v
              for k, v in hf.state_dict().items()}
    assert back.keys() <= theirs.keys()
    for k in back:
        assert torch.equal(back[k], theirs[k]), k


@pytest.mark.parametrize("extra", [
    pytest.param({"rotary_dim": 8}, id="partial-rotary"),
    pytest.param({"rotary_dim": 16, "activation_function": "gelu"}, id="full-rotary-gelu"),
])
def test_gptj_gives_transformers_logits_and_loss(extra):
    config = dict(vocab_size=97, n_positions=64, n_embd=64, n_layer=2, n_head=4, n_inner=96,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **extra)
    hf = tiny_hf("GPTJConfig", "GPTJForCausalLM", **config)
    keys = gptj_hf.model_keys_from_hf_config(hf.config.to_dict())
    model = build(keys)
    gptj_hf.from_hf_state_dict(model, hf.state_dict())
    assert model.model.transformer_decoder.layers[0].norm3 is None  # one tied norm per block
    assert_same(hf, model, 97, seq=40)
    _round_trip(gptj_hf, model, hf)


@pytest.mark.parametrize("extra", [
    pytest.param({"rotary_pct": 0.25}, id="quarter-rotary"),
    pytest.param({"rotary_pct": 1.0, "rope_theta": 500.0, "tie_word_embeddings": False}, id="full-rotary-theta"),
])
def test_gpt_neox_gives_transformers_logits_and_loss(extra):
    config = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                  max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0, **extra)
    hf = tiny_hf("GPTNeoXConfig", "GPTNeoXForCausalLM", **config)
    keys = neox_hf.model_keys_from_hf_config(hf.config.to_dict())
    model = build(keys)
    neox_hf.from_hf_state_dict(model, hf.state_dict())
    assert_same(hf, model, 97, seq=40)
    _round_trip(neox_hf, model, hf)


@pytest.mark.parametrize("extra", [
    pytest.param({"multi_query": True, "new_decoder_architecture": False}, id="7b-multi-query-tied-norm"),
    pytest.param({"new_decoder_architecture": True, "num_kv_heads": 2}, id="40b-grouped-untied-norms"),
])
def test_falcon_gives_transformers_logits_and_loss(extra):
    config = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0, **extra)
    hf = tiny_hf("FalconConfig", "FalconForCausalLM", **config)
    keys = falcon_hf.model_keys_from_hf_config(hf.config.to_dict())
    model = build(keys)
    falcon_hf.from_hf_state_dict(model, hf.state_dict())
    assert_same(hf, model, 97, seq=40)
    _round_trip(falcon_hf, model, hf)
