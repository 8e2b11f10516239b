"""``cs-run checkpoint convert --from hf`` / ``--to hf`` for every decoder family transformers implements
(gpt2 has its own tests in tests/examples/test_gpt2_hf.py).

Per family: a tiny random transformers model built locally (nothing downloaded) and written with
``save_pretrained`` (safetensors) goes through ``convert --from hf``; ``cs-run eval`` of the checkpoint
with the params file convert wrote, on Model Zoo shards of the same tokens, gives transformers' mean token
loss within 1e-5 relative (float32: a few ulps per op over 2 layers, see hf_helpers.TOL; the CLI prints 5
decimals, 1e-6 relative at these losses); ``--to hf`` gives back every tensor bit for bit, and
transformers loads the folder it writes and computes the same logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner
from hf_helpers import TOL, eval_loss, tiny_hf

from cs_run.checkpoint import load
from cs_run.frontends.checkpoint_cli import checkpoint as checkpoint_cli

transformers = pytest.importorskip("transformers")
st = pytest.importorskip("safetensors.torch")

V, MSL, N, BATCH = 61, 24, 8, 4  # vocab, sequence length, samples (2 eval batches, all full: equal token counts)

FAMILIES = [
    pytest.param("LlamaConfig", "LlamaForCausalLM", "llama",
                 dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
                 id="llama-gqa-llama3.1-rope"),
    pytest.param("MistralConfig", "MistralForCausalLM", "mistral",
                 dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, sliding_window=8,
                      tie_word_embeddings=False), id="mistral-sliding-window"),
    pytest.param("MixtralConfig", "MixtralForCausalLM", "mixtral",
                 dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2,
                      router_aux_loss_coef=0.02, tie_word_embeddings=False), id="mixtral-top2"),
    pytest.param("Gemma2Config", "Gemma2ForCausalLM", "gemma2",
                 dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, hidden_activation="gelu", sliding_window=6,
                      max_position_embeddings=64, query_pre_attn_scalar=24), id="gemma2"),
    pytest.param("Gemma2Config", "Gemma2ForCausalLM", "gemma2",  # transformers' defaults, as published Gemma 2s:
                 dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,  # tanh GELU
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=64), id="gemma2-published-defaults"),
    pytest.param("GPTJConfig", "GPTJForCausalLM", "gptj",
                 dict(n_positions=64, n_embd=64, n_layer=2, n_head=4, n_inner=96, rotary_dim=8, resid_pdrop=0.0,
                      embd_pdrop=0.0, attn_pdrop=0.0), id="gptj"),
    pytest.param("GPTNeoXConfig", "GPTNeoXForCausalLM", "gpt-neox",
                 dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                      max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0), id="gpt-neox"),
    pytest.param("FalconConfig", "FalconForCausalLM", "falcon",
                 dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
                      hidden_dropout=0.0, attention_dropout=0.0, new_decoder_architecture=True, num_kv_heads=2),
                 id="falcon-40b-layout"),
    pytest.param("FalconConfig", "FalconForCausalLM", "falcon",
                 dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
                      hidden_dropout=0.0, attention_dropout=0.0, multi_query=True, new_decoder_architecture=False),
                 id="falcon-7b-layout"),
    pytest.param("BloomConfig", "BloomForCausalLM", "bloom",
                 dict(hidden_size=48, n_layer=2, n_head=4, hidden_dropout=0.0, attention_dropout=0.0), id="bloom"),
    pytest.param("MptConfig", "MptForCausalLM", "mpt",
                 dict(d_model=64, n_layers=2, n_heads=4, max_seq_len=64, resid_pdrop=0.0, emb_pdrop=0.0), id="mpt"),
    pytest.param("MptConfig", "MptForCausalLM", "mpt",
                 dict(d_model=48, n_layers=2, n_heads=6, max_seq_len=32, tie_word_embeddings=False,
                      attn_config={"softmax_scale": 1.0}), id="mpt-6-heads-untied-dot-product"),
    pytest.param("GPTBigCodeConfig", "GPTBigCodeForCausalLM", "starcoder",
                 dict(n_embd=48, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0), id="starcoder"),
]


def _tokens() -> torch.Tensor:
    return torch.randint(0, V, (N, MSL + 1), generator=torch.Generator().manual_seed(3))


def _write_shards(folder, tokens: torch.Tensor) -> None:
    """The Model Zoo's HDF5 LM layout: data [n, 3, msl] (input_ids, input_mask, labels = next tokens)."""
    folder.mkdir()
    t = tokens.numpy().astype(np.int32)
    data = np.stack([t[:, :-1], np.ones_like(t[:, :-1]), t[:, 1:]], axis=1)
    with h5py.File(folder / "examples_0.h5", "w") as f:
        f.attrs["n_examples"] = len(data)
        f.create_dataset("data", data=data, dtype="i4", chunks=(1, 3, MSL))


def _convert(*args):
    result = CliRunner().invoke(checkpoint_cli, ["convert", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("config_cls, model_cls, name, config", FAMILIES)
def test_convert_from_hf_evals_to_transformers_loss_and_back_is_exact(tmp_path, config_cls, model_cls, name,
                                                                     config):
    hf = tiny_hf(config_cls, model_cls, vocab_size=V, **config)
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(str(hf_dir), safe_serialization=True)
    tokens = _tokens()
    with torch.no_grad():
        hf_loss = hf(input_ids=tokens, labels=tokens).loss.item()  # mean over all N * MSL next tokens

    _convert("--from", "hf", hf_dir, tmp_path / "model.mdl")
    written = yaml.safe_load((tmp_path / "model.yaml").read_text())
    assert written["model"]["name"] == name

    _write_shards(tmp_path / "eval", tokens)
    params = {**written, "eval_input": {"data_processor": "GptHDF5DataProcessor", "data_dir": str(tmp_path / "eval"),
                                        "batch_size": BATCH, "shuffle": False},
              "runconfig": {"model_dir": str(tmp_path / "run"), "disable_progress_bar": True}}
    loss = eval_loss(params, tmp_path / "params.yaml", tmp_path / "model.mdl")
    assert loss == pytest.approx(hf_loss, rel=1e-5), (loss, hf_loss)

    _convert("--to", "hf", tmp_path / "model.mdl", tmp_path / "back", "--params", tmp_path / "model.yaml")
    theirs, ours = st.load_file(str(hf_dir / "model.safetensors")), st.load_file(str(tmp_path / "back" /
                                                                                       "model.safetensors"))
    theirs = {("embed_out.weight" if k == "lm_head.weight" and "embed_out.weight" in ours else k): v
              for k, v in theirs.items()}  # transformers 5 writes GPT-NeoX's embed_out as lm_head
    assert theirs.keys() <= ours.keys()
    for key, value in theirs.items():
        if name == "gemma2" and "norm" in key:  # stored as 1 + w (Gemma scales by 1 + weight): w + 1 - 1 in
            assert (ours[key] - value).abs().max() <= 2 ** -24, key  # float32 is w to half an ulp of 1.0
        else:
            assert torch.equal(ours[key], value), key
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == hf.config.model_type
    again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "back")).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=tokens).logits, hf(input_ids=tokens).logits, **TOL)


def _converted(root: Path, config_cls: str, model_cls: str, config: dict):
    """A tiny transformers model saved as ``root/hf`` and ``--from hf`` converted to ``root/model.mdl`` (and
    ``model.yaml``): (root, the transformers model)."""
    hf = tiny_hf(config_cls, model_cls, vocab_size=V, **config)
    hf.save_pretrained(str(root / "hf"), safe_serialization=True)
    _convert("--from", "hf", root / "hf", root / "model.mdl")
    return root, hf


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return _converted(tmp_path_factory.mktemp("llama_hf"), "LlamaConfig", "LlamaForCausalLM", FAMILIES[0].values[3])[0]



def _drop(name):
    return lambda cfg, tensors: tensors.pop(name)


def _add(name, value):
    return lambda cfg, tensors: tensors.update({name: value})


@pytest.mark.parametrize("damage, message", [
    (lambda c, t: c.update(num_hidden_layers=3), "config.json says 3 layer(s) but the weights hold 2 layer(s) (0 .. 1)"),
    (lambda c, t: c.update(num_hidden_layers=10 ** 9), "missing: model.layers.2.input_layernorm.weight"),
    (lambda c, t: c.update(intermediate_size=128), "misshaped: model.layers.0.mlp.up_proj.weight is [96, 64], the "
                                                   "config says [128, 64]"),
    (_drop("model.norm.weight"), "missing: model.norm.weight"),
    (_add("model.extra.weight", torch.zeros(2)), "not used by the config: model.extra.weight"),
    (_add("model.layers.2.mlp.up_proj.weight", torch.zeros(96, 64)), "the weights hold 3 layer(s) (0 .. 2)"),
    (_add("model.step", torch.zeros(2, dtype=torch.int64)), "model.step (I64): not floating-point weights"),
    (lambda c, t: c.pop("hidden_size"), "missing or unusable key 'hidden_size'"),
    (lambda c, t: c.update(num_attention_heads=0), "config.json: params: model: num_heads: must be >= 1, got 0"),
    (lambda c, t: c.update(num_attention_heads=5), "hidden_size: 64 is not divisible by num_heads (5)"),
    (lambda c, t: c.update(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}),
     "rope_scaling type 'yarn' has no"),
], ids=["more-layers", "absurd-layers", "misshaped", "missing", "unused", "extra-layer", "int-tensor",
        "no-hidden-size", "zero-heads", "heads-not-dividing", "rope-yarn"])
def test_bad_hf_folders_are_one_error_line_and_write_nothing(tmp_path, llama_folder, damage, message):
    """Each mismatch is found from config.json and the safetensors header (a 10**9-layer config allocates
    nothing: the expected tensors come from a meta-device model no larger than the file)."""
    cfg = json.loads((llama_folder / "hf" / "config.json").read_text())
    tensors = st.load_file(str(llama_folder / "hf" / "model.safetensors"))
    damage(cfg, tensors)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    st.save_file(tensors, str(tmp_path / "hf" / "model.safetensors"))
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--from", "hf", str(tmp_path / "hf"),
                                                 str(tmp_path / "x.mdl")])
    assert result.exit_code != 0 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("Error: ") and message in result.output, result.output
    assert not (tmp_path / "x.mdl").exists() and not (tmp_path / "x.yaml").exists()


@pytest.mark.parametrize("change, key", [
    ({"embeddings_scale": 2.0}, "embeddings_scale"),
    ({"scale_qk_dot_by_d": True}, "scale_qk_dot_by_d"),
    ({"attention_logit_softcapping": 30.0}, "attention_logit_softcapping"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
])
def test_to_hf_refuses_a_model_the_hf_family_cannot_express(tmp_path, llama_folder, change, key):
    """A model key the HF config cannot carry is one params error naming it, never a silently different model."""
    written = yaml.safe_load((llama_folder / "model.yaml").read_text())
    written["model"].update(change)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(written))
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--to", "hf", str(llama_folder / "model.mdl"),
                                                 str(tmp_path / "back"), "--params", str(tmp_path / "p.yaml")])
    assert result.exit_code != 0 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"Error: params: model.{key}: "), result.output
    assert "has no Hugging Face llama equivalent" in result.output
    assert not (tmp_path / "back").exists()


MIXTRAL = FAMILIES[2].values[3]


@pytest.fixture(scope="module")
def mixtral_folder(tmp_path_factory):
    return _converted(tmp_path_factory.mktemp("mixtral_hf"), "MixtralConfig", "MixtralForCausalLM", MIXTRAL)


def test_mixtral_folder_in_the_fused_transformers_5_layout_converts_to_the_same_checkpoint(tmp_path, mixtral_folder):
    """save_pretrained writes the per-expert layout; a state dict saved as is (``mlp.experts.gate_up_proj``)
    is read too, to the same tensors."""
    root, hf = mixtral_folder
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text((root / "hf" / "config.json").read_text())
    st.save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(tmp_path / "hf" / "model.safetensors"))
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in hf.state_dict())
    _convert("--from", "hf", tmp_path / "hf", tmp_path / "model.mdl")
    ours, want = (load(str(p))["model"] for p in (tmp_path / "model.mdl", root / "model.mdl"))
    assert ours.keys() == want.keys()
    for key in want:
        assert torch.equal(torch.as_tensor(ours[key]), torch.as_tensor(want[key])), key


@pytest.mark.parametrize("moe, key", [
    ({"null_expert_bias": 0.5}, "moe.null_expert_bias"),
    ({"router_selection_nonlinearity": "sigmoid"}, "moe.router_selection_nonlinearity"),
    ({"expert_weighting_normalization": False}, "moe.expert_weighting_normalization"),
    ({"router_fp32": False}, "moe.router_fp32"),
])
def test_to_hf_refuses_mixtral_routing_hf_does_not_compute(tmp_path, mixtral_folder, moe, key):
    """HF's Mixtral routes one way (fp32 softmax, top-k, renormalised): any other moe value is one params
    error naming the key inside the section."""
    root, _ = mixtral_folder
    written = yaml.safe_load((root / "model.yaml").read_text())
    written["model"]["moe"].update(moe)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(written))
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--to", "hf", str(root / "model.mdl"),
                                                 str(tmp_path / "back"), "--params", str(tmp_path / "p.yaml")])
    assert result.exit_code != 0 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"Error: params: model.{key}: "), result.output
    assert "has no Hugging Face mixtral equivalent" in result.output
    assert not (tmp_path / "back").exists()


@pytest.fixture(scope="module")
def mpt_folder(tmp_path_factory):
    return _converted(tmp_path_factory.mktemp("mpt_hf"), "MptConfig", "MptForCausalLM", FAMILIES[9].values[3])[0]


def _attn(**change):
    return lambda cfg: cfg["attn_config"].update(change)


@pytest.mark.parametrize("damage, key", [
    (_attn(alibi=False), "attn_config.alibi: False"),
    (_attn(alibi_bias_max=16), "attn_config.alibi_bias_max: 16"),
    (_attn(clip_qkv=6.0), "attn_config.clip_qkv: 6.0"),
    (_attn(qk_ln=True), "attn_config.qk_ln: True"),
    (_attn(prefix_lm=True), "attn_config.prefix_lm: True"),
    (_attn(attn_type="multiquery_attention"), "attn_config.attn_type: 'multiquery_attention'"),
    (_attn(softmax_scale=0.5), "attn_config.softmax_scale: 0.5"),
    (lambda c: c.update(no_bias=False), "no_bias: False"),
    (lambda c: c.update(expansion_ratio=2), "expansion_ratio: 2"),
    (lambda c: c.update(logit_scale=2.0), "logit_scale: 2.0"),
    (lambda c: c.update(norm_type="rmsnorm"), "norm_type: 'rmsnorm'"),
])
def test_mpt_configs_transformers_does_not_compute_are_one_error_naming_the_key(tmp_path, mpt_folder, damage, key):
    """transformers' MPT ignores these keys (one model whatever they say): converting such a folder would
    give a model that neither it nor the original computes."""
    cfg = json.loads((mpt_folder / "hf" / "config.json").read_text())
    damage(cfg)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "hf" / "model.safetensors").write_bytes((mpt_folder / "hf" / "model.safetensors").read_bytes())
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--from", "hf", str(tmp_path / "hf"),
                                                 str(tmp_path / "x.mdl")])
    assert result.exit_code != 0 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"Error: config.json: {key}"), result.output
    assert not (tmp_path / "x.mdl").exists() and not (tmp_path / "x.yaml").exists()


@pytest.mark.parametrize("change, key", [
    ({"nonlinearity": "relu"}, "nonlinearity"),
    ({"pos_scaling_factor": 2.0}, "pos_scaling_factor"),
    ({"attention_logits_alpha": 0.5}, "attention_logits_alpha"),
    ({"loss_scaling": "batch_size"}, None),  # the loss, not the model: converts
])
def test_to_hf_refuses_an_mpt_model_transformers_does_not_compute(tmp_path, mpt_folder, change, key):
    written = yaml.safe_load((mpt_folder / "model.yaml").read_text())
    written["model"].update(change)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(written))
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--to", "hf", str(mpt_folder / "model.mdl"),
                                                 str(tmp_path / "back"), "--params", str(tmp_path / "p.yaml")])
    if key is None:
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code != 0 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"Error: params: model.{key}: "), result.output
    assert "has no Hugging Face mpt equivalent" in result.output
    assert not (tmp_path / "back").exists()
