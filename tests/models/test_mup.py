"""muP (Cerebras-GPT's muP files: mup_base_hidden_size / mup_base_filter_size, scale_qk_dot_by_d,
output_logits_alpha, embeddings_scale) against numbers worked out by hand from the Model Zoo's
gpt2_model.py: width multiplier 64/16 = 4, filter multiplier 128/64 = 2, 2 layers (depth factor
(2*2)^-0.5 = 1/2), initializer truncated normal std 0.08 cut at +-0.16."""

from __future__ import annotations

import fnmatch
import math

import pytest
import torch

from cs_run.models.common.lm import build_model

TRUNC = {"name": "truncated_normal", "mean": 0.0, "std": 0.08, "a": -0.16, "b": 0.16}
MUP = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_heads=4, filter_size=128,
           max_position_embeddings=32, dropout_rate=0.0, attention_dropout_rate=0.0, embedding_initializer=TRUNC,
           initializer=TRUNC, output_layer_initializer=TRUNC, mup_base_hidden_size=16, mup_base_filter_size=64,
           scale_qk_dot_by_d=True, output_logits_alpha=1.0, embeddings_scale=10.0)


def make(**overrides):
    torch.manual_seed(0)
    return build_model(**{**MUP, **overrides}).eval()


def test_lr_adjustment_groups_are_one_over_the_width_multipliers():
    m = make()
    scales = {name: scale for name, (_, scale) in m.lr_adjustment_groups.items()}
    assert scales == {"embedding": 1.0, "decoder_kernel": 1.0, "decoder_attention": 0.25, "decoder_input_ffn": 0.25,
                      "decoder_output_ffn": 0.5}
    names = [n for n, _ in m.named_parameters()]

    def members(group):
        return sorted(n for n in names if any(fnmatch.fnmatchcase(n, p) for p in m.lr_adjustment_groups[group][0]))

    assert len(members("decoder_attention")) == 8  # q, k, v, output of 2 layers
    assert members("decoder_input_ffn") == [f"model.transformer_decoder.layers.{i}.ffn.ffn.0.linear_layer.weight"
                                            for i in (0, 1)]
    assert members("decoder_output_ffn") == [f"model.transformer_decoder.layers.{i}.ffn.ffn.1.linear_layer.weight"
                                             for i in (0, 1)]


def test_the_optimizer_groups_carry_the_scales():
    """The groups configure_param_groups makes of the model's (globs, scale) pairs: each weight's lr factor by
    hand (they were read as scale 1.0 before, so no muP run scaled its learning rates)."""
    from cs_run.optim.param_groups import configure_param_groups  # noqa: PLC0415 - this test only

    m = make()
    names = {id(p): n for n, p in m.named_parameters()}
    scale = {names[id(p)]: g.get("adjust_learning_rate", 1.0) for g in configure_param_groups(m, {})
             for p in g["params"]}
    for name, value in scale.items():
        want = 0.25 if "attn" in name and name.endswith("weight") or "ffn.ffn.0" in name and name.endswith(
            "weight") else 0.5 if "ffn.ffn.1" in name and name.endswith("weight") else 1.0
        assert value == want, name


@pytest.mark.parametrize("module,bound", [
    ("self_attn.proj_q_dense_layer", 0.16 * 4 ** -0.5),  # initializer * width^-1/2
    ("self_attn.proj_output_dense_layer", 0.16 * 4 ** -0.5 * 0.5),  # output initializer * width^-1/2 * depth
    ("ffn.ffn.0.linear_layer", 0.16 * 4 ** -0.5),  # ffn falls back to initializer, scaled by width
    ("ffn.ffn.1.linear_layer", 2 * 0.02 * 2 ** -0.5 * 0.5),  # default trunc(initializer_range) * filter^-1/2 * depth
])
def test_initializers_are_scaled_as_the_model_zoo_scales_them(module, bound):
    w = make().model.transformer_decoder.layers[0].get_submodule(module).weight
    assert w.abs().max() <= bound * (1 + 1e-6)
    assert w.abs().max() > 0.8 * bound  # thousands of samples from a normal cut at 2 std reach 1.6 std


def test_embeddings_and_output_logits_are_scaled():
    m = make()
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    seen = {}
    m.model.transformer_decoder.layers[0].register_forward_pre_hook(lambda mod, args: seen.update(x=args[0]))
    m.model.ln_f.register_forward_hook(lambda mod, args, out: seen.update(h=out))
    with torch.no_grad():
        logits = m.model(ids)
    e = m.model.embedding_layer
    torch.testing.assert_close(seen["x"], (e.word_embeddings.weight[ids] + e.position_embeddings.embed.weight[:16]) * 10)
    torch.testing.assert_close(logits, seen["h"] @ e.word_embeddings.weight.T * 0.25)  # alpha / width


def test_attention_logits_are_divided_by_head_dim_not_its_root():
    a = make().model.transformer_decoder.layers[0].self_attn
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        q, k, v = (lin(x).view(2, 8, 4, 16).transpose(1, 2)
                   for lin in (a.proj_q_dense_layer, a.proj_k_dense_layer, a.proj_v_dense_layer))
        causal = torch.full((8, 8), float("-inf")).triu(1)
        w = torch.softmax(q @ k.transpose(-1, -2) / 16 + causal, dim=-1)  # 1/d with d = 64/4, muP
        expected = a.proj_output_dense_layer((w @ v).transpose(1, 2).reshape(2, 8, 64))
        mask = torch.zeros(8, 8).masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)
        torch.testing.assert_close(a(x, mask), expected)
    assert not math.isclose(1 / 16, 1 / math.sqrt(16))


@pytest.mark.parametrize("overrides,match", [
    ({"mup_base_filter_size": None}, "mup_base_hidden_size"),
    ({"output_logits_scale": 0.3}, "output_logits_scale"),
    ({"initializer": {"name": "xavier_uniform"}}, "initializer"),
    ({"initializer": {"name": "truncated_normal", "sdt": 0.1}}, "initializer.sdt"),
])
def test_inconsistent_mup_keys_are_errors_naming_the_key(overrides, match):
    with pytest.raises(ValueError, match=match):
        make(**overrides)
