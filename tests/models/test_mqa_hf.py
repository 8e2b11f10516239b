"""starcoder / santacoder (multi-query attention, learned positions) against transformers' GPTBigCode:
HF weights through models/starcoder/hf.py give transformers' logits and loss (float32, hf_helpers.TOL);
the way back is exact."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import assert_same, build, tiny_hf

from cs_run.models.starcoder import hf as starcoder_hf


@pytest.mark.parametrize("name", ["starcoder", "santacoder"])
def test_gpt_bigcode_gives_transformers_logits_and_loss(name):
    hf = tiny_hf("GPTBigCodeConfig", "GPTBigCodeForCausalLM", vocab_size=79, n_embd=48, n_layer=2, n_head=4,
                 n_positions=40, multi_query=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                 bos_token_id=0, eos_token_id=0)
    keys = starcoder_hf.model_keys_from_hf_config(hf.config.to_dict(), name=name)
    model = build(keys)
    assert model.model.transformer_decoder.layers[0].self_attn.proj_k_dense_layer.weight.shape == (12, 48)
    starcoder_hf.from_hf_state_dict(model, hf.state_dict())
    assert_same(hf, model, 79, seq=40)
    back = starcoder_hf.to_hf_state_dict(model)
    theirs = hf.state_dict()
    assert back.keys() == {k for k in theirs if not k.endswith(".attn.bias")}
    for k in back:
        assert torch.equal(back[k], theirs[k]), k
