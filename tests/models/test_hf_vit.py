"""vision_transformer against transformers' ViTForImageClassification: an HF folder through ``checkpoint
convert --from hf`` evaluates (``cs-run eval`` on an ImageNet-layout folder) to transformers' loss on the
same images, the logits agree (float32, hf_helpers.TOL), and ``--to hf`` gives back the very tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner
from hf_helpers import TOL, assert_bit_equal, back_to_hf_is_exact, build, eval_loss, tiny_hf

from cs_run.checkpoint import save
from cs_run.frontends.checkpoint_cli import checkpoint as checkpoint_cli
from cs_run.models.vision_transformer import hf as vit_hf

Image = pytest.importorskip("PIL.Image")
st = pytest.importorskip("safetensors.torch")

BASE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, image_size=16,
            patch_size=4, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
CLASSES, PER_CLASS = ("n01", "n02", "n03"), 2


def _images(root, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """PNG images (lossless) in ``root/val/<class>/``; their pixels normalized by hand as the eval transforms
    (to_tensor, normalize 0.5 / 0.5) do, in the folder's sorted order, and their labels."""
    rng = np.random.default_rng(0)
    pixels, labels = [], []
    for label, name in enumerate(CLASSES):
        (root / "val" / name).mkdir(parents=True)
        for i in range(PER_CLASS):
            array = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            Image.fromarray(array).save(root / "val" / name / f"{i}.png")
            pixels.append(torch.from_numpy(array).permute(2, 0, 1).float() / 255)
            labels.append(label)
    return (torch.stack(pixels) - 0.5) / 0.5, torch.tensor(labels)


@pytest.mark.parametrize("extra", [pytest.param({}, id="qkv-bias"), pytest.param({"qkv_bias": False}, id="no-qkv-bias"),
                                   pytest.param({"hidden_act": "gelu_new", "layer_norm_eps": 1e-6}, id="gelu-new")])
def test_vit_gives_transformers_logits_and_back_is_exact(extra):
    hf = tiny_hf("ViTConfig", "ViTForImageClassification", **{**BASE, **extra})
    model = build(vit_hf.model_keys_from_hf_config(hf.config.to_dict()))
    vit_hf.from_hf_state_dict(model, hf.state_dict())
    images = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 2, 1])
    with torch.no_grad():
        theirs = hf(pixel_values=images, labels=labels)
        torch.testing.assert_close(model.model(images), theirs.logits, **TOL)
        torch.testing.assert_close(model((images, labels.int())), theirs.loss, **TOL)
    back = vit_hf.to_hf_state_dict(model, legacy=False)  # transformers 5's module names, as hf.state_dict()
    assert_bit_equal(back, hf.state_dict())


def test_convert_from_hf_evals_to_transformers_loss_and_back_is_exact(tmp_path):
    transformers = pytest.importorskip("transformers")
    hf = tiny_hf("ViTConfig", "ViTForImageClassification", **BASE)
    hf.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    pixels, labels = _images(tmp_path / "data", 16)
    with torch.no_grad():
        hf_loss = hf(pixel_values=pixels, labels=labels).loss.item()

    result = CliRunner().invoke(checkpoint_cli, ["convert", "--from", "hf", str(tmp_path / "hf"),
                                                 str(tmp_path / "model.mdl")])
    assert result.exit_code == 0, result.output
    written = yaml.safe_load((tmp_path / "model.yaml").read_text())
    assert written["model"]["name"] == "vision_transformer"
    eval_input = {**written["eval_input"], "data_dir": str(tmp_path / "data"), "batch_size": len(labels)}
    params = {**written, "train_input": {**written["train_input"], "data_dir": str(tmp_path / "data")},
              "eval_input": eval_input, "runconfig": {"model_dir": str(tmp_path / "run"), "disable_progress_bar": True}}
    loss = eval_loss(params, tmp_path / "params.yaml", tmp_path / "model.mdl")
    assert loss == pytest.approx(hf_loss, rel=1e-5), (loss, hf_loss)

    again = transformers.ViTForImageClassification.from_pretrained(str(back_to_hf_is_exact(tmp_path, "vit"))).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(pixel_values=pixels).logits, hf(pixel_values=pixels).logits, **TOL)


@pytest.mark.parametrize("change, key", [
    ({"image_size": [16, 8]}, "image_size"),
    ({"use_conv_patchified_embedding": False}, "use_conv_patchified_embedding"),
    ({"use_encoder_pooler_layer": True}, "use_encoder_pooler_layer"),
    ({"norm_first": False}, "norm_first"),
])
def test_to_hf_refuses_a_model_hf_vit_cannot_express(tmp_path, change, key):
    """A model key HF's ViT config cannot carry is one params error naming it, and nothing is written."""
    keys = {**vit_hf.model_keys_from_hf_config(tiny_hf("ViTConfig", "ViTForImageClassification",
                                                        **BASE).config.to_dict()), **change}
    model = build(keys)
    save({"model": model.state_dict()}, str(tmp_path / "m.mdl"))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"model": keys}))
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--to", "hf", str(tmp_path / "m.mdl"),
                                                 str(tmp_path / "back"), "--params", str(tmp_path / "p.yaml")])
    assert result.exit_code != 0 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"Error: params: model.{key}: "), result.output
    assert not (tmp_path / "back").exists()
