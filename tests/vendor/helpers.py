"""Small MNIST-format data on disk (the IDX files, in torchvision's layout) for the vendor-form tests."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np


def write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", n) for n in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(root: Path, n_train: int = 64, n_test: int = 32, seed: int = 0) -> Path:
    """Random 28x28 uint8 digits with labels 0..9 in ``root/MNIST/raw`` (where torchvision and the vendor
    keep MNIST); returns ``root``."""
    rng = np.random.default_rng(seed)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, (n,)))
    return root
