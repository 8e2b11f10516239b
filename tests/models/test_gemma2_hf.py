"""gemma2 (sandwich norms, 1 + weight RMSNorm, sqrt(hidden) embedding scale, attention and final logit
softcapping, sliding windows on every other layer, query_pre_attn_scalar) against transformers'
Gemma 2: HF weights through models/gemma2/hf.py give transformers' logits and loss (float32,
hf_helpers.TOL). The HF side uses the erf GELU, the Model Zoo's geglu."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import assert_same, build, tiny_hf

from cs_run.models.gemma2 import hf as gemma2_hf


@pytest.mark.parametrize("extra", [
    pytest.param({"query_pre_attn_scalar": 16}, id="scalar-is-head-dim"),
    pytest.param({"query_pre_attn_scalar": 24, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0},
                 id="scalar-differs-tight-caps"),
])
def test_gemma2_gives_transformers_logits_and_loss(extra):
    hf = tiny_hf("Gemma2Config", "Gemma2ForCausalLM", vocab_size=83, hidden_size=48, intermediate_size=64,
                 num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 hidden_activation="gelu", sliding_window=6, max_position_embeddings=64,
                 attn_implementation="eager", **extra)
    keys = gemma2_hf.model_keys_from_hf_config(hf.config.to_dict())
    model = build(keys)
    gemma2_hf.from_hf_state_dict(model, hf.state_dict())
    assert_same(hf, model, 83, seq=24)
    back = gemma2_hf.to_hf_state_dict(model)
    theirs = {k: v for k, v in hf.state_dict().items() if k in back}
    assert back.keys() == theirs.keys()
    for k in back:  # weights round-trip through (w + 1) - 1 in float32: equal to the last ulp
        torch.testing.assert_close(back[k], theirs[k], rtol=0, atol=1e-7)
