"""DinoImageDataProcessor: DINOv2's multi-crop views and iBOT patch masks of an ImageNet-layout image folder
(``dataset.root/<dataset.split>/<class>/<image>``, read as ImageNet1KProcessor reads it), as the Model Zoo 2.10
generic image encoders' Dinov2Transform makes them.

Each image gives ``global_num_crops`` random resized crops of ``global_image_size`` (scale
``global_crops_scale``) and ``local_num_crops`` of ``local_image_size``, each then through
``multicrop_transform_list`` (a list value as long as the crops is one value per crop, the vendor's rule), then
the run's floating-point type. A batch is ``{global_view [b, G, c, H, H], local_view [b, L, c, h, h], labels
[b], collated_masks [b, G, patches]}``: the masks are the vendor's (DINOv2's) block masks, ``int(b * G *
mask_probability)`` of the b x G global crops masked at ratios spread over ``mask_ratio_tuple``, the rest
unmasked, shuffled.

Augmentations run on Pillow (torchvision's rules for the crop, flip, colour jitter, grayscale and solarize;
the vendor's for the random-radius blur) with this loader's own random streams, seeded from ``shuffle_seed``
(and the worker id), so a run's batches do not depend on what else draws random numbers.
"""

from __future__ import annotations

import functools
import math
import random
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

from cs_run import amp
from cs_run.data.processors.imagenet import IMAGE_EXTENSIONS, ImageFolderDataset, _crop_box, _pil_image, _pil_transform, _resample
from cs_run.data.processors.mnist import ShardSampler
from cs_run.distributed import get_streaming_batch_size, get_streaming_rank, num_streamers
from cs_run.errors import ParamsError
from cs_run.registry import register_data_processor

__all__ = ["MultiCrop", "MaskCollate", "build_dataloader"]

_MULTI_CROP = {"name": None, "global_num_crops": ..., "global_image_size": ..., "global_crops_scale": ...,
               "local_num_crops": ..., "local_image_size": ..., "local_crops_scale": ...,
               "interpolation_type": "bicubic", "multicrop_transform_list": None}
_MASKED_PATCH = {"name": None, "image_size": ..., "patch_size": ..., "mask_probability": ...,
                 "mask_ratio_tuple": ..., "min_num_patches": 4, "min_aspect": 0.3, "max_aspect": None,
                 "composed_transform": False, "transform_list": None}
"""The vendor's ImageRandomMultiCropTransformConfig and MaskedPatchTransformConfig keys (``...``: required)."""
_AUGMENTATIONS = ("random_horizontal_flip", "color_jitter_with_prob", "random_gray_scale",
                  "random_gaussian_blur_random_radius", "random_solarize", "to_tensor", "normalize")


def _keys(value: Any, schema: dict, where: str) -> dict:
    if not isinstance(value, dict):
        raise ParamsError(f"params: {where}: expected a mapping of {', '.join(k for k in schema if k != 'name')}")
    for k in value:
        if k not in schema:
            raise ParamsError(f"params: {where}.{k}: unknown key; expected one of "
                              f"{', '.join(k for k in schema if k != 'name')}")
    for k, default in schema.items():
        if default is ... and k not in value:
            raise ParamsError(f"params: {where}.{k}: missing; the vendor's transform requires it")
    return {**{k: v for k, v in schema.items() if v is not ...}, **value}


def _random_resized_crop(img, size: int, scale: list, interp: str, g: torch.Generator):
    """torchvision's RandomResizedCrop (ratio 3/4 .. 4/3) from the generator ``g``."""
    width, height = img.size
    area, log_ratio = width * height, (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * torch.rand(1, generator=g).item())
        aspect = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * torch.rand(1, generator=g).item())
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=g).item())
            left = int(torch.randint(0, width - w + 1, (1,), generator=g).item())
            break
    else:  # torchvision's fallback: the central crop of the ratio's nearest bound
        in_ratio = width / height
        w, h = (width, int(round(width / (3 / 4)))) if in_ratio < 3 / 4 else \
            (int(round(height * 4 / 3)), height) if in_ratio > 4 / 3 else (width, height)
        w, h = min(w, width), min(h, height)
        top, left = (height - h) // 2, (width - w) // 2
    return img.resize((size, size), _resample(interp), box=_crop_box(top, left, h, w))


def _color_jitter(img, spec: dict, g: torch.Generator):
    """torchvision's ColorJitter on a PIL image: the four adjustments in a random order, each factor uniform."""
    from PIL import ImageEnhance  # noqa: PLC0415 - optional package (Pillow)
    image = _pil_image()
    factors = {}
    for name in ("brightness", "contrast", "saturation"):
        v = float(spec.get(name, 0) or 0)
        if v:
            lo, hi = max(0.0, 1 - v), 1 + v
            factors[name] = lo + (hi - lo) * torch.rand(1, generator=g).item()
    hue = float(spec.get("hue", 0) or 0)
    if hue:
        factors["hue"] = -hue + 2 * hue * torch.rand(1, generator=g).item()
    order = torch.randperm(4, generator=g).tolist()
    names = ("brightness", "contrast", "saturation", "hue")
    for i in order:
        name = names[i]
        if name not in factors:
            continue
        f = factors[name]
        if name == "brightness":
            img = ImageEnhance.Brightness(img).enhance(f)
        elif name == "contrast":
            img = ImageEnhance.Contrast(img).enhance(f)
        elif name == "saturation":
            img = ImageEnhance.Color(img).enhance(f)
        else:  # torchvision's PIL adjust_hue: shift the HSV hue channel (uint8, wrapping)
            h, s, v = img.convert("HSV").split()
            shifted = (np.asarray(h, dtype=np.uint8).astype(np.int16) + int(f * 255)) % 256
            img = image.merge("HSV", (image.fromarray(shifted.astype(np.uint8), "L"), s, v)).convert("RGB")
    return img


def _augmentation(spec: dict, where: str) -> Callable:
    """One vendor augmentation spec as ``f(img, g, rng)`` (``g`` torch's stream, ``rng`` Python's)."""
    from PIL import ImageFilter, ImageOps  # noqa: PLC0415 - optional package (Pillow)
    name, p = spec["name"], spec.get("p", 0.5)
    if name == "random_horizontal_flip":
        flip = _pil_image().FLIP_LEFT_RIGHT
        return lambda img, g, rng: img.transpose(flip) if torch.rand(1, generator=g).item() < p else img
    if name == "color_jitter_with_prob":  # p 0 (the vendor's default): always, else with probability p
        p = spec.get("p", 0)

        def color_jitter(img, g, rng):
            if p > 0 and torch.rand(1, generator=g).item() >= p:
                return img
            return _color_jitter(img, spec, g)
        return color_jitter
    if name == "random_gray_scale":
        p = spec.get("p", 0.1)
        return lambda img, g, rng: img.convert("L").convert("RGB") if torch.rand(1, generator=g).item() < p else img
    if name == "random_gaussian_blur_random_radius":
        lo, hi = spec.get("radius_min", 1.0), spec.get("radius_max", 2.0)
        return lambda img, g, rng: img.filter(ImageFilter.GaussianBlur(radius=rng.uniform(lo, hi))) \
            if rng.random() <= p else img
    if name == "random_solarize":
        if spec.get("threshold") is None:
            raise ParamsError(f"params: {where}.threshold: missing; random_solarize needs it")
        threshold = spec["threshold"]
        return lambda img, g, rng: ImageOps.solarize(img, threshold) if torch.rand(1, generator=g).item() < p else img
    step = _pil_transform(spec)  # to_tensor, normalize: no randomness
    return lambda img, g, rng: step(img)


class MultiCrop:
    """An image -> its global crops then its local crops, each augmented and cast (the vendor's
    ImageRandomMultiCropTransform.__call__). Holds its own random streams (:meth:`seed`)."""

    def __init__(self, cfg: dict, where: str, seed: int) -> None:
        self.global_num_crops, self.local_num_crops = cfg["global_num_crops"], cfg["local_num_crops"]
        total = self.global_num_crops + self.local_num_crops
        self.sizes = [cfg["global_image_size"]] * self.global_num_crops + [cfg["local_image_size"]] * self.local_num_crops
        self.scales = [cfg["global_crops_scale"]] * self.global_num_crops + [cfg["local_crops_scale"]] * self.local_num_crops
        if cfg["interpolation_type"] not in ("bicubic", "bilinear"):
            raise ParamsError(f"params: {where}.interpolation_type: {cfg['interpolation_type']!r}; cs-run applies "
                              "bicubic or bilinear")
        self.interp = cfg["interpolation_type"]
        specs = cfg["multicrop_transform_list"] or []
        self.steps: list[list[Callable]] = [[] for _ in range(total)]
        for n, spec in enumerate(specs):
            at = f"{where}.multicrop_transform_list[{n}]"
            if not isinstance(spec, dict) or spec.get("name") not in _AUGMENTATIONS:
                got = spec.get("name") if isinstance(spec, dict) else spec
                raise ParamsError(f"params: {at}: {got!r} is not a transform cs-run applies; expected one of "
                                  f"{', '.join(_AUGMENTATIONS)}")
            for i in range(total):  # a list as long as the crops: one value per crop
                one = {k: (v[i] if isinstance(v, list) and len(v) == total else v) for k, v in spec.items()}
                self.steps[i].append(_augmentation(one, at))
        if not any(s.get("name") == "to_tensor" for s in specs if isinstance(s, dict)):
            raise ParamsError(f"params: {where}.multicrop_transform_list: no to_tensor; the crops must become "
                              "tensors (add {name: to_tensor})")
        self.dtype = amp.get_floating_point_dtype()
        self.seed(seed)

    def seed(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.rng = random.Random(seed)

    def __call__(self, img) -> list:
        crops = []
        for size, scale, steps in zip(self.sizes, self.scales, self.steps):
            x = _random_resized_crop(img, size, scale, self.interp, self.generator)
            for step in steps:
                x = step(x, self.generator, self.rng)
            crops.append(x.to(self.dtype))
        return crops


class MaskCollate:
    """A list of (crops, label) -> the batch dict, with DINOv2's block masks of the global crops (the vendor's
    MaskedPatchTransform.collate_fn over batch x global crops). Holds its own Python random stream."""

    def __init__(self, cfg: dict, global_num_crops: int, seed: int) -> None:
        size = cfg["image_size"] if isinstance(cfg["image_size"], list) else [cfg["image_size"]] * 2
        patch = cfg["patch_size"] if isinstance(cfg["patch_size"], list) else [cfg["patch_size"]] * 2
        self.height, self.width = size[0] // patch[0], size[1] // patch[1]
        self.n_tokens = self.height * self.width
        self.mask_probability, self.mask_ratio_tuple = cfg["mask_probability"], cfg["mask_ratio_tuple"]
        self.min_num_patches = cfg["min_num_patches"]
        self.max_num_patches = self.mask_probability * self.n_tokens
        max_aspect = cfg["max_aspect"] if cfg["max_aspect"] is not None else 1 / cfg["min_aspect"]
        self.log_aspect_ratio = (math.log(cfg["min_aspect"]), math.log(max_aspect))
        self.global_num_crops = global_num_crops
        self.rng = random.Random(seed)

    def _mask(self, mask: np.ndarray, max_mask_patches: float) -> int:
        """One block of at most ``max_mask_patches`` new patches (ten tries), BEiT's Algorithm 1."""
        delta = 0
        for _ in range(10):
            target_area = self.rng.uniform(self.min_num_patches, max_mask_patches)
            aspect_ratio = math.exp(self.rng.uniform(*self.log_aspect_ratio))
            h = int(round(math.sqrt(target_area * aspect_ratio)))
            w = int(round(math.sqrt(target_area / aspect_ratio)))
            if w < self.width and h < self.height:
                top = self.rng.randint(0, self.height - h)
                left = self.rng.randint(0, self.width - w)
                num_masked = mask[top:top + h, left:left + w].sum()
                if 0 < h * w - num_masked <= max_mask_patches:
                    for i in range(top, top + h):
                        for j in range(left, left + w):
                            if mask[i, j] == 0:
                                mask[i, j] = 1
                                delta += 1
                if delta > 0:
                    break
        return delta

    def mask_gen(self, num_masking_patches: int) -> np.ndarray:
        mask = np.zeros((self.height, self.width), dtype=bool)
        count = 0
        while count < num_masking_patches:
            delta = self._mask(mask, min(num_masking_patches - count, self.max_num_patches))
            if delta == 0:
                break
            count += delta
        return mask

    def masks(self, n: int) -> torch.Tensor:
        """``[n, patches]`` bool: ``int(n * mask_probability)`` masked at ratios spread over the tuple."""
        n_masked = int(n * self.mask_probability)
        probs = torch.linspace(*self.mask_ratio_tuple, n_masked + 1)
        out = [torch.from_numpy(self.mask_gen(int(self.n_tokens * self.rng.uniform(float(probs[i]),
                                                                                   float(probs[i + 1])))))
               for i in range(n_masked)]
        out += [torch.from_numpy(self.mask_gen(0)) for _ in range(n_masked, n)]
        self.rng.shuffle(out)
        return torch.stack(out).flatten(1)

    def __call__(self, batch: list) -> dict:
        g = self.global_num_crops
        global_view = torch.stack([torch.stack([crops[i] for crops, _ in batch]) for i in range(g)], dim=1)
        local_view = torch.stack([torch.stack([crops[i] for crops, _ in batch])
                                  for i in range(g, len(batch[0][0]))], dim=1)
        masks = self.masks(len(batch) * g).reshape(len(batch), g, -1)
        return {"global_view": global_view, "local_view": local_view,
                "labels": torch.stack([label for _, label in batch]), "collated_masks": masks}


def _seed_worker(dataset: ImageFolderDataset, collate: MaskCollate, seed: int, worker_id: int) -> None:
    """Each worker's own streams: shuffle_seed + worker id (the vendor's _worker_init_fn rule); also called
    with id 0 where an input worker runs the loader itself. A worker process holds its own copies of both."""
    dataset.transform.seed(seed + worker_id)
    collate.rng.seed(seed + worker_id)


@register_data_processor("DinoImageDataProcessor")
def build_dataloader(split: str, ssl_transform: dict, dataset: dict, batch_size: int = 128,
                     data_processor: str = "DinoImageDataProcessor", shuffle: bool = True,
                     shuffle_seed: Optional[int] = 1456354, drop_last: bool = True, num_samples: Optional[int] = None,
                     pad_last: bool = False, num_workers: int = 0, prefetch_factor: Optional[int] = 10,
                     persistent_workers: bool = True) -> DataLoader:
    """Data function of dino: the DataLoader of multi-crop batches; see the module doc. ``dataset`` is the
    vendor's ``{name: Imagenet, root, split}``; ``ssl_transform`` its ``{name: Dinov2Transform,
    multi_crop_transform, masked_patch_transform}``."""
    where = "train_input" if split == "train" else "eval_input"
    ds = _keys(dataset, {"name": ..., "root": ..., "split": "train", "transform": None}, f"{where}.dataset")
    if ds["name"] != "Imagenet":
        raise ParamsError(f"params: {where}.dataset.name: {ds['name']!r}; cs-run reads Imagenet (an image folder)")
    tf = _keys(ssl_transform, {"name": ..., "multi_crop_transform": ..., "masked_patch_transform": ...},
               f"{where}.ssl_transform")
    if tf["name"] != "Dinov2Transform":
        raise ParamsError(f"params: {where}.ssl_transform.name: {tf['name']!r}; cs-run applies Dinov2Transform")
    crop = _keys(tf["multi_crop_transform"], _MULTI_CROP, f"{where}.ssl_transform.multi_crop_transform")
    mask = _keys(tf["masked_patch_transform"], _MASKED_PATCH, f"{where}.ssl_transform.masked_patch_transform")
    if mask["transform_list"] is not None:
        raise ParamsError(f"params: {where}.ssl_transform.masked_patch_transform.transform_list: Dinov2Transform "
                          "composes it with the multi-crop transform; leave it unset")
    if pad_last:
        raise ParamsError(f"params: {where}.pad_last: padding the last batch is not built in cs-run; drop it "
                          "(drop_last: true)")
    root = Path(ds["root"]) / ds["split"]
    if not root.is_dir():
        raise ParamsError(f"params: {where}.dataset.root: {root} is not a folder; the ImageNet layout is "
                          f"{ds['root']}/{ds['split']}/<class>/<image>")
    _pil_image()  # the missing-package error now, not in a worker
    seed = 0 if shuffle_seed is None else shuffle_seed
    transform = MultiCrop(crop, f"{where}.ssl_transform.multi_crop_transform", seed)
    collate = MaskCollate(mask, crop["global_num_crops"], seed)
    data = ImageFolderDataset(root, transform)
    if not data.samples:
        raise ParamsError(f"params: {where}.dataset.root: no images under {root}/<class>/ (extensions "
                          f"{', '.join(IMAGE_EXTENSIONS)})")
    if num_samples is not None:
        data.samples = data.samples[:num_samples]
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    base = RandomSampler(data, generator=generator) if shuffle else SequentialSampler(data)
    replicas = num_streamers()
    sampler = ShardSampler(base, replicas, get_streaming_rank(), even=True) if replicas > 1 else base
    init = functools.partial(_seed_worker, data, collate, seed) if num_workers else None
    return DataLoader(data, batch_size=get_streaming_batch_size(batch_size), sampler=sampler, num_workers=num_workers,
                      drop_last=drop_last, collate_fn=collate, worker_init_fn=init,
                      prefetch_factor=prefetch_factor if num_workers else None,
                      persistent_workers=persistent_workers and num_workers > 0)
