"""The 6 Release 2.10 files of models/vision/dino/configs (5 DINOv2 pretraining files, model.name dino, and
the linear-probe params_dinov2_large_eval_linear, model.name vision_transformer), read from the local mirror of
github:Cerebras/modelzoo and shrunk by tools/modelzoo_files.py (only sizes, batch, steps and data paths
changed) over generated images in the ImageNet layout: each passes validate-only and trains 5 steps on CPU and
5 on CSX fx with the same losses (within 1e-3 relative: the files' bfloat16 autocast; CPU and CSX differ by
~1e-5 at step 1, measured; with precision off they are bit-identical, losses and every weight, the EMA
teacher and the loss centers included: checked on one file in the sweep). bs2048's side-by-side schedules
(CosineDecayWD and one SequentialLR per param_group_tags) give every tagged group its own learning rate,
checked by hand at step 5. The whole sweep is ~4 minutes on a 2-core host; the smoke test runs one file in
make test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from modelzoo_file_helpers import cli, mz, needs_mirror, shrunk, write

import cs_run as cstorch
from cs_run.summaries import read_scalars

CONFIGS = "src/cerebras/modelzoo/models/vision/dino/configs/"
FILES = ("params_dinov2_giant_patch14_img1036", "params_dinov2_large_224_bs2048", "params_dinov2_large_eval_linear",
         "params_dinov2_large_patch14_img224", "params_dinov2_large_patch14_img518",
         "params_dinov2_large_patch16_img224")
pytestmark = needs_mirror


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    pytest.importorskip("PIL.Image")
    root = tmp_path_factory.mktemp("imagenet")
    mz.write_images(root)
    return root


def test_the_tool_finds_the_six_files():
    names = [n for n in mz.decoder_files("Release_2.10.0") if "/vision/dino/configs/" in n]
    assert sorted(Path(n).stem for n in names) == sorted(FILES)


def _params(name: str, images: Path, tmp_path: Path) -> Path:
    params = shrunk(f"{CONFIGS}{name}.yaml", images, tmp_path)
    fit = params["trainer"]["fit"]
    for key in ("train_dataloader", "val_dataloader"):
        if isinstance(fit.get(key), dict):
            fit[key] = dict(fit[key], num_workers=0)  # worker processes on a 2-core test host; same batches
    params["trainer"]["init"].setdefault("logging", {})["log_steps"] = 1  # every step's loss (a step count)
    return write(params, tmp_path / "p.yaml")


def _run(name: str, images: Path, tmp_path: Path, precision: bool = True) -> tuple[dict, dict]:
    path = _params(name, images, tmp_path)
    if not precision:
        raw = yaml.safe_load(path.read_text())
        raw["trainer"]["init"]["precision"]["enabled"] = False
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
    cli("validate-only", "--params", path, "--model_dir", tmp_path / "v")
    # eval_linear sets no trainer.init.seed: its head's init and its crops draw from the global generator, so
    # each run starts from one state, as a fresh process does (runs one after another in this process differ)
    torch.manual_seed(0)
    cli("train", "--params", path, "--model_dir", tmp_path / "cpu", "--device", "CPU")
    torch.manual_seed(0)
    cli("train", "--params", path, "--model_dir", tmp_path / "csx", "--device", "CSX", "--compile_tier", "fx")
    cpu, csx = (read_scalars(tmp_path / d / "train") for d in ("cpu", "csx"))
    assert [step for step, _ in cpu["loss"]] == [1, 2, 3, 4, 5] == [step for step, _ in csx["loss"]]
    assert all(np.isfinite(loss) for _, loss in cpu["loss"])
    for (_, a), (_, b) in zip(cpu["loss"], csx["loss"]):
        assert a == pytest.approx(b, rel=1e-3)
    return cpu, yaml.safe_load(path.read_text())


@pytest.mark.slow
def test_one_dino_file_validates_and_trains_5_steps_on_cpu_and_csx(tmp_path, images):
    cpu, _ = _run("params_dinov2_large_patch16_img224", images, tmp_path)
    # the loss is the sum of the two losses' summaries, each step
    for (_, total), (_, dino), (_, ibot) in zip(cpu["loss"], cpu["loss/DinoDistillationLoss"],
                                                cpu["loss/iBOTPatchLoss"]):
        assert total == pytest.approx(dino + ibot, rel=1e-5)


@pytest.mark.sweep
@pytest.mark.parametrize("name", FILES)
def test_file_validates_and_trains_5_steps_on_cpu_and_csx(tmp_path, images, name):
    cpu, params = _run(name, images, tmp_path)
    if name == "params_dinov2_large_224_bs2048":  # each tagged SequentialLR's warmup at step 5, by hand
        expected = sorted({s["SequentialLR"]["schedulers"][0]["LinearLR"]["end_learning_rate"] * 5
                           / s["SequentialLR"]["schedulers"][0]["LinearLR"]["total_iters"]
                           for s in params["trainer"]["init"]["schedulers"] if "SequentialLR" in s})
        logged = sorted({round(v[-1][1], 18) for k, v in cpu.items() if k.startswith("lr/")})
        assert len(logged) == len(expected)
        assert logged == pytest.approx(expected, rel=1e-6)


@pytest.mark.sweep
def test_without_mixed_precision_cpu_and_csx_fx_are_bit_identical(tmp_path, images):
    _run("params_dinov2_large_patch14_img224", images, tmp_path, precision=False)
    cpu, csx = (read_scalars(tmp_path / d / "train")["loss"] for d in ("cpu", "csx"))
    assert cpu == csx
    a, b = (cstorch.load(tmp_path / d / "checkpoint_5.mdl")["model"] for d in ("cpu", "csx"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert {"ema_step", "losses.model.1.center", "image_model_trunks.model.0.embedding_layer.mask_token"} <= a.keys()
