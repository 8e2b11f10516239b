"""Every decoder family on the CSX engine against CPU eager: 20 training steps (AdamW, weight decay,
clipping, warmup + cosine) from the same seed, on the same shards, through the runners.

Each family's case is a tiny model (tests/examples/gpt2_helpers.TINY_MODEL sizes: 2 layers, hidden 32,
4 heads, filter 64, vocab 64, sequence 16) with the ``model:`` keys that family's Release 2.10 Model Zoo
params files set (values re-chosen for the tiny sizes, not copied files): rotary with llama3 scaling,
partial and interleaved rotary, alibi (trainable slopes too), grouped- and multi-query attention,
SwiGLU/GEGLU, RMSNorm, parallel blocks with one or two norms, sliding windows (every other layer, with
sink tokens), logit softcapping, sandwich norms, MoE with a shared expert, muP, initializer specs,
dropout and bf16 autocast where the vendor's files have them.

fx tier: bit-identical. The step is traced once into an aten graph (make_fx) and the fx tier runs that
graph's own generated Python, which calls the same aten kernels with the same arguments in the same
order as eager does; dropout draws from the same generator in the same order (the engine carries the
generator state through the step). So every parameter is ``torch.equal`` and every step's loss is the
same float.

inductor tier: within a tolerance. Inductor fuses ops and reorders float32 reductions (matmul
blocking, softmax, norms), a few ulps per op; AdamW normalises the updates, so after 20 steps at a peak
learning rate of 2e-3 the weights differ by far less than one step's update (about 2e-3): see
``INDUCTOR_TOL`` for the measured differences and the bound. Inductor draws dropout masks from its
own RNG and its bf16 ops round at other places, so these runs are float32 without dropout.
"""

from __future__ import annotations

import pytest
import torch

from cs_run.models.common.family import LM_DATA_PROCESSORS
from cs_run.registry import get_model_spec, registered_models
from tests.examples.gpt2_helpers import OPTIMIZER, run, tiny_shards, train_losses, weights

# Absolute, as many weights are near zero (biases start at 0): one step's update is up to lr (2e-3) per weight;
# the largest difference measured over 14 families (2 layers) was 2.4e-7 (gpt-neox), 1.2e-7 for most, so
# 2e-6 is 1/1000 of one update and ~8x the worst measured. Losses (~4.0, 4.8e-7 apart at most: one float32 ulp)
# within 4e-6 (8 ulps).
INDUCTOR_TOL = dict(rtol=0.0, atol=2e-6)
LOSS_TOL = dict(rtol=0.0, atol=4e-6)


def _trunc(std: float) -> dict:
    """The vendor files' initializer spec: a truncated normal cut at two standard deviations."""
    return {"name": "truncated_normal", "mean": 0.0, "std": std, "a": -2 * std, "b": 2 * std}


_NO_BIAS = dict(use_projection_bias_in_attention=False, use_ffn_bias_in_attention=False, use_ffn_bias=False)
_LLAMA = dict(position_embedding_type="rotary", rotary_dim=8, norm_type="rmsnorm", nonlinearity="swiglu",
              attention_module="multiquery_attention", extra_attention_params={"num_kv_groups": 2},
              share_embedding_weights=False, dropout_rate=0.0, attention_dropout_rate=0.0, **_NO_BIAS)
_MUP = dict(position_embedding_type="alibi", nonlinearity="swiglu", scale_qk_dot_by_d=True, embeddings_scale=14.6,
            output_logits_alpha=2.22, loss_scaling="batch_size", loss_weight=1 / 16, dropout_rate=0.0,
            attention_dropout_rate=0.0, embedding_initializer=_trunc(0.073), initializer=_trunc(0.073),
            output_layer_initializer=_trunc(0.073))

# model.name -> the keys over TINY_MODEL (gpt2 sizes and defaults).
FAMILIES = {
    "gpt2": dict(dropout_rate=0.1, mixed_precision=True),
    # Cerebras-GPT muP (111m_mup.yaml): width and filter multipliers 2, the muP learning-rate groups
    "gpt3": dict(mup_base_hidden_size=16, mup_base_filter_size=32, scale_qk_dot_by_d=True, output_logits_alpha=1.0,
                 embeddings_scale=10.0, loss_scaling="batch_size", loss_weight=1 / 16, dropout_rate=0.0,
                 attention_dropout_rate=0.0, embedding_initializer=_trunc(0.08), initializer=_trunc(0.08),
                 output_layer_initializer=_trunc(0.08)),
    # parallel blocks with one norm, interleaved partial rotary, output bias (the GPT-J schema's dropout key is
    # residual_dropout_rate; dropout_rate, its alias, is set to the same value over TINY_MODEL's 0.1)
    "gptj": dict(rotary_dim=4, share_embedding_weights=False, use_projection_bias_in_attention=False,
                 use_ffn_bias_in_attention=False, use_ffn_bias=True, use_bias_in_output=True,
                 dropout_rate=0.0, residual_dropout_rate=0.0, attention_dropout_rate=0.0, embedding_dropout_rate=0.0,
                 embedding_initializer=_trunc(0.0045), initializer=_trunc(0.0156),
                 output_layer_initializer=_trunc(0.0011)),
    # parallel blocks with two norms (use_untied_layer_norm), full rotary, biases
    "gpt-neox": dict(rotary_dim=8, use_untied_layer_norm=True, use_ffn_bias=True, share_embedding_weights=False,
                     dropout_rate=0.0, residual_dropout_rate=0.0, attention_dropout_rate=0.0, embedding_dropout_rate=0.0,
                     embedding_initializer=_trunc(0.014), initializer=_trunc(0.014),
                     output_layer_initializer=_trunc(0.0018)),
    # Falcon 40B: parallel blocks, two norms, grouped-query attention, no biases
    "falcon": dict(rotary_dim=8, attention_module="multiquery_attention", extra_attention_params={"num_kv_groups": 2},
                   use_untied_layer_norm=True, share_embedding_weights=True, dropout_rate=0.0, residual_dropout_rate=0.0,
                   attention_dropout_rate=0.0, embedding_dropout_rate=0.0, **_NO_BIAS),
    # Llama 3.1: llama3 rope scaling, rope_theta, GQA, RMSNorm, SwiGLU, untied head, bf16
    "llama": dict(_LLAMA, rope_theta=500000.0, pos_scaling_type="llama3", pos_scaling_factor=8.0,
                  pos_scaling_extra_args={"high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                          "original_max_position_embeddings": 8},
                  embedding_dropout_rate=0.0, mixed_precision=True),
    # Mistral: Llama plus a sliding window
    "mistral": dict(_LLAMA, attention_sliding_window_length=6),
    # the Model Zoo's MoE 111M with a shared expert: alibi, top-1 of 4 experts, null expert bias,
    # load-balancing loss, muP-style scales
    "mixtral": dict(position_embedding_type="alibi", nonlinearity="swiglu", scale_qk_dot_by_d=True,
                    embeddings_scale=9.17, output_logits_scale=0.3651, dropout_rate=0.0, attention_dropout_rate=0.0,
                    embedding_initializer=_trunc(0.0867), initializer=_trunc(0.05),
                    output_layer_initializer=_trunc(0.0112),
                    moe={"num_experts": 4, "num_shared_experts": 1, "top_k": 1, "null_expert_bias": 1.1,
                         "load_balancing_loss_coef": 0.01, "router_fp32": True, "routing_algorithm": "learned"}),
    # Gemma 2 with sinks: softcapping of attention and output logits, sandwich norms, every-other-layer sliding
    # window with sink tokens, attention_inner_dim != hidden_size, GEGLU, GQA, embeddings scale, bf16
    "gemma2": dict(_LLAMA, nonlinearity="geglu", attention_inner_dim=48, rotary_dim=12, share_embedding_weights=True,
                   attention_logit_softcapping=50.0, final_logit_softcapping=30.0, norm_first_sandwich=True,
                   attention_sliding_window_length=6, sliding_window_every_other_decoder_layer=True,
                   attention_sink_tokens=2, embeddings_scale=5.657, layer_norm_epsilon=1e-6, mixed_precision=True),
    # multi-query attention (one kv group), learned positions, dropout everywhere; scale_qk_dot_by_layer_idx
    # is in the vendor's files (false there): true here so its path runs
    "starcoder": dict(attention_module="multiquery_attention", extra_attention_params={"num_kv_groups": 1},
                      embedding_dropout_rate=0.1, dropout_rate=0.1, attention_dropout_rate=0.1,
                      scale_qk_dot_by_layer_idx=True, output_layer_initializer=_trunc(0.0022)),
    "santacoder": dict(attention_module="multiquery_attention", extra_attention_params={"num_kv_groups": 1},
                       embedding_dropout_rate=0.1, dropout_rate=0.1, attention_dropout_rate=0.1,
                       attention_softmax_fp32=True),
    # JAIS and BTLM: alibi, SwiGLU, muP (width multiplier 2 and 4), a Cerebras-only kernel key
    "jais": dict(_MUP, mup_base_hidden_size=16, mup_base_filter_size=32, attention_kernel="optimized_beta"),
    "btlm": dict(_MUP, mup_base_hidden_size=8, mup_base_filter_size=16),
    # BLOOM: alibi (its slopes trainable here; the 7b file sets false), embedding LayerNorm
    "bloom": dict(position_embedding_type="alibi", alibi_trainable_slopes=True, embedding_layer_norm=True,
                  dropout_rate=0.0, attention_dropout_rate=0.0, embedding_initializer=_trunc(0.02),
                  initializer=_trunc(0.02), output_layer_initializer=_trunc(0.02)),
    # MPT 7B: alibi, biasless LayerNorm, no biases anywhere, loss weighted by 1/sequence, bf16
    "mpt": dict(position_embedding_type="alibi", norm_type="biasless-layernorm", use_bias_in_output=False,
                embedding_dropout_rate=0.0, dropout_rate=0.0, attention_dropout_rate=0.0, loss_weight=1 / 16,
                mixed_precision=True, **_NO_BIAS),
}

# The case the default suite compiles with inductor (a minute or more on a 2-core host): rotary + GQA +
# RMSNorm + SwiGLU + bf16 keys (llama); mixtral's MoE runs on fx here. The rest are the `sweep`
# (`make test-sweep`, about 10 minutes on 2 cores), which `make test` leaves out to stay within CI's time.
INDUCTOR_DEFAULT = ("llama",)

# Accumulation is gpt2's own test (tests/examples/test_gpt2_runs.py); one micro-batch halves each trace.
FAMILY_OPTIMIZER = {**OPTIMIZER, "grad_accum_steps": 1}
# Families whose keys differ between layers (gemma2's every-other-layer window, starcoder's
# scale_qk_dot_by_layer_idx) keep 2 layers on inductor; the others compile one (the same kernels, half the
# C++ to build: inductor's build time grows with the layers).
PER_LAYER = ("gemma2", "starcoder")
DROPOUT_KEYS = ("dropout_rate", "attention_dropout_rate", "embedding_dropout_rate", "residual_dropout_rate")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("family_shards"))


def train(tmp_path, shards, family: str, device: str, model: dict, tier: str = "fx"):
    runner, _ = run(tmp_path, shards, device, f"{family}-{device}-{tier}", mode="train",
                    model={"name": family, **model}, optimizer=FAMILY_OPTIMIZER,
                    runconfig={"compile_tier": tier, "log_steps": 1})
    assert runner.global_step == 20
    return runner


def test_every_registered_decoder_family_has_a_case():
    decoders = {name for name in registered_models() if get_model_spec(name).data_processors == LM_DATA_PROCESSORS}
    assert decoders == set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_csx_fx_training_is_bit_identical_to_cpu(tmp_path, shards, family):
    cpu = train(tmp_path, shards, family, "CPU", FAMILIES[family])
    csx = train(tmp_path, shards, family, "CSX", FAMILIES[family])
    cpu_losses = train_losses(cpu)
    assert [step for step, _ in cpu_losses] == list(range(1, 21))
    assert train_losses(csx) == cpu_losses
    expected, got = weights(cpu), weights(csx)
    assert expected.keys() == got.keys()
    for key, value in expected.items():
        assert torch.equal(value, got[key]), key


def inductor_keys(family: str) -> dict:
    """The family's keys in float32 without dropout, one layer unless its keys act by layer index."""
    out = {k: (0.0 if k in DROPOUT_KEYS else v) for k, v in FAMILIES[family].items() if k != "mixed_precision"}
    out.setdefault("dropout_rate", 0.0)
    if family not in PER_LAYER:
        out["num_hidden_layers"] = 1
    return out


@pytest.mark.parametrize("family", [f if f in INDUCTOR_DEFAULT else pytest.param(f, marks=pytest.mark.sweep)
                                    for f in FAMILIES])
def test_csx_inductor_training_matches_cpu_within_tolerance(tmp_path, shards, family):
    model = inductor_keys(family)
    cpu = train(tmp_path, shards, family, "CPU", model)
    csx = train(tmp_path, shards, family, "CSX", model, tier="inductor")
    want_steps, want_losses = zip(*train_losses(cpu))
    got_steps, got_losses = zip(*train_losses(csx))
    assert got_steps == want_steps == tuple(range(1, 21))
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(want_losses), **LOSS_TOL)
    expected = weights(cpu)
    for key, value in weights(csx).items():
        torch.testing.assert_close(value, expected[key], **INDUCTOR_TOL, msg=key)
