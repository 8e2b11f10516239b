"""MNISTDataProcessor (fc_mnist's data): MNIST IDX files from ``data_dir``, or (when asked for)
scikit-learn's bundled digits.

Nothing is downloaded. MNIST files (``train-images-idx3-ubyte[.gz]`` / ``t10k-...``) are looked for in
``data_dir`` and ``data_dir/MNIST/raw`` (torchvision's layout, where the vendor's fc_mnist keeps them).
With ``data_dir: bundled:digits`` (or no data_dir) the 1,797 real 8x8 digits that ship inside
scikit-learn's wheel are upsampled to MNIST's geometry (a 20x20 digit centred in a 28x28 frame) and
split into fixed train / validation sets. A data_dir without MNIST is an error.

With several replicas ``batch_size`` is the global batch (the vendor's rule): each replica's loader
yields ``cstorch.distributed.get_streaming_batch_size(batch_size)`` samples from its own shard, every
``num_streamers()``-th sample of the (shuffled) order from ``get_streaming_rank()`` on. All replicas draw
the same order, so one step's replica batches together are the very samples one process would take
for its batch of ``batch_size``: N replicas train on the data of a single process.
"""

from __future__ import annotations

import functools
import gzip
import logging
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, RandomSampler, Sampler, SequentialSampler, TensorDataset

from cs_run import amp
from cs_run.backend import use_cs
from cs_run.distributed import get_streaming_batch_size, get_streaming_rank, num_streamers
from cs_run.errors import CsRunError, ParamsError
from cs_run.registry import register_data_processor
from cs_run.vendor_params import BUNDLED_DATA

__all__ = ["build_dataloader", "read_idx", "load_mnist_idx", "load_digits_as_mnist", "ShardSampler"]

logger = logging.getLogger(__name__)

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
DIGITS_VALIDATION_SIZE = 297  # of 1,797; fixed split so every run evaluates on the same digits
_SPLIT_PREFIX = {"train": "train", "eval": "t10k"}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (gzipped or not) into an array."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic number)")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(data) - offset != expected:
        raise ValueError(f"{path}: truncated IDX file ({len(data) - offset} bytes of data, expected {expected})")
    return np.frombuffer(data, dtype=dtype, offset=offset).reshape(dims)


def _find_idx(data_dir: Path, prefix: str, kind: str) -> Optional[Path]:
    for folder in (data_dir, data_dir / "MNIST" / "raw"):
        for suffix in ("", ".gz"):
            candidate = folder / f"{prefix}-{kind}-idx{3 if kind == 'images' else 1}-ubyte{suffix}"
            if candidate.is_file():
                return candidate
    return None


def load_mnist_idx(data_dir: str | Path, split: str) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """Normalized (N, 1, 28, 28) images and int64 labels of a split, or None when files are missing."""
    prefix = _SPLIT_PREFIX[split]
    images_path = _find_idx(Path(data_dir), prefix, "images")
    labels_path = _find_idx(Path(data_dir), prefix, "labels")
    if images_path is None or labels_path is None:
        return None
    images = torch.from_numpy(read_idx(images_path).astype(np.float32) / 255.0)
    labels = torch.from_numpy(read_idx(labels_path).astype(np.int64))
    if images.ndim != 3 or len(images) != len(labels):
        raise ValueError(f"MNIST files in {data_dir} disagree: images {tuple(images.shape)}, "
                         f"labels {tuple(labels.shape)}")
    logger.info("fc_mnist data: MNIST IDX files %s (%d samples)", images_path, len(labels))
    return ((images - MNIST_MEAN) / MNIST_STD).unsqueeze(1), labels


@functools.lru_cache(maxsize=1)
def _digits_as_mnist() -> tuple[torch.Tensor, torch.Tensor]:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise CsRunError("fc_mnist needs MNIST IDX files in train_input.data_dir, or scikit-learn for its "
                         "bundled digits: pip install 'cs-run[examples]'") from None
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8) in [0, 1]
    images = F.interpolate(images, size=(20, 20), mode="bilinear", align_corners=False)
    images = F.pad(images, (4, 4, 4, 4))
    images = (images - MNIST_MEAN) / MNIST_STD
    labels = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(1234))
    return images[order], labels[order]


def load_digits_as_mnist(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's real handwritten digits, at MNIST's size and normalization, fixed split."""
    images, labels = _digits_as_mnist()
    cut = len(labels) - DIGITS_VALIDATION_SIZE
    part = slice(0, cut) if split == "train" else slice(cut, None)
    return images[part], labels[part]


class ShardSampler(Sampler[int]):
    """Every ``num_shards``-th index of ``base``'s order, from ``shard`` on. ``even``: the order is first
    cut to a multiple of ``num_shards``, so every shard has the same length (replicas that train in step
    need as many batches each); otherwise every index is in exactly one shard (evaluation)."""

    def __init__(self, base: Sampler[int], num_shards: int, shard: int, even: bool) -> None:
        self.base, self.num_shards, self.shard, self.even = base, num_shards, shard, even

    def _usable(self, n: int) -> int:
        return n - n % self.num_shards if self.even else n

    def __iter__(self):
        order = list(self.base)  # draws the shuffle from the base sampler's generator, as one process would
        return iter(order[self.shard:self._usable(len(order)):self.num_shards])

    def __len__(self) -> int:
        usable = self._usable(len(self.base))
        return max(0, (usable - self.shard + self.num_shards - 1) // self.num_shards)


@register_data_processor("MNISTDataProcessor")
def build_dataloader(split: str, batch_size: int = 128, data_dir: Optional[str] = None, shuffle: bool = True,
                     shuffle_seed: Optional[int] = None, drop_last_batch: bool = True, num_workers: int = 0,
                     prefetch_factor: Optional[int] = None, persistent_workers: bool = False,
                     to_float16: bool = False) -> DataLoader:
    """Data function of fc_mnist: a DataLoader of (image, label) batches for ``split``.

    ``batch_size`` is the global batch, split over the replicas (see the module doc). ``data_dir``: a
    folder with the MNIST IDX files, or ``bundled:digits`` (or nothing) for the bundled digits. A folder
    without MNIST is an error, never a silent switch to the digits. ``to_float16``: as the vendor's
    fc_mnist data, the images are the half type on CSX or a GPU (float32 on the CPU) and the labels int32
    on CSX.
    """
    batch_size = get_streaming_batch_size(batch_size)  # raises ValueError (a params error) if it does not split
    if data_dir in (None, BUNDLED_DATA):
        images, labels = load_digits_as_mnist(split)
        logger.info("fc_mnist data: scikit-learn's bundled handwritten digits upsampled to 28x28 (%s split: %d "
                    "samples)", split, len(labels))
    else:
        loaded = load_mnist_idx(data_dir, split) if Path(data_dir).is_dir() else None
        if loaded is None:
            key = "train_input" if split == "train" else "eval_input"
            prefix = _SPLIT_PREFIX[split]
            raise ParamsError(f"params: {key}.data_dir: no MNIST {split} data in {data_dir} (looked for "
                              f"{prefix}-images-idx3-ubyte[.gz] and {prefix}-labels-idx1-ubyte[.gz] there and in "
                              f"MNIST/raw); point data_dir at the MNIST folder, or set it to '{BUNDLED_DATA}' to "
                              "train on the bundled digits")
        images, labels = loaded
    if to_float16 and (use_cs() or torch.cuda.is_available()):
        images = images.to(amp.get_half_dtype())
    if use_cs():
        labels = labels.to(torch.int32)
    generator = torch.Generator().manual_seed(shuffle_seed) if shuffle_seed is not None else None
    extra = {"prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers} if num_workers else {}
    dataset = TensorDataset(images, labels)
    shuffled = shuffle and split == "train"
    if num_streamers() > 1:
        base = RandomSampler(dataset, generator=generator) if shuffled else SequentialSampler(dataset)
        extra["sampler"] = ShardSampler(base, num_streamers(), get_streaming_rank(), even=split == "train")
    else:
        extra["shuffle"] = shuffled
    return DataLoader(dataset, batch_size=batch_size, drop_last=drop_last_batch, num_workers=num_workers,
                      generator=generator, **extra)
