"""ImageNet1KProcessor (cs_run.data.processors.imagenet) on generated image folders: labels are the sorted
class folders' indices, the eval transforms give the pixels computed by hand, shuffling is seeded and for
the train split only, and every bad input is one ParamsError naming the key (or file) and the fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cs_run.data.processors.imagenet import build_dataloader
from cs_run.errors import ParamsError

Image = pytest.importorskip("PIL.Image")

CLASSES = ("n02", "n01", "n10")  # written unsorted: the labels follow the sorted names
EVAL = [{"name": "to_tensor"}, {"name": "normalize", "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.5]}]


@pytest.fixture
def folder(tmp_path) -> tuple[Path, dict]:
    """``train/`` and ``val/`` with 3 PNGs (lossless) per class, 8x6; name -> (pixels, class name)."""
    rng = np.random.default_rng(0)
    arrays = {}
    for split in ("train", "val"):
        for name in CLASSES:
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(3):
                array = rng.integers(0, 256, (8, 6, 3), dtype=np.uint8)
                Image.fromarray(array).save(tmp_path / split / name / f"img{i}.png")
                arrays[f"{split}/{name}/img{i}"] = array
    (tmp_path / "val" / "n01" / "notes.txt").write_text("not an image")  # skipped: not an image extension
    return tmp_path, arrays


def _batches(loader) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = zip(*loader)
    return torch.cat(images), torch.cat(labels)


def test_eval_split_is_the_val_folder_in_order_with_hand_normalized_pixels(folder):
    root, arrays = folder
    loader = build_dataloader("eval", data_dir=str(root), batch_size=3, transforms=EVAL, shuffle=True)
    images, labels = _batches(loader)
    assert labels.dtype == torch.int32
    assert labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # n01, n02, n10; eval never shuffles
    mean, std = np.array([0.5, 0.4, 0.3]), np.array([0.2, 0.25, 0.5])
    for k, (name, i) in enumerate((n, i) for n in sorted(CLASSES) for i in range(3)):
        expected = (arrays[f"val/{name}/img{i}"] / 255.0 - mean) / std
        torch.testing.assert_close(images[k], torch.from_numpy(expected.transpose(2, 0, 1)).float(),
                                   rtol=0, atol=1e-6)


def test_train_split_shuffles_by_seed_and_crops_and_flips(folder):
    root, arrays = folder
    specs = [{"name": "center_crop", "size": [4, 4]}, {"name": "random_horizontal_flip", "p": 1.0},
             {"name": "to_tensor"}]
    first = _batches(build_dataloader("train", data_dir=str(root), batch_size=3, transforms=specs, shuffle_seed=3))
    again = _batches(build_dataloader("train", data_dir=str(root), batch_size=3, transforms=specs, shuffle_seed=3))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert first[1].tolist() != sorted(first[1].tolist())  # shuffled (seed 3 moves the order)
    assert sorted(first[1].tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # by hand: the central 4x4 of an 8x6 image (rows 2..5, columns 1..4), mirrored left-right
    by_hand = [torch.from_numpy(a[2:6, 1:5][:, ::-1] / 255.0).permute(2, 0, 1).float() for a in arrays.values()]
    for image in first[0]:
        assert min((image - h).abs().max().item() for h in by_hand) <= 1e-6


def test_resize_and_random_resized_crop_give_the_asked_size(folder):
    root, _ = folder
    specs = [{"name": "resize", "size": [10, 12]}, {"name": "random_resized_crop", "size": [5, 7],
                                                   "scale": [0.08, 1.0], "ratio": [0.75, 1.33]}, {"name": "to_tensor"}]
    images, _ = _batches(build_dataloader("train", data_dir=str(root), batch_size=9, transforms=specs, shuffle_seed=0))
    assert images.shape == (9, 3, 5, 7)
    noaug, _ = _batches(build_dataloader("eval", data_dir=str(root), batch_size=9, noaugment=True, image_size=[4, 5]))
    assert noaug.shape == (9, 3, 4, 5)


def _corrupt(root: Path) -> None:
    (root / "val" / "n01" / "img0.png").write_bytes(b"\x89PNG broken")


@pytest.mark.parametrize("change, damage, message", [
    ({"data_dir": None}, None, r"eval_input\.data_dir: not set"),
    ({"data_dir": "{root}/nowhere"}, None, r"eval_input\.data_dir: .*nowhere/val is not a folder"),
    ({"transforms": [{"name": "to_tensor"}, {"name": "autoaug"}]}, None,
     r"eval_input\.transforms\[1\]: 'autoaug' is not a transform cs-run applies"),
    ({"transforms": [{"name": "resize", "size": [4, 4]}]}, None, r"eval_input\.transforms: no to_tensor"),
    ({"transforms": None}, None, r"eval_input\.transforms: not set"),
    ({"num_classes": 1000}, None, r"eval_input\.num_classes: 1000, but .* holds 3 class folders"),
    ({"data_processor": "ImageNet21KProcessor"}, None, r"eval_input\.data_processor: 'ImageNet21KProcessor'"),
    ({"sampler": "repeated-aug"}, None, r"eval_input\.sampler: 'repeated-aug' is not supported"),
    ({}, "empty", r"eval_input\.data_dir: no images under"),
    ({}, "corrupt", r"img0\.png is not a readable image"),
])
def test_bad_inputs_are_one_params_error_naming_what_and_where(folder, change, damage, message):
    root, _ = folder
    if damage == "empty":
        for f in (root / "val").rglob("*.png"):
            f.unlink()
    elif damage == "corrupt":
        _corrupt(root)
    args = {"data_dir": str(root), "batch_size": 3, "transforms": EVAL}
    args.update({k: (v.format(root=root) if isinstance(v, str) and "{root}" in v else v) for k, v in change.items()})
    with pytest.raises(ParamsError, match=message) as info:
        list(build_dataloader("eval", **args))
    assert "\n" not in str(info.value)
