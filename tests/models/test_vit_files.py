"""The Model Zoo 2.10 vision_transformer params files (read from the local mirror of github:Cerebras/modelzoo,
never copied here; skipped without it), as tiny copies: only sizes, batch, steps and data paths changed, over
a folder of generated images in the ImageNet layout. Each passes validate-only, trains 5 steps on CPU and 5 on
CSX (fx tier: the same losses, bit for bit), and its first training loss is transformers'
ViTForImageClassification loss on the same batch with the same weights (dropout and mixed precision off
for that run only, so that transformers in float32 computes the very same function)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner
from hf_helpers import TOL

from cs_run.frontends.cli import cli as main_cli
from cs_run.models.vision_transformer import hf as vit_hf
from cs_run.models.vision_transformer.model import ViTClassificationWrapperModel
from cs_run.summaries import read_scalars
from tests.modelzoo_marks import first_in_suite_rest_in_sweep

Image = pytest.importorskip("PIL.Image")

MIRROR = "/work/.mirror/Cerebras+modelzoo/repo"
CONFIGS = "src/cerebras/modelzoo/models/vision/vision_transformer/configs/"
FILES = ("params_vit_base_patch_16_imagenet_1k.yaml", "params_vit_huge_patch_16_imagenet_1k.yaml")
SIZES = dict(num_classes=3, hidden_size=32, num_hidden_layers=2, num_heads=4, filter_size=64, image_size=[16, 16],
             patch_size=[8, 8])
CLASSES = ("n01", "n02", "n03")


def _vendor_file(name: str) -> dict:
    try:
        text = subprocess.run(["git", f"--git-dir={MIRROR}", "show", f"Release_2.10.0:{CONFIGS}{name}"],
                              capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no local Model Zoo mirror (github:Cerebras/modelzoo)")
    return yaml.safe_load(text)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """``train/`` (4 per class) and ``val/`` (2 per class) of 20x24 JPEGs, seeded."""
    root = tmp_path_factory.mktemp("imagenet")
    rng = np.random.default_rng(0)
    for split, n in (("train", 4), ("val", 2)):
        for name in CLASSES:
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(root / split / name / f"{i}.JPEG")
    return root


def tiny_copy(name: str, images: Path, path: Path, **model) -> Path:
    """The vendor file with only sizes, batch, steps and data paths changed (``model``: more model keys)."""
    params = _vendor_file(name)
    init, fit = params["trainer"]["init"], params["trainer"]["fit"]
    init["model"].update(SIZES, **model)
    init["loop"]["max_steps"] = 5
    for loader in (fit["train_dataloader"], fit["val_dataloader"]):
        loader.update(data_dir=str(images), batch_size=4, num_classes=3, image_size=[16, 16], num_workers=0)
        for spec in loader["transforms"]:
            if "size" in spec:
                spec["size"] = [18, 18] if spec["name"] == "resize" and loader["split"] == "train" else [16, 16]
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def _cli(*args) -> None:
    result = CliRunner().invoke(main_cli, [*map(str, args)])
    assert result.exit_code == 0, result.output


def _losses(model_dir: Path) -> list[tuple[int, float]]:
    return read_scalars(model_dir / "train")["loss"]


class _Weights:
    """What to_hf_state_dict reads of a model (its state dict and resolved keys), for recorded weights."""

    def __init__(self, weights: dict, config: dict) -> None:
        self.weights, self.config = weights, config

    def state_dict(self) -> dict:
        return self.weights


@pytest.mark.slow
@pytest.mark.parametrize("name", first_in_suite_rest_in_sweep(FILES))
def test_vendor_file_validates_and_trains_5_steps_on_cpu_and_csx(tmp_path, images, name):
    params = tiny_copy(name, images, tmp_path / "p.yaml")
    _cli("validate-only", "--params", params, "--model_dir", tmp_path / "v")
    _cli("train", "--params", params, "--model_dir", tmp_path / "cpu", "--device", "CPU")
    _cli("train", "--params", params, "--model_dir", tmp_path / "csx", "--device", "CSX", "--compile_tier", "fx")
    cpu, csx = _losses(tmp_path / "cpu"), _losses(tmp_path / "csx")
    assert [step for step, _ in cpu] == [1, 2, 3, 4, 5]
    assert cpu == csx
    assert all(np.isfinite(loss) for _, loss in cpu)


@pytest.mark.parametrize("name", FILES)
def test_first_loss_is_transformers_loss_with_the_same_weights(tmp_path, images, name, monkeypatch):
    transformers = pytest.importorskip("transformers")
    params = tiny_copy(name, images, tmp_path / "p.yaml", dropout_rate=0.0, attention_dropout_rate=0.0,
                       embedding_dropout_rate=0.0)
    raw = yaml.safe_load(params.read_text())
    raw["trainer"]["init"]["precision"]["enabled"] = False
    raw["trainer"]["init"]["loop"]["max_steps"] = 1
    params.write_text(yaml.safe_dump(raw))
    seen = []
    forward = ViTClassificationWrapperModel.forward

    def recording(self, batch):
        if not seen:  # the first step: its batch and the weights it starts from
            seen.append(([t.clone() for t in batch], {k: v.clone() for k, v in self.state_dict().items()},
                         self.config))
        return forward(self, batch)
    monkeypatch.setattr(ViTClassificationWrapperModel, "forward", recording)
    _cli("train", "--params", params, "--model_dir", tmp_path / "cpu", "--device", "CPU")
    (images_, labels), weights, config = seen[0]
    hf = transformers.ViTForImageClassification(transformers.ViTConfig(**vit_hf.hf_config(config))).eval()
    hf.load_state_dict(vit_hf.to_hf_state_dict(_Weights(weights, config), legacy=False))
    with torch.no_grad():
        expected = hf(pixel_values=images_.float(), labels=labels.long()).loss.item()
    (step, first), = _losses(tmp_path / "cpu")
    assert step == 1
    print(f"{name}: first loss {first!r}, transformers {expected!r}")
    assert first == pytest.approx(expected, **{"rel": TOL["rtol"], "abs": TOL["atol"]})
