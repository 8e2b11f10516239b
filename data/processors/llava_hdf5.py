"""LlavaHDF5MapDataProcessor: the Model Zoo's LLaVA samples (Release 2.10
``data/multimodal/llava/LlavaHDF5MapDataProcessor.py`` over ``MultiModalHDF5Dataset``), as its llava
preprocessing (``LlavaPhaseOnePreprocessor`` / ``LlavaPhaseTwoPreprocessor``) writes them.

Every ``*.h5`` file of ``data_dir`` holds ``data`` ``[n, 4, max_sequence_length]`` (or Release 2.2's six rows,
:data:`FEATURES_2_2`; integer rows:
``text_input_ids`` with placeholder tokens where the image features go, ``loss_mask``, ``labels``,
``key_padding_mask`` (1: no query attends to that key: the padding, and the image positions of a sample
without an image)) and ``img_path`` ``[n, 1]`` (bytes: the image's path relative to ``img_data_dir``, or
``None`` for a text-only sample, which gets a black image). The data_preprocessing tool's multimodal
finetuning (``cs-run data preprocess --config`` of the llava configs) writes a fifth row (token_modality_idx),
``img_path`` as UTF-8 strings and ``has_img`` / ``img_data_loc`` beside it: read alike, the fifth row and the
two extra datasets unread (as the vendor's processor reads the first four rows only). Images are read with Pillow and go through
``transforms`` (the vendor's specs, ``expand_to_square`` among them; then the run's floating-point type).
``image_data_size`` is the model's ``[num_channels, *image_size]`` whatever the file says (the vendor's
post_init sets it from model.image_model), and every transformed image must have that shape.

Samples are split over the streamers and shuffled as GptHDF5MapDataProcessor's (a full permutation drawn
from the loader's generator; ``batch_size`` is the global batch). Only the sample layout is read (the
vendor refuses the corpus one), and ``use_vsl`` is refused (the vendor's too).

Release 2.2's files also give ``bos_token_id``, ``pad_token_id`` and ``fp16_type``: 2.2's processor and its
MultiModalHDF5Dataset read neither token id (the samples hold the tokens already), and ``fp16_type`` only as the
image dtype of the padding sample ``pad_last`` adds (refused here); they are checked and have no effect.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Optional, Union

import h5py  # noqa: TID253 - this data module reads HDF5 files
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from cs_run.data.processors.imagenet import build_transform
from cs_run.data.readers.hdf5_map import H5Reader, replica_share
from cs_run.distributed import get_streaming_batch_size, get_streaming_rank, num_streamers
from cs_run.errors import DataError, ParamsError
from cs_run.registry import register_data_processor

__all__ = ["LlavaSamples", "build_dataloader", "samples_loader", "FEATURES", "FEATURES_2_2", "NO_IMAGE"]

logger = logging.getLogger(__name__)

FEATURES = ("text_input_ids", "loss_mask", "labels", "key_padding_mask")
"""The rows of ``data``, in order (the vendor's map of input_ids, input_mask, labels, attention_mask)."""
FEATURES_2_2 = ("text_input_ids", "loss_mask", "labels", "attention_span", "position_ids", "key_padding_mask")
"""Release 2.2's six rows (its processor's features_list, the ``*_shuffled`` data its files name): each token's
VSL span (the keys a query may see: its own document's) and position; the model reads both."""
LAYOUTS = {len(FEATURES): FEATURES, len(FEATURES) + 1: FEATURES, len(FEATURES_2_2): FEATURES_2_2}
"""The rows read, by the rows a sample holds: the data_preprocessing tool's fifth (token_modality_idx) unread."""
HALF_TYPES = ("bfloat16", "float16", "cbfloat16")
"""Release 2.2's ``fp16_type`` values (its MultiModalHDF5Dataset's)."""
NO_IMAGE = b"None"
"""``img_path`` of a text-only sample (numpy's bytes of None, as the preprocessing writes it)."""


def _pil_image():
    """PIL.Image, or the error that says how to get it (an optional package)."""
    try:
        from PIL import Image  # noqa: PLC0415 - optional package
    except ImportError:
        raise ParamsError("LlavaHDF5MapDataProcessor reads images with Pillow, which is not installed; pip install "
                          "'cs-run[vision]'") from None
    return Image


class LlavaSamples(Dataset):
    """Sample ``i`` of the shards as a dict of the four int32 rows and ``image_data``."""

    def __init__(self, reader: H5Reader, img_data_dir: Path, image_data_size: list, transform: Callable,
                 vocab_size: Optional[int], rank: int = 0, num_ranks: int = 1, drop_last: bool = True) -> None:
        self.reader, self.img_data_dir, self.image_data_size = reader, img_data_dir, list(image_data_size)
        self.transform, self.vocab_size = transform, vocab_size
        self.samples = replica_share(len(reader), rank, num_ranks, drop_last)
        self._paths: dict[tuple[int, str], h5py.Dataset] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self.samples)

    def _entry(self, sample: int, name: str) -> tuple[np.ndarray, Path]:
        """(dataset ``name``'s entry, its shard) of sample ``sample`` (after ``data_subset``)."""
        j = self.reader.subset(sample) if self.reader.subset is not None else sample
        f = int(np.searchsorted(self.reader.offsets, j, side="right")) - 1
        if os.getpid() != self._pid:  # a forked worker opens its own handles
            self._paths, self._pid = {}, os.getpid()
        if (f, name) not in self._paths:
            self._paths[f, name] = h5py.File(self.reader.files[f], "r")[name]
        return np.asarray(self._paths[f, name][j - self.reader.offsets[f]]), self.reader.files[f]

    def _load(self, path: bytes, sample: int, shard: Path) -> torch.Tensor:
        """The image an ``img_path`` entry names, transformed (a black one for ``None``)."""
        image = _pil_image()
        c, h, w = self.image_data_size
        if path == NO_IMAGE:
            img = image.new("RGB", (w, h))
        else:
            full = self.img_data_dir / path.decode("utf-8")
            try:
                with image.open(full) as opened:
                    img = opened.convert("RGB")
            except (OSError, ValueError) as e:
                raise DataError(f"img_data_dir: {full} (sample {sample} of {shard}) is not a readable image ({e}); "
                                "set img_data_dir to the folder the preprocessing's image paths are relative to") from None
        out = self.transform(img)
        if list(out.shape) != self.image_data_size:
            raise DataError(f"transforms: the image of sample {sample} ({shard}) became {list(out.shape)}, the model "
                            f"reads {self.image_data_size} (model.image_model num_channels, image_size); resize and "
                            "crop to the model's image_size")
        return out

    def _image(self, sample: int) -> torch.Tensor:
        entry, shard = self._entry(sample, "img_path")
        return self._load(bytes(entry.reshape(-1)[0]), sample, shard)

    def _check_ids(self, ids: np.ndarray, sample: int) -> None:
        if self.vocab_size is not None and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
            raise DataError(f"data_dir: sample {sample} holds token id {bad}; ids must be in [0, "
                            f"model.text_model.vocab_size={self.vocab_size})")

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sample = self.samples[index] % len(self.reader)
        row = self.reader[sample]
        self._check_ids(row[0], sample)
        out = {name: torch.from_numpy(row[i].copy()) for i, name in enumerate(LAYOUTS[len(row)])}
        out["image_data"] = self._image(sample)
        return out


def _check_shards(reader: H5Reader) -> None:
    """The sample layout of four rows, and an ``img_path`` entry per sample in every shard."""
    if not reader.by_sample:
        raise ValueError(f"data_dir: {reader.files[0]} holds the corpus layout (concatenated tokens); llava reads "
                         "samples [n, 4, max_sequence_length] as its llava preprocessing writes them")
    if reader.features not in LAYOUTS:
        raise ValueError(f"data_dir: {reader.files[0]} holds {reader.features} rows per sample; llava reads 4 "
                         f"({', '.join(FEATURES)}; a fifth, token_modality_idx, is left unread) or Release 2.2's 6 "
                         f"({', '.join(FEATURES_2_2)})")
    for i, path in enumerate(reader.files):
        with h5py.File(path, "r") as f:
            n = int(reader.offsets[i + 1] - reader.offsets[i])
            strings = "img_path" in f and (f["img_path"].dtype.kind == "S" or h5py.check_string_dtype(f["img_path"].dtype))
            if not strings or f["img_path"].shape[:1] != (n,):
                got = f"{f['img_path'].dtype}{list(f['img_path'].shape)}" if "img_path" in f else "none"
                raise ValueError(f"data_dir: {path} needs 'img_path' of {n} byte strings (one per sample), got {got}; "
                                 "write it with the llava preprocessing")


@register_data_processor("LlavaHDF5MapDataProcessor")
def build_dataloader(split: str, data_dir: Union[str, list, None] = None, img_data_dir: Optional[str] = None,
                     image_data_size: Optional[list] = None, transforms: Optional[list] = None,
                     batch_size: int = 128, data_processor: str = "LlavaHDF5MapDataProcessor", shuffle: bool = True,
                     shuffle_seed: Optional[int] = None, drop_last: bool = True, num_workers: int = 0,
                     prefetch_factor: Optional[int] = 10, persistent_workers: bool = True,
                     max_sequence_length: Optional[int] = None, data_subset: Optional[str] = None,
                     sort_files: bool = True, use_vsl: bool = False, pad_last: bool = False,
                     use_worker_cache: bool = False, dataset_map_fn: Any = None, vocab_size: Any = None,
                     image_model: Optional[dict] = None, text_model: Optional[dict] = None,
                     bos_token_id: Optional[int] = None, pad_token_id: Optional[int] = None,
                     fp16_type: Optional[str] = None) -> DataLoader:
    """Data function of llava: the split's DataLoader of dicts (:data:`FEATURES` and ``image_data``); see the
    module doc. ``image_model`` and ``text_model`` are the model's sections (the registry copies them here):
    the image shape and the vocabulary the samples are checked against. ``vocab_size`` (deprecated in the
    vendor's) and ``use_worker_cache`` change nothing here, nor Release 2.2's ``bos_token_id``, ``pad_token_id``
    and ``fp16_type`` (the module doc says why)."""
    where = "train_input" if split == "train" else "eval_input"
    if fp16_type not in (None, *HALF_TYPES):
        raise ParamsError(f"params: {where}.fp16_type: {fp16_type!r} is not one of {', '.join(HALF_TYPES)}")
    for key, value in (("bos_token_id", bos_token_id), ("pad_token_id", pad_token_id)):
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            raise ParamsError(f"params: {where}.{key}: expected a token id (an integer >= 0), got {value!r}")
    for key, value, why in (("use_vsl", use_vsl, "the vendor's llava data refuses it too"),
                            ("pad_last", pad_last, "keep drop_last true: every step sees a full batch"),
                            ("dataset_map_fn", dataset_map_fn, "the four rows are read by position")):
        if value:
            raise ParamsError(f"params: {where}.{key}: {value!r} is not supported here ({why})")
    for key, value in (("data_dir", data_dir), ("img_data_dir", img_data_dir), ("transforms", transforms)):
        if value is None:
            raise ParamsError(f"params: {where}.{key}: not set; LlavaHDF5MapDataProcessor needs data_dir (the *.h5 "
                              "samples), img_data_dir (their images) and transforms")
    if image_model:
        size = image_model.get("image_size", [224, 224])
        image_data_size = [image_model.get("num_channels", 3), *size]
    if not (isinstance(image_data_size, list) and len(image_data_size) == 3):
        raise ParamsError(f"params: {where}.image_data_size: expected [channels, height, width], got "
                          f"{image_data_size!r}")
    return samples_loader(split, where, LlavaSamples, _check_shards, data_dir=data_dir, img_data_dir=img_data_dir,
                          image_data_size=image_data_size, transforms=transforms, batch_size=batch_size,
                          shuffle=shuffle, shuffle_seed=shuffle_seed, drop_last=drop_last, num_workers=num_workers,
                          prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                          max_sequence_length=max_sequence_length, data_subset=data_subset, sort_files=sort_files,
                          text_model=text_model)


def samples_loader(split: str, where: str, samples_class: type, check_shards: Callable, *, data_dir, img_data_dir,
                   image_data_size: list, transforms: list, batch_size: int, shuffle: bool, shuffle_seed, drop_last: bool,
                   num_workers: int, prefetch_factor, persistent_workers: bool, max_sequence_length, data_subset,
                   sort_files: bool, text_model: Optional[dict], **samples_keys: Any) -> DataLoader:
    """The DataLoader of an image-and-text HDF5 processor (llava's, multimodal_simple's): the shards read and
    checked (``check_shards``), the transform built, ``samples_class`` over them (``samples_keys`` its own
    arguments), split over the streamers and batched."""
    if not Path(img_data_dir).is_dir():
        raise ParamsError(f"params: {where}.img_data_dir: {img_data_dir} is not a folder (the images the samples' "
                          "img_path entries name)")
    try:
        reader = H5Reader(data_dir, max_sequence_length, data_subset, sort_files)
        check_shards(reader)
    except ValueError as e:
        raise ParamsError(f"params: {where}.{e}") from None
    transform = build_transform(transforms, where)
    _pil_image()  # the missing-package error now, not in a worker
    vocab = (text_model or {}).get("vocab_size")
    dataset = samples_class(reader, Path(img_data_dir), image_data_size, transform, vocab, get_streaming_rank(),
                            num_streamers(), drop_last, **samples_keys)
    per_stream = get_streaming_batch_size(batch_size)
    if drop_last and len(dataset) < per_stream:
        raise ParamsError(f"params: {where}.batch_size: {per_stream} per streamer but the shards hold {len(dataset)} "
                          "samples (with drop_last no batch would be produced)")
    generator = torch.Generator().manual_seed(shuffle_seed) if shuffle_seed is not None else None
    extra = {"prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers} if num_workers else {}
    logger.info("%s data (%s): %d samples of %d tokens in %d shard(s) of %s", samples_class.__name__, split, len(reader),
                reader.sequence_length, len(reader.files), data_dir)
    return DataLoader(dataset, batch_size=per_stream, shuffle=shuffle, drop_last=drop_last, num_workers=num_workers,
                      generator=generator, **extra)
