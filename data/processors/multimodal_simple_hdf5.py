"""MultimodalSimpleHDF5MapDataProcessor: the Model Zoo's multimodal_simple samples (Release 2.10
``data/multimodal/llava/MultimodalSimpleHDF5MapDataProcessor.py`` over ``MultimodalSimpleHDF5Dataset``), as its
multimodal preprocessing (``finetuning_token_generator.py`` with ``is_multimodal``) writes them.

Every ``*.h5`` file of ``data_dir`` holds ``data`` ``[n, 5, max_sequence_length]`` (integer rows:
``text_input_ids`` with placeholder tokens where image features go, ``loss_mask``, ``labels``,
``key_padding_mask`` (1: no query attends to that key), ``token_modality_idx`` (1 at the image positions)),
``img_path`` ``[n, max_num_img]`` (bytes: each image's path relative to ``img_data_dir``, ``None`` for an
unused slot, which gets a black image) and ``img_data_loc`` ``[n, max_num_img, num_patches]`` (the text
position of each image feature; ``max_sequence_length`` for an unused slot). Images go through
``transforms`` as llava's (:mod:`cs_run.data.processors.llava_hdf5`, whose loader this shares) and every
transformed image must be ``image_data_size`` (the vendor's multimodal_simple keeps the file's value: its
model section has no ``image_model`` to take it from). Only the sample layout is read and ``use_vsl`` is
refused (the vendor's too).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import h5py  # noqa: TID253 - this data module reads HDF5 files
import numpy as np
import torch
from torch.utils.data import DataLoader

from cs_run.data.processors.llava_hdf5 import LlavaSamples, samples_loader
from cs_run.data.readers.hdf5_map import H5Reader
from cs_run.errors import DataError, ParamsError
from cs_run.registry import register_data_processor

__all__ = ["MultimodalSimpleSamples", "build_dataloader", "FEATURES"]

FEATURES = ("text_input_ids", "loss_mask", "labels", "key_padding_mask", "token_modality_idx")
"""The rows of ``data``, in order (the vendor's features_list)."""


class MultimodalSimpleSamples(LlavaSamples):
    """Sample ``i`` of the shards as a dict of the five int32 rows, ``image_data`` [max_num_img, c, h, w] and
    ``image_data_loc`` [max_num_img, num_patches]."""

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sample = self.samples[index] % len(self.reader)
        row = self.reader[sample]
        self._check_ids(row[0], sample)
        out = {name: torch.from_numpy(row[i].copy()) for i, name in enumerate(FEATURES)}
        paths, shard = self._entry(sample, "img_path")
        out["image_data"] = torch.stack([self._load(bytes(p), sample, shard) for p in paths.reshape(-1)])
        loc, _ = self._entry(sample, "img_data_loc")
        if loc.min() < 0 or loc.max() > self.reader.sequence_length:
            raise DataError(f"data_dir: img_data_loc of sample {sample} ({shard}) holds position "
                            f"{int(loc.min() if loc.min() < 0 else loc.max())}; positions are in [0, "
                            f"{self.reader.sequence_length}] (the sequence length: an unused image slot)")
        out["image_data_loc"] = torch.from_numpy(loc.astype(np.int32))
        return out


def _check_shards(reader: H5Reader, max_num_img: int, num_patches: Optional[int]) -> None:
    """The sample layout of five rows, and per sample ``max_num_img`` img_path entries and as many rows of
    img_data_loc in every shard."""
    if not reader.by_sample:
        raise ValueError(f"data_dir: {reader.files[0]} holds the corpus layout (concatenated tokens); "
                         "multimodal_simple reads samples [n, 5, max_sequence_length] as its multimodal "
                         "preprocessing writes them")
    if reader.features != len(FEATURES):
        raise ValueError(f"data_dir: {reader.files[0]} holds {reader.features} rows per sample; multimodal_simple "
                         f"reads 5 ({', '.join(FEATURES)})")
    for i, path in enumerate(reader.files):
        n = int(reader.offsets[i + 1] - reader.offsets[i])
        with h5py.File(path, "r") as f:
            shapes = {k: (f[k].dtype, f[k].shape) for k in ("img_path", "img_data_loc") if k in f}
        paths, loc = shapes.get("img_path"), shapes.get("img_data_loc")
        if paths is None or paths[0].kind != "S" or paths[1] != (n, max_num_img):
            got = f"{paths[0]}{list(paths[1])}" if paths else "none"
            raise ValueError(f"data_dir: {path} needs 'img_path' of [{n}, max_num_img={max_num_img}] byte strings, "
                             f"got {got}; set max_num_img to the preprocessing's")
        if loc is None or loc[0].kind not in "iu" or len(loc[1]) != 3 or loc[1][:2] != (n, max_num_img) or \
                (num_patches is not None and loc[1][2] != num_patches):
            got = f"{loc[0]}{list(loc[1])}" if loc else "none"
            raise ValueError(f"data_dir: {path} needs integer 'img_data_loc' of [{n}, max_num_img={max_num_img}, "
                             f"num_patches{'=' + str(num_patches) if num_patches else ''}], got {got}; write it "
                             "with the multimodal preprocessing")


@register_data_processor("MultimodalSimpleHDF5MapDataProcessor")
def build_dataloader(split: str, data_dir: Union[str, list, None] = None, img_data_dir: Optional[str] = None,
                     image_data_size: Optional[list] = None, transforms: Optional[list] = None,
                     max_num_img: int = 1, num_patches: Optional[int] = None, batch_size: int = 128,
                     data_processor: str = "MultimodalSimpleHDF5MapDataProcessor", shuffle: bool = True,
                     shuffle_seed: Optional[int] = None, drop_last: bool = True, num_workers: int = 0,
                     prefetch_factor: Optional[int] = 10, persistent_workers: bool = True,
                     max_sequence_length: Optional[int] = None, data_subset: Optional[str] = None,
                     sort_files: bool = True, use_vsl: bool = False, pad_last: bool = False,
                     use_worker_cache: bool = False, dataset_map_fn: Any = None, vocab_size: Any = None,
                     noaugment: Any = None, micro_batch_size: Any = None, bos_token_id: Any = None,
                     pad_token_id: Any = None, mixed_precision: Any = None,
                     text_model: Optional[dict] = None) -> DataLoader:
    """Data function of multimodal_simple: the split's DataLoader of dicts (:data:`FEATURES`, ``image_data``,
    ``image_data_loc``); see the module doc. ``text_model`` is the model's section (the registry copies it
    here): the vocabulary the samples are checked against. ``vocab_size``, ``noaugment``, ``micro_batch_size``,
    ``bos_token_id``, ``pad_token_id``, ``mixed_precision`` (deprecated in the vendor's 2.4+ config, read by no
    code of 2.3, whose files set them) and ``use_worker_cache`` change nothing here."""
    where = "train_input" if split == "train" else "eval_input"
    for key, value, why in (("use_vsl", use_vsl, "the vendor's multimodal_simple data refuses it too"),
                            ("pad_last", pad_last, "keep drop_last true: every step sees a full batch"),
                            ("dataset_map_fn", dataset_map_fn, "the five rows are read by position")):
        if value:
            raise ParamsError(f"params: {where}.{key}: {value!r} is not supported here ({why})")
    for key, value in (("data_dir", data_dir), ("img_data_dir", img_data_dir), ("transforms", transforms),
                       ("image_data_size", image_data_size)):
        if value is None:
            raise ParamsError(f"params: {where}.{key}: not set; MultimodalSimpleHDF5MapDataProcessor needs data_dir "
                              "(the *.h5 samples), img_data_dir (their images), transforms and image_data_size")
    if not (isinstance(image_data_size, list) and len(image_data_size) == 3):
        raise ParamsError(f"params: {where}.image_data_size: expected [channels, height, width], got "
                          f"{image_data_size!r}")
    for key, value in (("max_num_img", max_num_img), ("num_patches", num_patches)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ParamsError(f"params: {where}.{key}: expected a positive integer, got {value!r}")
    return samples_loader(split, where, MultimodalSimpleSamples,
                          lambda reader: _check_shards(reader, max_num_img, num_patches), data_dir=data_dir,
                          img_data_dir=img_data_dir, image_data_size=image_data_size, transforms=transforms,
                          batch_size=batch_size, shuffle=shuffle, shuffle_seed=shuffle_seed, drop_last=drop_last,
                          num_workers=num_workers, prefetch_factor=prefetch_factor,
                          persistent_workers=persistent_workers, max_sequence_length=max_sequence_length,
                          data_subset=data_subset, sort_files=sort_files, text_model=text_model)
