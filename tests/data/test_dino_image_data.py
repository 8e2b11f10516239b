"""DinoImageDataProcessor over generated images in the ImageNet layout: the batch's views, labels and masks
(shapes, dtypes, the vendor's mask count rule), a per-crop list value reaching only its crop, the same batches
from the same shuffle_seed, and bad sections as one error naming the key."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from cs_run.data.processors.dino_image import build_dataloader
from cs_run.errors import ParamsError

Image = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    out = tmp_path_factory.mktemp("imagenet")
    rng = np.random.default_rng(0)
    for c in ("n01", "n02"):
        (out / "train" / c).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (40, 44, 3), dtype=np.uint8)).save(out / "train" / c / f"{i}.JPEG")
    return out


def section(root, **changes) -> dict:
    """The vendor files' section (patch14_img224) at 2 x 2 / 1 x 1 patches of 14."""
    crops = {"global_num_crops": 2, "local_num_crops": 3, "global_image_size": 28, "local_image_size": 14,
             "global_crops_scale": [0.32, 1], "local_crops_scale": [0.05, 0.32],
             "multicrop_transform_list": [
                 {"name": "random_horizontal_flip", "p": 0.5},
                 {"name": "color_jitter_with_prob", "brightness": 0.4, "contrast": 0.4, "saturation": 0.2, "hue": 0.1,
                  "p": 0.8},
                 {"name": "random_gray_scale", "p": 0.2},
                 {"name": "random_gaussian_blur_random_radius", "p": [1.0, 0.1, 0.5, 0.5, 0.5], "radius_min": 0.1,
                  "radius_max": 2.0},
                 {"name": "random_solarize", "threshold": 128, "p": [0.0, 0.2, 0.0, 0.0, 0.0]},
                 {"name": "to_tensor"},
                 {"name": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}]}
    masks = {"image_size": 56, "patch_size": 14, "mask_probability": 0.5, "mask_ratio_tuple": [0.1, 0.5]}
    out = {"batch_size": 4, "shuffle": True, "shuffle_seed": 1456354, "num_workers": 0,
           "dataset": {"name": "Imagenet", "root": str(root), "split": "train"},
           "ssl_transform": {"name": "Dinov2Transform", "multi_crop_transform": crops,
                             "masked_patch_transform": masks}}
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = out
        for p in parents:
            node = node[p]
        if value is None:
            node.pop(last)
        else:
            node[last] = value
    return out


def test_a_batch_holds_the_views_labels_and_masks(root):
    batch = next(iter(build_dataloader("train", **section(root))))
    assert set(batch) == {"global_view", "local_view", "labels", "collated_masks"}
    assert batch["global_view"].shape == (4, 2, 3, 28, 28) and batch["global_view"].dtype == torch.float32
    assert batch["local_view"].shape == (4, 3, 3, 14, 14)
    assert batch["labels"].shape == (4,) and set(batch["labels"].tolist()) <= {0, 1}
    masks = batch["collated_masks"]
    assert masks.shape == (4, 2, 16) and masks.dtype == torch.bool
    # int(4 x 2 x 0.5) = 4 of the 8 global crops are given masks (a block may find no room: at most 4),
    # each at most mask_probability x 16 = 8 patches
    counts = masks.flatten(0, 1).sum(-1)
    assert 1 <= int((counts > 0).sum()) <= 4 and int(counts.max()) <= 8


def test_a_list_value_as_long_as_the_crops_is_one_value_per_crop(root):
    gray = {"name": "random_gray_scale", "p": [1.0, 0.0, 1.0, 0.0, 0.0]}
    s = section(root, **{"ssl_transform.multi_crop_transform.multicrop_transform_list": [gray, {"name": "to_tensor"}]})
    batch = next(iter(build_dataloader("train", **s)))
    g, loc = batch["global_view"], batch["local_view"]
    assert torch.equal(g[:, 0, 0], g[:, 0, 1]) and torch.equal(g[:, 0, 1], g[:, 0, 2])  # crop 0: gray
    assert torch.equal(loc[:, 0, 0], loc[:, 0, 2])  # crop 2 (the first local): gray
    assert not torch.equal(g[:, 1, 0], g[:, 1, 1]) and not torch.equal(loc[:, 1, 0], loc[:, 1, 1])


def test_the_same_seed_gives_the_same_batches(root):
    a, b = (next(iter(build_dataloader("train", **section(root)))) for _ in range(2))
    c = next(iter(build_dataloader("train", **section(root, shuffle_seed=7))))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["global_view"], c["global_view"])


BAD = [
    ({"dataset.name": "CIFAR10"}, r"train_input\.dataset\.name: 'CIFAR10'; cs-run reads Imagenet"),
    ({"dataset.split": "val"}, r"train_input\.dataset\.root: .*/val is not a folder"),
    ({"dataset.root": None}, r"train_input\.dataset\.root: missing"),
    ({"ssl_transform.name": "IJEPATransform"}, r"train_input\.ssl_transform\.name: 'IJEPATransform'"),
    ({"ssl_transform.multi_crop_transform.local_num_crops": None},
     r"train_input\.ssl_transform\.multi_crop_transform\.local_num_crops: missing"),
    ({"ssl_transform.multi_crop_transform.crop_size": 3},
     r"train_input\.ssl_transform\.multi_crop_transform\.crop_size: unknown key"),
    ({"ssl_transform.multi_crop_transform.multicrop_transform_list": [{"name": "random_erasing"}]},
     r"multicrop_transform_list\[0\]: 'random_erasing' is not a transform cs-run applies"),
    ({"ssl_transform.multi_crop_transform.multicrop_transform_list": [{"name": "normalize", "mean": [0] * 3,
                                                                       "std": [1] * 3}]},
     r"multicrop_transform_list: no to_tensor"),
    ({"ssl_transform.masked_patch_transform.transform_list": [{"name": "to_tensor"}]},
     r"masked_patch_transform\.transform_list: Dinov2Transform composes it"),
    ({"pad_last": True}, r"train_input\.pad_last: padding the last batch is not built"),
]


@pytest.mark.parametrize("changes, message", BAD)
def test_bad_sections_are_one_error_naming_the_key(root, changes, message):
    with pytest.raises(ParamsError, match=message) as info:
        build_dataloader("train", **copy.deepcopy(section(root, **changes)))
    assert "\n" not in str(info.value)
