"""vision_transformer against transformers' CLIPVisionModelWithProjection (the vendor's clip_vit converter's
pairing): the logits are CLIP's image_embeds (float32, hf_helpers.TOL), the loss their cross entropy, an HF
folder converts with ``--from hf`` and ``--to hf`` gives back the very tensors; llava's tower is this map."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner
from hf_helpers import TOL, assert_bit_equal, back_to_hf_is_exact, build, tiny_hf

from cs_run.checkpoint import load
from cs_run.frontends.checkpoint_cli import checkpoint as checkpoint_cli
from cs_run.models.vision_transformer import clip

st = pytest.importorskip("safetensors.torch")

BASE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, image_size=28,
            patch_size=14, projection_dim=8)


def _check(model, hf) -> None:
    images = torch.randn(3, 3, 28, 28, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 7, 3])
    with torch.no_grad():
        embeds = hf(pixel_values=images).image_embeds
        torch.testing.assert_close(model.model(images), embeds, **TOL)
        torch.testing.assert_close(model((images, labels.int())), F.cross_entropy(embeds, labels), **TOL)


@pytest.mark.parametrize("extra", [pytest.param({}, id="quick-gelu"),
                                   pytest.param({"hidden_act": "gelu", "layer_norm_eps": 1e-6}, id="gelu")])
def test_clip_vision_gives_transformers_image_embeds_and_back_is_exact(extra):
    hf = tiny_hf("CLIPVisionConfig", "CLIPVisionModelWithProjection", **{**BASE, **extra})
    model = build(clip.model_keys_from_hf_config(hf.config.to_dict()))
    clip.from_hf_state_dict(model, hf.state_dict())
    _check(model, hf)
    back = clip.to_hf_state_dict(model)
    assert_bit_equal(back, hf.state_dict())


def test_convert_from_hf_and_back_is_exact(tmp_path):
    transformers = pytest.importorskip("transformers")
    hf = tiny_hf("CLIPVisionConfig", "CLIPVisionModelWithProjection", **BASE)
    hf.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--from", "hf", str(tmp_path / "hf"),
                                                 str(tmp_path / "model.mdl")])
    assert result.exit_code == 0, result.output
    written = yaml.safe_load((tmp_path / "model.yaml").read_text())
    assert written["model"]["name"] == "vision_transformer" and written["model"]["nonlinearity"] == "quick_gelu"
    model = build(written["model"])
    model.load_state_dict({k: torch.as_tensor(v) for k, v in load(str(tmp_path / "model.mdl"))["model"].items()})
    _check(model, hf)
    again = transformers.CLIPVisionModelWithProjection.from_pretrained(str(back_to_hf_is_exact(tmp_path, "clip_vision_model"))).eval()
    _check(model, again)


def test_a_folder_without_the_projection_is_one_error(tmp_path):
    """A plain CLIPVisionModel folder has no classifier to give the vision_transformer: refused by name."""
    hf = tiny_hf("CLIPVisionConfig", "CLIPVisionModelWithProjection", **BASE)
    hf.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    tensors = st.load_file(str(tmp_path / "hf" / "model.safetensors"))
    del tensors["visual_projection.weight"]
    st.save_file(tensors, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--from", "hf", str(tmp_path / "hf"),
                                                 str(tmp_path / "model.mdl")])
    assert result.exit_code != 0 and result.output.count("\n") == 1, result.output
    assert "visual_projection.weight" in result.output and not (tmp_path / "model.mdl").exists()
