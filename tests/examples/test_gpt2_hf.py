"""gpt2 <-> Hugging Face GPT-2: transformers' GPT2LMHeadModel gives cs-run's logits, and the way back is exact."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from click.testing import CliRunner

from cs_run.checkpoint import save
from cs_run.frontends.cli import cli
from cs_run.models.common.lm import build_model

pytest.importorskip("safetensors")

SIZES = dict(vocab_size=61, hidden_size=24, num_hidden_layers=2, num_heads=3, filter_size=40,
             max_position_embeddings=20, dropout_rate=0.1, attention_type="scaled_dot_product")


def trained_like(**overrides):
    """A gpt2 with every weight perturbed (biases and LayerNorms too), saved like a run saves it."""
    torch.manual_seed(0)
    model = build_model(**{**SIZES, **overrides})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def write_run(tmp_path, model, keys):
    ckpt = tmp_path / "run" / "checkpoint_10.mdl"
    ckpt.parent.mkdir()
    save({"model": model.state_dict(), "global_step": 10}, str(ckpt))
    (ckpt.parent / "params_resolved.yaml").write_text(yaml.safe_dump({"model": {"name": "gpt2", **keys}}))
    return ckpt


def convert(*args):
    return CliRunner().invoke(cli, ["checkpoint", "convert", *args])


@pytest.mark.parametrize("overrides", [
    {}, {"nonlinearity": "gelu_new", "share_embedding_weights": False},
    {"attention_type": "dot_product", "use_projection_bias_in_attention": False, "use_ffn_bias": False,
     "nonlinearity": "relu", "layer_norm_epsilon": 1e-6},
])
def test_transformers_gives_the_same_logits_and_the_way_back_is_exact(tmp_path, overrides):
    transformers = pytest.importorskip("transformers")
    model = trained_like(**overrides).eval()
    ckpt = write_run(tmp_path, model, {**SIZES, **overrides})
    hf_dir = tmp_path / "hf"
    result = convert("--to", "hf", str(ckpt), str(hf_dir))
    assert result.exit_code == 0, result.output
    config = json.loads((hf_dir / "config.json").read_text())
    assert (config["n_embd"], config["n_layer"], config["n_inner"]) == (24, 2, 40)

    hf = transformers.GPT2LMHeadModel.from_pretrained(str(hf_dir)).eval()
    ids = torch.randint(0, 61, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = hf(ids).logits
        ours = model.model(ids.int())
    # Same float32 math in another order (fused qkv, Conv1D addmm): agreement to 1e-5 absolute.
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)

    back = tmp_path / "back.mdl"
    result = convert("--from", "hf", str(hf_dir), str(back))
    assert result.exit_code == 0, result.output
    keys = yaml.safe_load(back.with_suffix(".yaml").read_text())["model"]
    again = build_model(**{k: v for k, v in keys.items() if k != "name"})
    from cs_run.checkpoint import load

    again.load_state_dict(load(str(back))["model"])
    for key, value in model.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


@pytest.mark.parametrize("key,value", [("position_embedding_type", "fixed"), ("use_bias_in_output", True),
                                       ("embedding_layer_norm", True), ("nonlinearity", "squared_gelu"),
                                       ("output_logits_scale", 2.0)])
def test_features_hf_cannot_express_are_errors_naming_the_key(tmp_path, key, value):
    overrides = {key: value, "share_embedding_weights": False} if key == "use_bias_in_output" else {key: value}
    model = trained_like(**overrides)
    ckpt = write_run(tmp_path, model, {**SIZES, **overrides})
    result = convert("--to", "hf", str(ckpt), str(tmp_path / "hf"))
    assert result.exit_code == 2 and f"model.{key}" in result.output, result.output
    assert not (tmp_path / "hf" / "model.safetensors").exists()


def test_bad_inputs(tmp_path):
    model = trained_like()
    ckpt = tmp_path / "lone.mdl"
    save({"model": model.state_dict()}, str(ckpt))
    result = convert("--to", "hf", str(ckpt), str(tmp_path / "hf"))
    assert result.exit_code == 2 and "give --params" in result.output
    result = convert("--from", "hf", str(tmp_path), str(tmp_path / "x.mdl"))
    assert result.exit_code == 1 and "config.json not found" in result.output
    ckpt = write_run(tmp_path, model, {**SIZES, "hidden_size": 48})  # params disagree with the weights
    result = convert("--to", "hf", str(ckpt), str(tmp_path / "hf"))
    assert result.exit_code == 1 and "does not match" in result.output
