"""mixtral's mixture of experts (models/common/moe.py) against transformers' Mixtral, a hand
computation of the Model Zoo's routing and LoadBalancingLoss, and the CSX engine.

HF and the Model Zoo route alike under the Model Zoo's defaults (softmax selection and weighting,
normalised top-k weights, null_expert_bias 0), so the logits and loss match within hf_helpers.TOL
(float32, 1e-5: summation order only).
"""

from __future__ import annotations

import pytest
import torch
from hf_helpers import assert_same, build, tiny_hf

from cs_run.models.mixtral import hf as mixtral_hf
from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner
from tests.examples.gpt2_helpers import random_samples, tiny_params, write_vendor_shards

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
            num_local_experts=4)

TINY_MOE = dict(name="mixtral", vocab_size=32, hidden_size=16, num_hidden_layers=2, num_heads=2, filter_size=24,
                max_position_embeddings=16, nonlinearity="swiglu", dropout_rate=0.0, position_embedding_type="rotary",
                rotary_dim=8, norm_type="rmsnorm")


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_mixtral_gives_transformers_logits_and_loss(top_k):
    hf = tiny_hf("MixtralConfig", "MixtralForCausalLM", **BASE, num_experts_per_tok=top_k)
    keys = mixtral_hf.model_keys_from_hf_config(hf.config.to_dict())
    assert keys["moe"]["num_experts"] == 4 and keys["moe"]["top_k"] == top_k
    model = build(keys)
    mixtral_hf.from_hf_state_dict(model, hf.state_dict())
    assert_same(hf, model, BASE["vocab_size"], seq=32)
    back = mixtral_hf.to_hf_state_dict(model, fused=True)  # transformers 5 in memory
    theirs = hf.state_dict()
    assert back.keys() == theirs.keys()
    for k in back:
        assert torch.equal(back[k], theirs[k]), k


def test_parameter_names_are_the_model_zoo_experimental_layout():
    model = build({**TINY_MOE, "moe": {"num_experts": 3, "num_shared_experts": 1, "top_k": 1}})
    names = {n for n, _ in model.model.named_parameters()}
    ffn = "transformer_decoder.layers.1.ffn."
    for name in ("gate.weight", "experts.experts.2.0.linear_layer.weight", "experts.experts.2.0.linear_layer_for_glu"
                 ".weight", "experts.experts.2.1.linear_layer.weight", "experts.shared_experts.0.ffn.0.linear_layer"
                 ".weight", "experts.shared_experts.0.ffn.1.linear_layer.weight"):
        assert ffn + name in names, name
    assert model.model.transformer_decoder.layers[1].ffn.gate.weight.shape == (3, 16)


def _hand_moe(block, x):
    """The Model Zoo's experimental path token by token: softmax, top-k, weights / (sum + null bias)."""
    cfg = block.cfg
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for s in range(x.shape[1]):
            t = x[b, s]
            p = torch.softmax(block.gate(t).double(), -1)
            chosen = sorted(range(cfg.num_experts), key=lambda e: -p[e].item())[:cfg.top_k]
            denom = sum(p[e].item() for e in chosen) + (cfg.null_expert_bias or 0.0)
            acc = sum(ffn(t) for ffn in block.experts.shared_experts) if block.experts.shared_experts else 0.0
            for e in chosen:
                y = t
                for layer in block.experts.experts[e]:
                    y = layer(y)
                acc = acc + y * (p[e].item() / denom)
            out[b, s] = acc
    return out


@pytest.mark.parametrize("moe", [
    pytest.param({"num_experts": 4, "top_k": 2}, id="top2"),
    pytest.param({"num_experts": 4, "top_k": 1, "num_shared_experts": 1, "null_expert_bias": 1.1}, id="shared-null"),
])
def test_block_equals_a_hand_computation_of_the_routing(moe):
    model = build({**TINY_MOE, "moe": moe})
    block = model.model.transformer_decoder.layers[0].ffn
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out, routing, mask = block(x)
        want = _hand_moe(block, x)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)  # float32 vs per-token float64 weights
    assert torch.equal(mask.sum(-1), torch.full((2, 5), float(moe["top_k"])))
    torch.testing.assert_close(routing.sum(-1), torch.ones(2, 5))


def test_load_balancing_loss_is_added_while_training_by_the_model_zoo_formula():
    coef = 0.25
    model = build({**TINY_MOE, "moe": {"num_experts": 4, "top_k": 2, "load_balancing_loss_coef": coef}})
    ids = torch.randint(0, 32, (3, 8), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    batch = {"input_ids": ids, "labels": torch.roll(ids, -1, 1), "attention_mask": mask}
    with torch.no_grad():
        eval_loss = model(batch)
        model.train()
        train_loss = model(batch)
        _, routing = model.model(ids)
    # LoadBalancingLoss by hand: per sequence b and expert e, f = share of b's unmasked tokens routed to e,
    # P = mean probability of e over them; each averaged over layers; loss = E^2 * mean_{b,e}(f * P)
    E, total = 4, 0.0
    for b in range(3):
        n = int(mask[b].sum())
        for e in range(E):
            f = sum(float(m[b, :n, e].sum()) / n for _, m in routing) / len(routing)
            p = sum(float(w[b, :n, e].sum()) / n for w, _ in routing) / len(routing)
            total += f * p
    want = E ** 2 * total / (3 * E)
    assert want > 0.5  # E^2 * mean(f * P) is 1 for perfectly balanced routing; not a vacuous zero
    torch.testing.assert_close(train_loss - eval_loss, torch.tensor(coef * want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("moe, match", [
    ({"num_experts": 4, "routing_algorithm": "hash"}, "moe.routing_algorithm"),
    ({"num_experts": 4, "moe_implementation": "optimized"}, "moe.moe_implementation"),
    ({"num_experts": 4, "router_selection_nonlinearity": "sinkhorn"}, "moe.router_selection_nonlinearity"),
    ({"num_experts": 4, "probability_before_ffn": True}, "moe.probability_before_ffn"),
    ({"num_experts": 4, "top_k": 5}, "moe.top_k"),
    ({"num_experts": 4, "load_balancing_loss_coef": -1.0}, "moe.load_balancing_loss_coef"),
    ({"num_experts": 4, "num_experts_per_tok": 2}, "moe.num_experts_per_tok: unknown"),
])
def test_moe_values_cs_run_cannot_honour_are_errors_naming_the_key(moe, match):
    with pytest.raises(ValueError, match=match):
        build({**TINY_MOE, "moe": moe})


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_shards")
    write_vendor_shards(root / "train", random_samples(24, 16, 32), per_file=12)
    write_vendor_shards(root / "val", random_samples(8, 16, 32, seed=1), per_file=8)
    return root


def test_csx_fx_training_is_bit_identical_to_cpu(tmp_path, shards):
    """3 AdamW steps with the load-balancing loss and a shared expert: fx replays eager's aten ops."""
    model = {**TINY_MOE, "moe": {"num_experts": 4, "top_k": 2, "num_shared_experts": 1,
                                 "load_balancing_loss_coef": 0.01}}
    states = {}
    for device in ("CPU", "CSX"):
        path = tiny_params(tmp_path / f"{device}.yaml", shards / "train", shards / "val", model=model,
                           runconfig={"model_dir": str(tmp_path / device), "max_steps": 3, "compile_tier": "fx"})
        runner = PyTorchBaseRunner.create(load_params(path), device=device)
        runner.run("train")
        assert runner.global_step == 3
        states[device] = {k: v.detach().clone() for k, v in runner.model.state_dict().items()}
    for key, value in states["CPU"].items():
        assert torch.equal(value, states["CSX"][key]), key
