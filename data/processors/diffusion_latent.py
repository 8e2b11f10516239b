"""DiffusionLatentImageNet1KProcessor: precomputed VAE latents of ImageNet for dit, as the Model Zoo 2.10's
processor reads and batches them (data/vision/diffusion/DiffusionLatentImageNet1KProcessor.py,
DiffusionBaseProcessor.py, dit_transforms.py).

On disk: each ``data_dir`` (one folder or a list, e.g. the latents and those of flipped images) holds
``<split>/<class>/<file>.npz`` (``split`` ``train`` for train_input, ``val`` for eval_input), each file with
``vae_output``, the VAE encoder's ``[2 * latent_channels, h, w]`` mean and log-variance, and ``label``. The
label is the class folder's index in sorted order (torchvision's DatasetFolder rule, as the vendor's), not
the file's ``label``. Every sample comes from one of the folders picked at random (equal odds, a generator
seeded by ``shuffle_seed``): the vendor's CategoricalDataset, as long as the longest folder.

Each batch (the vendor's collate, drawing from torch's global generator in this order): labels dropped to
the null class ``num_classes`` with probability ``label_dropout_rate`` (classifier-free guidance), a timestep
per sample uniform in ``[0, num_diffusion_steps)``, the diffusion noise, the VAE's sampling noise; the latent
is ``(mean + exp(logvar / 2) * vae_noise) * scaling_factor`` (log-variance clamped to [-30, 20]). The model
adds the noise. Batches are dicts of ``input``, ``label``, ``diffusion_noise``, ``timestep``; latents and
noise take the run's floating-point type, labels and timesteps int32.

The order: the vendor's ShardedSampler, ``random.seed(shuffle_seed)`` then ``random.shuffle`` of the indices
(cut to a multiple of the replicas), the same order every epoch; without ``shuffle_seed`` the seed is drawn
from torch's generator (the vendor's is the wall clock). Only the train split shuffles.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.dataloader import default_collate

from cs_run import amp
from cs_run.distributed import get_streaming_batch_size, get_streaming_rank, num_streamers
from cs_run.errors import ParamsError
from cs_run.registry import register_data_processor

__all__ = ["LatentFolder", "CategoricalDataset", "SeededShuffleSampler", "DiffusionCollate", "build_dataloader"]

FILE_EXTENSIONS = (".npz", ".npy")
SPLIT_FOLDERS = {"train": "train", "eval": "val"}
NAME = "DiffusionLatentImageNet1KProcessor"


class LatentFolder(Dataset):
    """(``vae_output`` tensor, int32 class index) of each latent file under ``root/<class>/``."""

    def __init__(self, root: Path, shape: list, dtype: torch.dtype) -> None:
        self.classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.samples = [(f, label) for label, name in enumerate(self.classes) for f in sorted((root / name).rglob("*"))
                        if f.is_file() and f.suffix.lower() in FILE_EXTENSIONS]
        self.shape, self.dtype = shape, dtype

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        try:
            with np.load(path) as data:
                latent = torch.from_numpy(np.asarray(data["vae_output"]))
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
            raise ParamsError(f"{NAME}: {path} is not an .npz file with a vae_output array ({type(e).__name__}: "
                              f"{e}); write each latent with numpy.savez(path, vae_output=..., label=...)") from None
        if list(latent.shape) != self.shape:
            raise ParamsError(f"{NAME}: {path}: vae_output has shape {list(latent.shape)}, expected {self.shape} "
                              "(2 * latent_channels for the mean and log-variance, then latent_size); make model.vae "
                              "(or model.latent_size / latent_channels) match the latents")
        return latent.to(self.dtype), np.int32(label)


class CategoricalDataset(Dataset):
    """Sample ``idx`` of a folder picked at random (the vendor's CategoricalDataset: equal odds, one draw per
    read from a generator seeded by ``seed``, made lazily so each worker process starts from the seed)."""

    def __init__(self, datasets: list, seed: int) -> None:
        self.datasets, self.seed = datasets, seed
        self.probs = torch.tensor([1 / len(datasets)] * len(datasets))
        self.generator: Optional[torch.Generator] = None

    def __len__(self) -> int:
        return max(len(d) for d in self.datasets)

    def __getitem__(self, idx: int):
        if self.generator is None:
            self.generator = torch.Generator().manual_seed(self.seed)
        ds = self.datasets[int(torch.multinomial(self.probs, 1, generator=self.generator))]
        return ds[idx % len(ds)]


class SeededShuffleSampler(Sampler[int]):
    """The vendor's ShardedSampler: indices cut to a multiple of the replicas (``drop_last``) or padded with
    seeded random ones, shuffled by Python's ``random`` seeded with ``seed`` (the same order each epoch), every
    ``num_shards``-th from ``shard``."""

    def __init__(self, n: int, shuffle: bool, seed: int, drop_last: bool, num_shards: int, shard: int) -> None:
        self.shuffle, self.seed, self.num_shards, self.shard = shuffle, seed, num_shards, shard
        self.num_samples = n // num_shards if drop_last and n % num_shards else -(-n // num_shards)
        total = self.num_samples * num_shards
        self.indices = list(range(n))
        if not drop_last:
            random.seed(seed)
            self.indices += random.sample(self.indices, total - n)
        self.indices = self.indices[:total]

    def __iter__(self):
        if self.shuffle:
            random.seed(self.seed)
            random.shuffle(self.indices)
        return iter(self.indices[self.shard::self.num_shards])

    def __len__(self) -> int:
        return self.num_samples


class DiffusionCollate:
    """The vendor's custom_collate_fn: label dropout, timesteps and noise, the sampled and scaled latent."""

    def __init__(self, label_dropout_rate: float, num_classes: int, num_diffusion_steps: int, latent_channels: int,
                 scaling_factor: float) -> None:
        self.label_dropout_rate, self.num_classes = label_dropout_rate, num_classes
        self.num_diffusion_steps, self.latent_channels = num_diffusion_steps, latent_channels
        self.scaling_factor = scaling_factor

    def __call__(self, samples: list) -> dict:
        moments, label = default_collate(samples)
        if self.label_dropout_rate > 0:  # the vendor's LabelDropout (it refuses a rate of 0)
            drop = torch.rand(label.shape[0]) < self.label_dropout_rate
            label = torch.where(drop, torch.tensor(self.num_classes, dtype=label.dtype), label)
        b, (h, w) = moments.shape[0], moments.shape[2:]
        timestep = torch.randint(self.num_diffusion_steps, size=(b,), dtype=label.dtype)
        shape = (b, self.latent_channels, h, w)
        diffusion_noise = torch.randn(shape, dtype=moments.dtype)
        vae_noise = torch.randn(shape, dtype=moments.dtype)
        mean, logvar = moments.float().chunk(2, dim=1)  # float32: the vendor's clamp takes no half types
        latent = mean + torch.exp(0.5 * logvar.clamp(-30.0, 20.0)) * vae_noise
        return {"input": latent.mul_(self.scaling_factor).to(diffusion_noise.dtype), "label": label,
                "diffusion_noise": diffusion_noise, "timestep": timestep}


def _where(split: str) -> str:
    return "train_input" if split == "train" else "eval_input"


_VAE_DEFAULTS = {"latent_size": [32, 32], "latent_channels": 4, "scaling_factor": 0.18215}
"""VAEConfig's defaults of the keys the data reads (dit's config fills the same ones)."""


def _model_value(value: Any, vae: Optional[dict], key: str, where: str) -> Any:
    if value is not None:
        return value
    if vae is None:
        raise ParamsError(f"params: {where}.{key}: not set and the model gives none; set model.{key} or "
                          f"model.vae.{key}")
    return vae.get(key) if vae.get(key) is not None else _VAE_DEFAULTS[key]


@register_data_processor(NAME)
def build_dataloader(split: str, data_dir: Union[str, list, None] = None, batch_size: Optional[int] = None,
                     data_processor: str = NAME, num_classes: int = 1000, image_channels: Optional[int] = None,
                     use_worker_cache: bool = False, noaugment: bool = False, transforms: Optional[list] = None,
                     vae_scaling_factor: Optional[float] = None, label_dropout_rate: Optional[float] = None,
                     latent_size: Optional[list] = None, latent_channels: Optional[int] = None,
                     num_diffusion_steps: int = 1000, schedule_name: Optional[str] = None, drop_last: bool = True,
                     var_loss: Optional[bool] = None, shuffle: Optional[bool] = None, shuffle_seed: Optional[int] = None,
                     prefetch_factor: Optional[int] = 10, persistent_workers: Optional[bool] = True,
                     num_workers: Optional[int] = 0, image_size: Optional[list] = None,
                     vae: Optional[dict] = None) -> DataLoader:
    """Data function of dit: the split's DataLoader of noised-training batches; see the module doc.

    ``vae``, ``latent_size``, ``latent_channels``, ``label_dropout_rate``, ``num_classes`` and
    ``num_diffusion_steps`` come from the model section (its input_keys). ``transforms`` must be empty (the
    vendor's files give none; image transforms do not apply to latents); ``noaugment``, ``use_worker_cache``,
    ``image_channels``, ``image_size``, ``schedule_name`` and ``var_loss`` change nothing here.

    Note: the vendor's latent processor drops labels to 1000 whatever ``num_classes`` is (past the label table
    unless it is 1000, the files' value); here to ``num_classes``, the model's null-class row.
    """
    where = _where(split)
    if data_processor != NAME:
        raise ParamsError(f"params: {where}.data_processor: {data_processor!r}; dit reads {NAME}")
    if transforms:
        raise ParamsError(f"params: {where}.transforms: {transforms!r}; transforms of latents are not applied here, "
                          "leave it empty")
    if batch_size is None:
        raise ParamsError(f"params: {where}.batch_size: not set")
    if data_dir is None:
        raise ParamsError(f"params: {where}.data_dir: not set; give the latent folder(s) (with train/ and val/)")
    size = _model_value(latent_size, vae, "latent_size", where)
    channels = _model_value(latent_channels, vae, "latent_channels", where)
    scale = float(vae_scaling_factor if vae_scaling_factor is not None else
                  _model_value(None, vae or {}, "scaling_factor", where))
    dropout = 0.1 if label_dropout_rate is None else float(label_dropout_rate)  # DiTConfig's default
    dtype = amp.get_floating_point_dtype()  # the vendor's to_dtype transform
    folders = []
    for i, folder in enumerate(data_dir if isinstance(data_dir, list) else [data_dir]):
        key = f"{where}.data_dir" + (f"[{i}]" if isinstance(data_dir, list) else "")
        root = Path(folder) / SPLIT_FOLDERS[split]
        if not root.is_dir():
            raise ParamsError(f"params: {key}: {root} is not a folder; the layout is "
                              f"{folder}/{SPLIT_FOLDERS[split]}/<class>/<latent>.npz")
        dataset = LatentFolder(root, [2 * channels, *size], dtype)
        if not dataset.samples:
            raise ParamsError(f"params: {key}: no latent files under {root}/<class>/ (extensions "
                              f"{', '.join(FILE_EXTENSIONS)})")
        folders.append(dataset)
    # without a seed, the vendor seeds from the wall clock; here from torch's generator (the run's seed)
    seed = shuffle_seed if shuffle_seed is not None else int(torch.randint(0, 2147483647, (1,)).item())
    dataset = CategoricalDataset(folders, seed)
    sampler = SeededShuffleSampler(len(dataset), bool(shuffle) and split == "train", seed, drop_last, num_streamers(),
                                   get_streaming_rank())
    collate = DiffusionCollate(dropout, num_classes, num_diffusion_steps, channels, scale)
    generator = torch.Generator()  # the iterator's worker seeds come from it, not from the global generator
    if shuffle_seed is not None:
        generator.manual_seed(shuffle_seed)
    workers = num_workers or 0
    return DataLoader(dataset, batch_size=get_streaming_batch_size(batch_size), sampler=sampler, num_workers=workers,
                      drop_last=drop_last, collate_fn=collate, generator=generator,
                      prefetch_factor=prefetch_factor if workers else None,
                      persistent_workers=bool(persistent_workers) and workers > 0)
