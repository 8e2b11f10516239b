"""gpt2 through the runners: CSX equals CPU over 20 steps, exact resume, a Model Zoo params file trains."""

from __future__ import annotations

import pytest
import torch
from gpt2_helpers import run, tiny_shards, weights


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("gpt2_shards"))


def test_csx_fx_is_bit_identical_to_cpu_with_dropout_bf16_accumulation_and_schedule(tmp_path, shards):
    model = {"dropout_rate": 0.1, "mixed_precision": True}
    cpu, cpu_results = run(tmp_path, shards, "CPU", "cpu", model=model)
    csx, csx_results = run(tmp_path, shards, "CSX", "csx", model=model, runconfig={"compile_tier": "fx"})
    assert cpu.step_config.autocast_dtype is torch.bfloat16
    assert cpu.global_step == csx.global_step == 20
    for key, value in weights(cpu).items():
        assert torch.equal(value, weights(csx)[key]), key
    assert cpu_results == csx_results
    assert set(cpu_results) == {"eval/loss", "eval/lm_perplexity", "eval/accuracy"}


def test_resume_replays_the_exact_sample_order_and_dropout(tmp_path, shards):
    model = {"dropout_rate": 0.1}
    straight, _ = run(tmp_path, shards, "CPU", "straight", mode="train", model=model)
    run(tmp_path, shards, "CPU", "resumed", mode="train", model=model, runconfig={"max_steps": 7})
    resumed, _ = run(tmp_path, shards, "CPU", "resumed", mode="train", model=model)
    assert resumed.global_step == 20
    for key, value in weights(straight).items():
        assert torch.equal(value, weights(resumed)[key]), key


@pytest.mark.sweep  # gpt2 on inductor is also the sweep's gpt2 case; make test compiles llama (test_families_csx)
def test_csx_inductor_matches_cpu_within_tolerance(tmp_path, shards):
    """Inductor fuses and reorders float math, and draws dropout masks from its own RNG, so this runs
    without dropout and compares with a tolerance: after 20 AdamW steps every weight is within 1e-4."""
    model = {"dropout_rate": 0.0, "num_hidden_layers": 1}
    cpu, _ = run(tmp_path, shards, "CPU", "cpu", mode="train", model=model)
    csx, _ = run(tmp_path, shards, "CSX", "csx", mode="train", model=model, runconfig={"compile_tier": "inductor"})
    expected = weights(cpu)
    for key, value in weights(csx).items():
        torch.testing.assert_close(value, expected[key], rtol=1e-3, atol=1e-4, msg=key)


def test_a_llama_style_decoder_on_csx_fx_is_bit_identical_to_cpu(tmp_path, shards):
    """model.name llama on the same LM data: rotary (partial, llama3 scaling), RMSNorm, SwiGLU, grouped-query
    attention, a sliding window, bf16 autocast and dropout; 3 CSX fx steps equal 3 CPU eager steps bit for bit."""
    model = {"name": "llama", "position_embedding_type": "rotary", "rotary_dim": 6, "rope_theta": 500000.0,
             "pos_scaling_type": "llama3", "pos_scaling_factor": 8.0,
             "pos_scaling_extra_args": {"original_max_position_embeddings": 8}, "norm_type": "rmsnorm",
             "nonlinearity": "swiglu", "attention_module": "multiquery_attention",
             "extra_attention_params": {"num_kv_groups": 2}, "attention_sliding_window_length": 6,
             "use_projection_bias_in_attention": False, "use_ffn_bias_in_attention": False, "use_ffn_bias": False,
             "share_embedding_weights": False, "dropout_rate": 0.1, "mixed_precision": True}
    cpu, _ = run(tmp_path, shards, "CPU", "cpu", mode="train", model=model, runconfig={"max_steps": 3})
    csx, _ = run(tmp_path, shards, "CSX", "csx", mode="train", model=model,
                 runconfig={"max_steps": 3, "compile_tier": "fx"})
    assert cpu.global_step == csx.global_step == 3
    assert "ffn.ffn.0.linear_layer_for_glu.weight" in " ".join(weights(cpu))
    for key, value in weights(cpu).items():
        assert torch.equal(value, weights(csx)[key]), key
