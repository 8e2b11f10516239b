"""llama and mistral against transformers' Llama and Mistral: an HF model's weights through
models/llama/hf.py give transformers' logits and loss (float32, tolerance in hf_helpers.TOL), and
the way back to HF names is exact."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import assert_same, build, tiny_hf

from cs_run.models.llama import hf as llama_hf

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False)


@pytest.mark.parametrize("extra", [
    pytest.param({"num_key_value_heads": 4}, id="mha"),
    pytest.param({"num_key_value_heads": 2, "rope_theta": 500000.0}, id="gqa"),
    pytest.param({"num_key_value_heads": 1, "tie_word_embeddings": True}, id="mqa-tied"),
    pytest.param({"num_key_value_heads": 2, "attention_bias": True, "mlp_bias": True}, id="biases"),
    pytest.param({"num_key_value_heads": 2, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                  "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}},
                 id="llama3.1-rope-scaling"),
    pytest.param({"num_key_value_heads": 2, "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
                 id="linear-rope-scaling"),
])
def test_llama_gives_transformers_logits_and_loss(extra):
    hf = tiny_hf("LlamaConfig", "LlamaForCausalLM", **{**BASE, **extra})
    keys = llama_hf.model_keys_from_hf_config(hf.config.to_dict())
    model = build(keys)
    llama_hf.from_hf_state_dict(model, hf.state_dict())
    assert_same(hf, model, BASE["vocab_size"], seq=48)
    back = llama_hf.to_hf_state_dict(model)
    theirs = {k: v for k, v in hf.state_dict().items() if k in back}
    assert back.keys() == theirs.keys()
    for k in back:
        assert torch.equal(back[k], theirs[k]), k


def test_llama3_scaling_changes_the_logits():
    """The scaled run must differ from the unscaled one (else the test above could pass vacuously)."""
    base = tiny_hf("LlamaConfig", "LlamaForCausalLM", **BASE)
    keys = llama_hf.model_keys_from_hf_config(base.config.to_dict())
    plain, scaled = build(keys), build({**keys, "pos_scaling_type": "llama3", "pos_scaling_factor": 8.0,
                                        "pos_scaling_extra_args": {"original_max_position_embeddings": 16}})
    llama_hf.from_hf_state_dict(plain, base.state_dict())
    llama_hf.from_hf_state_dict(scaled, base.state_dict())
    ids = torch.randint(0, 101, (1, 48), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (plain.model(ids) - scaled.model(ids)).abs().max() > 1e-3


@pytest.mark.parametrize("window", [5, 16])
def test_mistral_sliding_window_gives_transformers_logits(window):
    hf = tiny_hf("MistralConfig", "MistralForCausalLM", **{**BASE, "num_key_value_heads": 2,
                                                              "sliding_window": window})
    keys = llama_hf.model_keys_from_hf_config(hf.config.to_dict(), name="mistral")
    assert keys["attention_sliding_window_length"] == window
    model = build(keys)
    llama_hf.from_hf_state_dict(model, hf.state_dict())
    assert_same(hf, model, BASE["vocab_size"], seq=40)
