"""ImageNet1KProcessor: labelled images in the ImageNet folder layout, ``data_dir/<split>/<class>/<image>``
(``split`` is ``train`` for train_input, ``val`` for eval_input), as the Model Zoo 2.10's processor reads
them through torchvision's ImageNet dataset.

Classes are the split's sub-folder names in sorted order, each image's label that index (torchvision's
ImageFolder rule; the vendor's ``meta.bin`` only names the classes in words and is not needed). Images are
read and transformed with torchvision when it is installed, else with Pillow by the same rules
(``pip install 'cs-run[vision]'`` brings both): ``transforms`` is the vendor's list of ``{name, ...}``
specs; after them the images take the run's floating-point type (the vendor's ``to_dtype``). Labels are
int32, as the vendor's ``np.int32`` target transform.

``batch_size`` is the global batch: each replica reads ``get_streaming_batch_size(batch_size)`` samples of
its own shard (every ``num_streamers()``-th sample of one shared order). ``mixup_alpha`` and
``cutmix_alpha`` are accepted and change nothing: the vendor's 2.10 loader builds its mixup collate but
never passes it to the DataLoader. ``use_worker_cache`` (a CSX worker-node copy) changes nothing here.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, SequentialSampler

from cs_run import amp
from cs_run.data.processors.mnist import ShardSampler
from cs_run.distributed import get_streaming_batch_size, get_streaming_rank, num_streamers
from cs_run.errors import ParamsError
from cs_run.registry import register_data_processor

__all__ = ["IMAGE_EXTENSIONS", "ImageFolderDataset", "build_transform", "build_dataloader", "expand_to_square"]

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
"""torchvision's IMG_EXTENSIONS (case-insensitive)."""
SPLIT_FOLDERS = {"train": "train", "eval": "val"}
_BILINEAR = "bilinear"


def _have_torchvision() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def _pil_image():
    """PIL.Image, or the error that says how to get it (an optional package)."""
    try:
        from PIL import Image  # noqa: PLC0415 - optional package
    except ImportError:
        raise ParamsError("ImageNet1KProcessor reads images with torchvision or Pillow, and neither is installed; "
                          "pip install 'cs-run[vision]'") from None
    return Image


class ImageFolderDataset(Dataset):
    """(image tensor, int32 label) of each image file under ``root/<class>/``."""

    def __init__(self, root: Path, transform: Callable) -> None:
        self.classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.samples = [(f, label) for label, name in enumerate(self.classes)
                        for f in sorted((root / name).rglob("*"))
                        if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        image = _pil_image()
        try:
            with image.open(path) as img:
                img = img.convert("RGB")
        except (OSError, ValueError) as e:  # a truncated or foreign file: name it
            raise ParamsError(f"ImageNet1KProcessor: {path} is not a readable image ({e}); remove or replace "
                              "it") from None
        return self.transform(img), torch.tensor(label, dtype=torch.int32)


# ------------------------------------------------------------------ transforms without torchvision (Pillow)

def _size(size: Union[int, list], img) -> tuple[int, int]:
    """(height, width) of a Resize ``size``: a pair, or the shorter side (aspect kept), torchvision's rule."""
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return int(size[0]), int(size[1])
    s = int(size[0] if isinstance(size, (list, tuple)) else size)
    w, h = img.size
    return (s, int(s * w / h)) if h <= w else (int(s * h / w), s)


def _resample(name: str):
    image = _pil_image()
    table = {"nearest": image.NEAREST, "bilinear": image.BILINEAR, "bicubic": image.BICUBIC,
             "lanczos": image.LANCZOS, "box": image.BOX, "hamming": image.HAMMING}
    return table[name]


def _crop_box(top: int, left: int, h: int, w: int) -> tuple[int, int, int, int]:
    return left, top, left + w, top + h


def _random_resized_crop_params(width: int, height: int, scale: list, ratio: list) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params: ten tries at an area and aspect, else the central crop."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect = math.exp(torch.empty(1).uniform_(*log_ratio).item())
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(torch.randint(0, height - h + 1, (1,)).item()), int(torch.randint(0, width - w + 1,
                                                                                          (1,)).item()), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _pil_transform(spec: dict) -> Callable:
    """One vendor transform spec as a function of a PIL image (or, after to_tensor, of a tensor)."""
    name, interp = spec["name"], spec.get("interpolation", _BILINEAR)
    if name == "resize":
        return lambda img: img.resize(_size(spec["size"], img)[::-1], _resample(interp))
    if name == "center_crop":
        def center_crop(img):
            h, w = _size(spec["size"], img) if isinstance(spec["size"], (list, tuple)) else (spec["size"],) * 2
            return img.crop(_crop_box(int(round((img.height - h) / 2)), int(round((img.width - w) / 2)), h, w))
        return center_crop
    if name == "random_resized_crop":
        def random_resized_crop(img):
            top, left, h, w = _random_resized_crop_params(img.width, img.height, spec.get("scale", [0.08, 1.0]),
                                                          spec.get("ratio", [3 / 4, 4 / 3]))
            size = spec["size"] if isinstance(spec["size"], (list, tuple)) else [spec["size"]] * 2
            return img.resize((int(size[1]), int(size[0])), _resample(interp), box=_crop_box(top, left, h, w))
        return random_resized_crop
    if name in ("random_horizontal_flip", "random_vertical_flip"):
        p, image = spec.get("p", 0.5), _pil_image()
        flip = image.FLIP_LEFT_RIGHT if name == "random_horizontal_flip" else image.FLIP_TOP_BOTTOM
        return lambda img: img.transpose(flip) if torch.rand(1).item() < p else img
    if name == "expand_to_square":
        return lambda img: expand_to_square(img, spec.get("background_color"))
    if name == "to_tensor":
        def to_tensor(img):
            data = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
            return data.view(img.height, img.width, len(img.getbands())).permute(2, 0, 1).float().div(255)
        return to_tensor
    if name == "normalize":
        mean, std = torch.tensor(spec["mean"]).view(-1, 1, 1), torch.tensor(spec["std"]).view(-1, 1, 1)
        return lambda t: (t - mean) / std
    raise AssertionError(name)  # _check_specs keeps other names out


_PIL_TRANSFORMS = ("resize", "center_crop", "random_resized_crop", "random_horizontal_flip", "random_vertical_flip",
                   "to_tensor", "normalize", "expand_to_square")


def expand_to_square(img, background_color):
    """The vendor's expand_to_square (llava): a non-square image pasted centred on a square of
    ``background_color`` (an RGB triple of 0-255 ints), its side the longer one (the offset rounded down)."""
    width, height = img.size
    if width == height:
        return img
    side = max(width, height)
    color = tuple(int(c) for c in background_color) if background_color is not None else 0
    square = _pil_image().new(img.mode, (side, side), color)
    square.paste(img, ((side - width) // 2, (side - height) // 2))
    return square
_TV_NAMES = {"resize": "Resize", "center_crop": "CenterCrop", "random_resized_crop": "RandomResizedCrop",
             "random_horizontal_flip": "RandomHorizontalFlip", "random_vertical_flip": "RandomVerticalFlip",
             "to_tensor": "ToTensor", "normalize": "Normalize"}


def _check_specs(transforms: list, where: str) -> None:
    for i, spec in enumerate(transforms):
        if not isinstance(spec, dict) or spec.get("name") not in _PIL_TRANSFORMS:
            got = spec.get("name") if isinstance(spec, dict) else spec
            raise ParamsError(f"params: {where}.transforms[{i}]: {got!r} is not a transform cs-run applies; "
                              f"expected one of {', '.join(_PIL_TRANSFORMS)}")
    if not any(spec["name"] == "to_tensor" for spec in transforms):
        raise ParamsError(f"params: {where}.transforms: no to_tensor; the images must become tensors "
                          "(add {name: to_tensor})")


def _torchvision_transform(spec: dict) -> Callable:
    if spec["name"] not in _TV_NAMES:  # the vendor's own (expand_to_square): Pillow either way
        return _pil_transform(spec)
    import torchvision.transforms as T  # noqa: PLC0415 - optional package
    args = {k: v for k, v in spec.items() if k != "name"}
    if "interpolation" in args:
        args["interpolation"] = T.InterpolationMode(args["interpolation"])
    return getattr(T, _TV_NAMES[spec["name"]])(**args)


def build_transform(transforms: list, where: str = "train_input") -> Callable:
    """The image transform of the vendor's spec list, then the cast to the run's floating-point type."""
    _check_specs(transforms, where)
    make = _torchvision_transform if _have_torchvision() else _pil_transform
    steps = [make(spec) for spec in transforms]
    dtype = amp.get_floating_point_dtype()

    def transform(img):
        for step in steps:
            img = step(img)
        return img.to(dtype)
    return transform


@register_data_processor("ImageNet1KProcessor")
def build_dataloader(split: str, data_dir: Optional[str] = None, batch_size: int = 128,
                     data_processor: str = "ImageNet1KProcessor", image_size: Optional[list] = None,
                     num_classes: Optional[int] = None, transforms: Optional[list] = None, noaugment: bool = False,
                     shuffle: bool = True, shuffle_seed: Optional[int] = None, drop_last: bool = True,
                     num_workers: int = 0, prefetch_factor: Optional[int] = 10, persistent_workers: bool = True,
                     sampler: str = "random", ra_sampler_num_repeat: int = 3, mixup_alpha: float = 0.1,
                     cutmix_alpha: float = 0.1, use_worker_cache: bool = False, use_fake_data: Any = None,
                     patch_size: Optional[list] = None, image_channels: Optional[int] = None,
                     max_sequence_length: Optional[int] = None) -> DataLoader:
    """Data function of vision_transformer: the split's DataLoader of (images, labels); see the module doc.

    ``noaugment``: only resize to ``image_size`` and to_tensor (the vendor's rule). Shuffling is for the
    train split only (the vendor's). ``num_classes`` (a deprecated key of the vendor's) is checked against
    the folder's class count when given. ``sampler: repeated-aug`` is the vendor's GPU-distributed one and
    is refused. ``patch_size``, ``image_channels`` and ``max_sequence_length``: Release 2.3's files copy the
    model's into the input, where the vendor's processor reads none of them; no effect here either.
    """
    where = "train_input" if split == "train" else "eval_input"
    if data_processor != "ImageNet1KProcessor":
        raise ParamsError(f"params: {where}.data_processor: {data_processor!r}; vision_transformer reads "
                          "ImageNet1KProcessor")
    if sampler != "random":
        raise ParamsError(f"params: {where}.sampler: {sampler!r} is not supported here; use random")
    if data_dir is None:
        raise ParamsError(f"params: {where}.data_dir: not set; give the ImageNet folder (with train/ and val/)")
    image_size = image_size or [224, 224]
    if noaugment:
        transforms = [{"name": "resize", "size": image_size}, {"name": "to_tensor"}]
    if not transforms:
        raise ParamsError(f"params: {where}.transforms: not set; give the vendor's list, e.g. [{{name: resize, "
                          f"size: {image_size}}}, {{name: to_tensor}}]")
    root = Path(data_dir) / SPLIT_FOLDERS[split]
    if not root.is_dir():
        raise ParamsError(f"params: {where}.data_dir: {root} is not a folder; the ImageNet layout is "
                          f"{data_dir}/{SPLIT_FOLDERS[split]}/<class>/<image>")
    transform = build_transform(transforms, where)
    if not _have_torchvision():
        _pil_image()  # the missing-package error now, not in a worker
    dataset = ImageFolderDataset(root, transform)
    if not dataset.samples:
        raise ParamsError(f"params: {where}.data_dir: no images under {root}/<class>/ (extensions "
                          f"{', '.join(IMAGE_EXTENSIONS)})")
    if num_classes is not None and num_classes != len(dataset.classes):
        raise ParamsError(f"params: {where}.num_classes: {num_classes}, but {root} holds {len(dataset.classes)} "
                          "class folders; make them agree")
    shuffle = shuffle and split == "train"
    generator = None
    if shuffle_seed is not None:
        generator = torch.Generator().manual_seed(shuffle_seed)
    base = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
    replicas = num_streamers()
    data_sampler = ShardSampler(base, replicas, get_streaming_rank(), even=split == "train") if replicas > 1 else base
    return DataLoader(dataset, batch_size=get_streaming_batch_size(batch_size), sampler=data_sampler,
                      num_workers=num_workers, drop_last=drop_last,
                      prefetch_factor=prefetch_factor if num_workers else None,
                      persistent_workers=persistent_workers and num_workers > 0)
