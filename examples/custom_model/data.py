"""Your data: 16x16 grey images of three shapes in noise (0: a horizontal bar, 1: a vertical bar,
2: a diagonal), made from a fixed seed per split, so nothing is downloaded.

The data function contract (``train_input.data_fn: "data:build_dataloader"`` in params.yaml): cs-run
calls it by keyword with ``split`` ("train" or "eval") and the keys of that split's section
(``train_input`` / ``eval_input``) that its signature names: the section's own keys (``batch_size``,
``shuffle``, ``drop_last_batch``, ``data_dir``, ``num_workers``, ...) and any other key written there
(``num_samples`` and ``noise`` below). It returns a ``torch.utils.data.DataLoader``; each batch it
yields is handed to the model's ``forward``. The signature is checked before anything runs.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

SEEDS = {"train": 0, "eval": 1}


def make_shapes(num_samples: int, image_size: int, noise: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_samples`` images (N, 1, image_size, image_size) and their labels (N,), from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (num_samples,), generator=g)
    images = noise * torch.randn(num_samples, 1, image_size, image_size, generator=g)
    offsets = torch.randint(2, image_size - 2, (num_samples,), generator=g)
    for i in range(num_samples):
        k, o = int(labels[i]), int(offsets[i])
        if k == 0:
            images[i, 0, o, 2:-2] += 1.0
        elif k == 1:
            images[i, 0, 2:-2, o] += 1.0
        else:
            images[i, 0].diagonal().add_(1.0)
    return images, labels


def build_dataloader(split: str, batch_size: int, shuffle: bool = True, drop_last_batch: bool = True,
                     num_samples: int = 1024, image_size: int = 16, noise: float = 0.5) -> DataLoader:
    """The data function: a DataLoader of (images, labels) batches of one split."""
    if split not in SEEDS:
        raise ValueError(f"split must be train or eval, got {split!r}")
    images, labels = make_shapes(num_samples, image_size, noise, SEEDS[split])
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size,
                      shuffle=shuffle and split == "train", drop_last=drop_last_batch)
