"""``checkpoint convert --to hf`` / ``--from hf`` for gpt3, btlm and jais (Model Zoo Release 2.10's
btlm_hf_cs.py, jais_hf_cs.py and gpt2_hf_cs.py).

gpt3 is exported as transformers' GPT2LMHeadModel: logits and loss within 1e-5 of transformers on the same
weights (hf_helpers.TOL), the folder read back bit for bit, and a table of keys GPT-2 cannot express refused
by name. btlm and jais are remote-code models transformers lacks (its ``jais2`` is another architecture),
so their reference is the vendor converter's mapping, written out here by hand: the tensor names and
transforms (Conv1D transposes, q/k/v fused in ``c_attn``, the SwiGLU gate ``c_fc2``, the ALiBi slopes) and
the config.json fields; the model read back from that folder gives the original's logits exactly, and
both equal the Model Zoo formulas by hand (test_jais_btlm_by_hand._hand) within 1e-5.
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from click.testing import CliRunner
from hf_helpers import TOL, assert_same, build
from test_jais_btlm_by_hand import BTLM, JAIS, _hand, _slopes

from cs_run.checkpoint import load, save
from cs_run.frontends.checkpoint_cli import checkpoint as checkpoint_cli
from cs_run.models.btlm import hf as btlm_hf
from cs_run.models.common.hf import build as build_keys

transformers = pytest.importorskip("transformers")
st = pytest.importorskip("safetensors.torch")

V, SEQ = 97, 12
GPT3 = dict(name="gpt3", vocab_size=V, hidden_size=48, num_hidden_layers=2, num_heads=4, filter_size=96,
            max_position_embeddings=32, position_embedding_type="learned", nonlinearity="gelu", norm_type="layernorm",
            layer_norm_epsilon=1e-5, use_projection_bias_in_attention=True, use_ffn_bias_in_attention=True,
            use_ffn_bias=True, share_embedding_weights=True, dropout_rate=0.0, attention_dropout_rate=0.0,
            embedding_dropout_rate=0.0, attention_type="scaled_dot_product")
# btlm with the 2.10 file's muP form (one width multiplier: base sizes 1/4 of the sizes) and ALiBi scaling 2
BTLM_HF = {**{k: v for k, v in BTLM.items() if k != "attention_logits_alpha"}, "mup_base_hidden_size": 12,
           "mup_base_filter_size": 16}


def _checkpoint(tmp_path, keys: dict, seed: int = 0):
    """A cs-run model of ``keys`` with random weights (norms near 1), saved with its params file."""
    torch.manual_seed(seed)
    model = build(keys)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save({"model": model.state_dict()}, str(tmp_path / "ours.mdl"))
    (tmp_path / "ours.yaml").write_text(yaml.safe_dump({"model": keys}))
    return model


def _convert(*args):
    return CliRunner().invoke(checkpoint_cli, ["convert", *map(str, args)])


def _to_hf(tmp_path):
    return _convert("--to", "hf", tmp_path / "ours.mdl", tmp_path / "hf", "--params", tmp_path / "ours.yaml")


def _assert_one_error(result, start: str, *absent):
    assert result.exit_code != 0 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("Error: ") and start in result.output, result.output
    for path in absent:
        assert not path.exists(), path


def _same_checkpoints(a, b) -> None:
    ours, back = load(str(a))["model"], load(str(b))["model"]
    assert ours.keys() == back.keys()
    for key in ours:
        assert torch.equal(torch.as_tensor(ours[key]), torch.as_tensor(back[key])), key


# ------------------------------------------------------------------ gpt3: a GPT-2 folder

def test_gpt3_exports_as_gpt2_with_transformers_logits_and_loss_and_reads_back_exactly(tmp_path):
    model = _checkpoint(tmp_path, GPT3)
    result = _to_hf(tmp_path)
    assert result.exit_code == 0, result.output
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (cfg["model_type"], cfg["architectures"]) == ("gpt2", ["GPT2LMHeadModel"])
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    assert_same(hf, model.eval(), V, SEQ)

    result = _convert("--from", "hf", tmp_path / "hf", tmp_path / "back.mdl")
    assert result.exit_code == 0, result.output
    _same_checkpoints(tmp_path / "ours.mdl", tmp_path / "back.mdl")


@pytest.mark.parametrize("change, key", [
    ({"embeddings_scale": 14.6}, "embeddings_scale"),
    ({"scale_qk_dot_by_d": True}, "scale_qk_dot_by_d"),
    ({"mup_base_hidden_size": 12, "mup_base_filter_size": 24, "output_logits_alpha": 2.22},
     "output_logits_scale_applied"),
    ({"position_embedding_type": "alibi"}, "position_embedding_type"),
    ({"nonlinearity": "swiglu"}, "nonlinearity"),
    ({"norm_type": "rmsnorm"}, "norm_type"),
    ({"use_bias_in_output": True}, "use_bias_in_output"),
])
def test_gpt3_that_gpt2_cannot_express_is_one_error_naming_the_key(tmp_path, change, key):
    _checkpoint(tmp_path, {**GPT3, **change})
    _assert_one_error(_to_hf(tmp_path), f"Error: params: model.{key}: ", tmp_path / "hf")


# ------------------------------------------------------------------ btlm and jais: the vendor's folder

def _vendor_names(keys: dict) -> set[str]:
    """The tensors btlm_hf_cs.py / jais_hf_cs.py (Release 2.10, CS 2.1+ rules) give an HF BTLM / JAIS LM head
    model of ``keys``: GPT-2's names with ``mlp.c_fc2`` and ``transformer.relative_pe.slopes``, lm_head."""
    per_layer = ["ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_fc2", "mlp.c_proj"]
    alibi = keys["position_embedding_type"] == "alibi"
    names = {"transformer.wte.weight", "transformer.relative_pe.slopes" if alibi else "transformer.wpe.weight",
             "transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"}
    return names | {f"transformer.h.{i}.{m}.{kind}" for i in range(keys["num_hidden_layers"]) for m in per_layer
                    for kind in ("weight", "bias")}


@pytest.mark.parametrize("keys, config", [
    pytest.param(JAIS, {"model_type": "jais", "architectures": ["JAISLMHeadModel"], "mup_width_scale": 8 / 32,
                        "mup_output_alpha": 2.22, "alibi_scaling": None}, id="jais"),
    pytest.param(BTLM_HF, {"model_type": "btlm", "architectures": ["BTLMLMHeadModel"], "mup_width_scale": 12 / 48,
                           "mup_output_alpha": 2.22, "alibi_scaling": {"type": "linear", "factor": 2.0}},
                 id="btlm-6-heads-alibi-scaled"),
    pytest.param({**JAIS, "position_embedding_type": "learned", "share_embedding_weights": False},
                 {"model_type": "jais", "architectures": ["JAISLMHeadModel"], "mup_width_scale": 8 / 32,
                  "mup_output_alpha": 2.22, "position_embedding_type": "learned", "tie_word_embeddings": False},
                 id="jais-learned-positions-untied"),
])
def test_btlm_and_jais_write_the_vendor_folder_and_read_it_back_exactly(tmp_path, keys, config):
    model = _checkpoint(tmp_path, keys)
    result = _to_hf(tmp_path)
    assert result.exit_code == 0, result.output
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    want = {**config, "n_embd": keys["hidden_size"], "n_inner": keys["filter_size"], "n_head": keys["num_heads"],
            "n_layer": 2, "n_positions": SEQ, "vocab_size": V, "activation_function": "swiglu",
            "position_embedding_type": "alibi", "mup_embeddings_scale": 14.6, "mup_scale_qk_dot_by_d": True,
            "scale_attn_weights": True, "tie_word_embeddings": True, **config}
    assert {k: cfg[k] for k in want} == want
    assert cfg["auto_map"]["AutoModelForCausalLM"].endswith(f"modeling_{keys['name']}.{config['architectures'][0]}")

    hf = st.load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(hf) == _vendor_names(keys)
    sd, h = model.state_dict(), keys["hidden_size"]
    attn, ffn = "model.transformer_decoder.layers.1.self_attn.", "model.transformer_decoder.layers.1.ffn.ffn."
    assert torch.equal(hf["transformer.h.1.attn.c_attn.weight"],  # Conv1D [in, 3 * out]: q, k, v columns
                       torch.cat([sd[attn + f"proj_{n}_dense_layer.weight"] for n in "qkv"]).t())
    assert torch.equal(hf["transformer.h.1.attn.c_attn.bias"][h:2 * h], sd[attn + "proj_k_dense_layer.bias"])
    assert torch.equal(hf["transformer.h.1.mlp.c_fc2.weight"], sd[ffn + "0.linear_layer_for_glu.weight"].t())
    assert torch.equal(hf["transformer.h.1.mlp.c_proj.weight"], sd[ffn + "1.linear_layer.weight"].t())
    if keys["position_embedding_type"] == "alibi":
        assert torch.equal(hf["transformer.relative_pe.slopes"], torch.tensor(_slopes(keys["num_heads"]))[:, None])
    else:
        assert torch.equal(hf["transformer.wpe.weight"], sd["model.embedding_layer.position_embeddings.embed.weight"])

    result = _convert("--from", "hf", tmp_path / "hf", tmp_path / "back.mdl")
    assert result.exit_code == 0, result.output
    _same_checkpoints(tmp_path / "ours.mdl", tmp_path / "back.mdl")
    back_keys = yaml.safe_load((tmp_path / "back.yaml").read_text())["model"]
    back = build(back_keys)
    back.load_state_dict({k: torch.as_tensor(v) for k, v in load(str(tmp_path / "back.mdl"))["model"].items()})
    ids = torch.randint(0, V, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, again = model.eval().model(ids), back.eval().model(ids)
    assert torch.equal(again, logits)
    if keys["position_embedding_type"] == "alibi":  # _hand computes ALiBi positions
        torch.testing.assert_close(again.double(), _hand(keys, dict(model.state_dict()), ids), **TOL)


def test_a_tied_folder_without_lm_head_reads_as_the_same_checkpoint(tmp_path, btlm_folder):
    """save_pretrained leaves a tied head out; the embedding is the head."""
    tensors = st.load_file(str(btlm_folder / "model.safetensors"))
    del tensors["lm_head.weight"]
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text((btlm_folder / "config.json").read_text())
    st.save_file(tensors, str(tmp_path / "hf" / "model.safetensors"))
    result = _convert("--from", "hf", tmp_path / "hf", tmp_path / "back.mdl")
    assert result.exit_code == 0, result.output
    _same_checkpoints(btlm_folder.parent / "ours.mdl", tmp_path / "back.mdl")


@pytest.fixture(scope="module")
def btlm_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("btlm_hf")
    _checkpoint(root, BTLM_HF)
    assert _to_hf(root).exit_code == 0
    return root / "hf"


def _slopes_doubled(cfg, tensors):
    tensors["transformer.relative_pe.slopes"] = tensors["transformer.relative_pe.slopes"] * 2


@pytest.mark.parametrize("damage, message", [
    (lambda c, t: c.update(alibi_scaling={"type": "linear", "train_seq_len": 8}), "config.json: alibi_scaling: "),
    (lambda c, t: c.update(position_embedding_type="rotary"), "config.json: position_embedding_type 'rotary'"),
    (lambda c, t: c.update(activation_function="gelu_pytorch_tanh"),
     "config.json: activation_function 'gelu_pytorch_tanh'"),
    (lambda c, t: c.update(reorder_and_upcast_attn=True), "config.json: reorder_and_upcast_attn=true"),
    (lambda c, t: c.update(mup_width_scale=0), "config.json: mup_width_scale: expected a positive number"),
    (lambda c, t: c.update(model_type="gpt2"),  # gpt2's converter: a BTLM folder is not GPT-2's
     "config.json: activation_function 'swiglu' has no cs-run gpt2 equivalent"),
    (_slopes_doubled, "transformer.relative_pe.slopes are not ALiBi's slopes for 6 heads"),
    (lambda c, t: t.pop("transformer.h.1.mlp.c_fc2.weight"), "missing: transformer.h.1.mlp.c_fc2.weight"),
    (lambda c, t: c.update(activation_function="gelu"), "not used by the config: transformer.h.0.mlp.c_fc2.bias"),
], ids=["dynamic-alibi-scaling", "rotary", "tanh-gelu", "reorder-upcast", "zero-width", "as-gpt2", "slopes",
        "no-gate", "gate-without-swiglu"])
def test_bad_btlm_folders_are_one_error_line_and_write_nothing(tmp_path, btlm_folder, damage, message):
    cfg = json.loads((btlm_folder / "config.json").read_text())
    tensors = st.load_file(str(btlm_folder / "model.safetensors"))
    damage(cfg, tensors)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    st.save_file(tensors, str(tmp_path / "hf" / "model.safetensors"))
    result = _convert("--from", "hf", tmp_path / "hf", tmp_path / "x.mdl")
    _assert_one_error(result, message, tmp_path / "x.mdl", tmp_path / "x.yaml")


@pytest.mark.parametrize("change, key", [
    ({"attention_logits_alpha": 0.7}, "attention_logits_alpha"),
    ({"scale_output_logits_by_d": False}, "scale_output_logits_by_d"),
    ({"mup_base_filter_size": 21.0}, "mup_base_filter_size"),  # HF has one width scale for both sizes
    ({"alibi_trainable_slopes": True}, "alibi_trainable_slopes"),
    ({"use_ffn_bias": False}, "use_ffn_bias"),
    ({"norm_type": "rmsnorm"}, "norm_type"),
])
def test_btlm_the_vendor_config_cannot_express_is_one_error_naming_the_key(tmp_path, change, key):
    _checkpoint(tmp_path, {**BTLM_HF, **change})
    _assert_one_error(_to_hf(tmp_path), f"Error: params: model.{key}: ", tmp_path / "hf")


# The sizes and muP keys of Release 2.10's params_btlm_2p7b_8k.yaml and params_jais_13b.yaml (model sections)
BTLM_2P7B = dict(name="btlm", vocab_size=50257, hidden_size=2560, num_hidden_layers=32, num_heads=32,
                 filter_size=6826, max_position_embeddings=8192, position_embedding_type="alibi", nonlinearity="swiglu",
                 mup_base_hidden_size=256, mup_base_filter_size=682.6, output_logits_alpha=2.22,
                 scale_qk_dot_by_d=True, embeddings_scale=14.6, share_embedding_weights=True, use_bias_in_output=False)
JAIS_13B = {**BTLM_2P7B, "name": "jais", "vocab_size": 84992, "hidden_size": 5120, "num_hidden_layers": 40,
            "num_heads": 40, "filter_size": 13653, "max_position_embeddings": 2048, "mup_base_filter_size": 682.65}


@pytest.mark.parametrize("keys, width", [(BTLM_2P7B, 0.1), (JAIS_13B, 0.05)], ids=["btlm-2p7b-8k", "jais-13b"])
def test_the_model_zoo_files_mup_keys_survive_the_hf_config_both_ways(keys, width):
    """One width scale carries both base sizes: 13653 * 0.05 is 682.6500000000001 in binary, read back as the
    file's 682.65 (else --to hf would refuse jais-13b's own file by mup_base_filter_size). Built on the meta
    device: the sizes are the files', nothing is allocated."""
    cfg = btlm_hf.hf_config({**keys, **build_keys(keys, meta=True).config})
    assert (cfg["mup_width_scale"], cfg["mup_output_alpha"], cfg["mup_embeddings_scale"]) == (width, 2.22, 14.6)
    back = btlm_hf.model_keys_from_hf_config(cfg, keys["name"])
    assert {k: back[k] for k in ("mup_base_hidden_size", "mup_base_filter_size", "output_logits_alpha")} == \
        {k: keys[k] for k in ("mup_base_hidden_size", "mup_base_filter_size", "output_logits_alpha")}
