"""llava against transformers' LlavaForConditionalGeneration (CLIP vision tower, Llama text model): an HF
folder through ``checkpoint convert --from hf`` gives transformers' logits and loss on the same images and
tokens (float32, hf_helpers.TOL), ``--to hf`` gives back the very tensors, and a model HF's LLaVA cannot
express is one error naming the key."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from click.testing import CliRunner
from hf_helpers import TOL, assert_bit_equal, back_to_hf_is_exact, build, tiny_hf, to_hf_is_refused

from cs_run.checkpoint import load
from cs_run.frontends.checkpoint_cli import checkpoint as checkpoint_cli
from cs_run.models.llava import hf as llava_hf

st = pytest.importorskip("safetensors.torch")

VISION = dict(hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=32, image_size=28,
              patch_size=14, hidden_act="quick_gelu")
TEXT = dict(model_type="llama", vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=48, max_position_embeddings=32, rms_norm_eps=1e-5)
PATCHES, SEQ = 4, 12


def _tiny(**extra):
    return tiny_hf("LlavaConfig", "LlavaForConditionalGeneration", vision_config=VISION, text_config=TEXT,
                   image_token_index=63, **extra)


def _batch(start: int = 1, patches: int = PATCHES) -> dict:
    """Two samples: the image's placeholders at ``start``, the second padded after 8 tokens; the loss on the
    tokens after the image (the last position never scored: HF's shifted labels cannot hold it)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 62, (2, SEQ), generator=g, dtype=torch.int32)
    labels = torch.randint(3, 62, (2, SEQ), generator=g, dtype=torch.int32)
    padding = torch.zeros(2, SEQ, dtype=torch.int32)
    padding[1, 8:] = 1
    mask = torch.zeros(2, SEQ, dtype=torch.int32)
    mask[:, start + patches - 1:SEQ - 1] = 1
    mask[1, 8:] = 0
    images = torch.randn(2, 3, 28, 28, generator=g)
    return {"image_data": images, "text_input_ids": ids, "labels": labels, "loss_mask": mask,
            "key_padding_mask": padding}


def _transformers(hf, batch: dict, start: int = 1, patches: int = PATCHES):
    """HF's logits and loss of ``batch``: its image tokens where the placeholders are, its labels shifted as HF
    shifts them (position t + 1 holds the label of t), -100 where the loss mask is 0."""
    ids = batch["text_input_ids"].long().clone()
    ids[:, start:start + patches] = hf.config.image_token_id
    shifted = torch.full_like(ids, -100)
    shifted[:, 1:] = torch.where(batch["loss_mask"].bool(), batch["labels"].long(), -100)[:, :-1]
    with torch.no_grad():
        out = hf(input_ids=ids, pixel_values=batch["image_data"], attention_mask=1 - batch["key_padding_mask"],
                 labels=shifted)
    return out.logits, out.loss


@pytest.mark.parametrize("extra", [pytest.param({}, id="default"),
                                   pytest.param({"vision_feature_layer": -1, "vision_feature_select_strategy": "full",
                                                 "projector_hidden_act": "relu"}, id="full-last-relu"),
                                   pytest.param({"vision_feature_layer": 1}, id="first-layer")])
def test_llava_gives_transformers_logits_and_loss_and_back_is_exact(extra):
    hf = _tiny(**extra)
    model = build(llava_hf.model_keys_from_hf_config(hf.config.to_dict()))
    llava_hf.from_hf_state_dict(model, hf.state_dict())
    patches = PATCHES + (extra.get("vision_feature_select_strategy") == "full")
    batch = _batch(patches=patches)
    logits, loss = _transformers(hf, batch, patches=patches)
    with torch.no_grad():
        torch.testing.assert_close(model.logits(batch), logits, **TOL)
        torch.testing.assert_close(model(batch), loss, **TOL)
    back = llava_hf.to_hf_state_dict(model, legacy=False)  # transformers 5's module names, as hf.state_dict()
    assert_bit_equal(back, hf.state_dict())


def test_convert_from_hf_and_back_is_exact(tmp_path):
    transformers = pytest.importorskip("transformers")
    hf = _tiny()
    hf.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--from", "hf", str(tmp_path / "hf"),
                                                 str(tmp_path / "model.mdl")])
    assert result.exit_code == 0, result.output
    written = yaml.safe_load((tmp_path / "model.yaml").read_text())
    assert written["model"]["name"] == "llava"
    assert written["train_input"]["data_processor"] == "LlavaHDF5MapDataProcessor"
    model = build(written["model"])
    model.load_state_dict({k: torch.as_tensor(v) for k, v in load(str(tmp_path / "model.mdl"))["model"].items()})
    batch = _batch()
    logits, loss = _transformers(hf, batch)
    with torch.no_grad():
        torch.testing.assert_close(model.logits(batch), logits, **TOL)
        torch.testing.assert_close(model(batch), loss, **TOL)

    again = transformers.LlavaForConditionalGeneration.from_pretrained(str(back_to_hf_is_exact(tmp_path, "llava"))).eval()
    torch.testing.assert_close(_transformers(again, batch)[0], logits, **TOL)


def test_older_files_tower_prefix_reads_and_writes_back(tmp_path):
    """transformers 4's hub folders hold the tower under ``vision_tower.vision_model.``: read, and written back so."""
    hf = _tiny()
    tensors = {("vision_tower.vision_model." + k[len("vision_tower."):] if k.startswith("vision_tower.") else k): v
               for k, v in llava_hf.to_hf_state_dict(build(llava_hf.model_keys_from_hf_config(hf.config.to_dict())))
               .items()}
    model = build(llava_hf.model_keys_from_hf_config(hf.config.to_dict()))
    llava_hf.from_hf_state_dict(model, tensors)
    back = llava_hf.to_hf_state_dict(model, **llava_hf.ADAPTER.file_layout(tensors))
    assert back.keys() == tensors.keys() and all(torch.equal(back[k], v) for k, v in tensors.items())


@pytest.mark.parametrize("change, key", [
    ({"image_model": {"use_post_embed_layer_norm": False}}, "image_model.use_post_embed_layer_norm"),
    ({"image_model": {"image_size": [28, 14]}}, "image_model.image_size"),
    ({"projector": {"image_model": {"name": "FeedForwardNetwork", "input_unit": 16, "layers_units": [24, 32],
                                    "layers_activation": ["gelu", None]}}}, "projector.layers_units"),
    ({"text_model": {"norm_type": "layernorm"}}, "text_model.norm_type"),
])
def test_to_hf_refuses_a_model_hf_llava_cannot_express(tmp_path, change, key):
    """A model key HF's LLaVA config cannot carry is one params error naming it, and nothing is written."""
    keys = llava_hf.model_keys_from_hf_config(_tiny().config.to_dict())
    for name, value in change.items():
        keys[name] = {**keys[name], **value} if isinstance(value, dict) and name != "projector" else value
    output = to_hf_is_refused(tmp_path, keys)
    assert output.count("\n") == 1 and output.startswith(f"Error: params: model.{key}"), output


@pytest.mark.parametrize("config_change, message", [
    ({"vision_config": {**VISION, "num_hidden_layers": 4}}, "vision_config.num_hidden_layers"),
    ({"text_config": {**TEXT, "num_hidden_layers": 1}}, "text_config.num_hidden_layers"),
    ({"multimodal_projector_bias": False}, "not used by the config: multi_modal_projector.linear_1.bias"),
])
def test_from_hf_refuses_weights_that_do_not_match_the_config(tmp_path, config_change, message):
    """config.json and the weights disagree: one error naming what, before anything is written."""
    _tiny().save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **config_change}))
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--from", "hf", str(tmp_path / "hf"),
                                                 str(tmp_path / "model.mdl")])
    assert result.exit_code != 0 and result.output.count("\n") == 1, result.output
    assert message in result.output and not (tmp_path / "model.mdl").exists(), result.output
