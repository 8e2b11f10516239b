"""DpoHDF5DataProcessor: the Model Zoo's DPO preference shards as a torch DataLoader.

The layout is the one the Model Zoo's DPO token generator writes (Release 2.10
``data_preparation/data_preprocessing/dpo_token_generator.py``, ``encode``) and its ``HDF5IterableDataset``
reads: every ``*.h5`` file in ``data_dir`` holds an integer dataset ``data`` of shape
``[n_examples, 6, max_sequence_length]`` and an ``n_examples`` attribute. The six rows are
:data:`FEATURES`: for the chosen and then the rejected answer, the prompt-and-answer tokens, the loss mask
(``attention_mask``: 0 on the prompt and the padding) and the labels (the tokens shifted left by one,
padded with the pad id). A ``data_params.json`` beside the files may name the rows (``"features"``), and
an input's ``features_list`` may too, as in the Model Zoo.

Samples are split over the streaming ranks and shuffled as the GPT data is
(:mod:`cs_run.data.processors.gpt_hdf5`): a rank's share is :func:`replica_share` of all files' samples, drawn
as a full permutation from the loader's seeded generator, so a resumed run replays the same order.
Every token id read is checked on the host against ``vocab_size`` when the input gives it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Optional, Union

import h5py  # noqa: TID253 - this data module reads HDF5 files; loaded only with the dpo data
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from cs_run.data.readers.hdf5_map import replica_share, shard_files
from cs_run.distributed import get_streaming_batch_size, get_streaming_rank, num_streamers
from cs_run.errors import DataError
from cs_run.registry import register_data_processor

__all__ = ["DpoHDF5Dataset", "build_dataloader", "DATA_PROCESSORS", "FEATURES"]

logger = logging.getLogger(__name__)

FEATURES = ("chosen_input_ids", "chosen_attention_mask", "chosen_labels",
            "rejected_input_ids", "rejected_attention_mask", "rejected_labels")
"""The rows of a sample, in the token generator's order (its ``self.features``)."""
DATA_PROCESSORS = ("DpoHDF5DataProcessor",)
_TOKEN_ROWS = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")
# what h5py raises for a damaged file (as the GPT data's reader)
_H5_ERRORS = (OSError, KeyError, RuntimeError, ValueError, TypeError)


def _features(data_dir: Union[str, list], given: Optional[list]) -> list[str]:
    """The rows' names: the input's ``features_list``, else data_params.json's ``features``, else FEATURES."""
    if given:
        return list(given)
    if not isinstance(data_dir, list):
        path = Path(data_dir) / "data_params.json"
        if path.is_file():
            try:
                named = json.loads(path.read_text()).get("features")
            except (OSError, ValueError, AttributeError):
                named = None
            if isinstance(named, list) and named:
                return named
    return list(FEATURES)


class DpoHDF5Dataset(Dataset):
    """One streaming rank's share of the shards' preference pairs, as dicts of the six int32 rows."""

    def __init__(self, data_dir: Union[str, list], rank: int = 0, num_ranks: int = 1,
                 features: Optional[list] = None, vocab_size: Optional[int] = None, drop_last: bool = True) -> None:
        self.files = shard_files(data_dir)
        names = _features(data_dir, features)
        self.rows = {name: i for i, name in enumerate(names)}
        missing = [f for f in FEATURES if f not in self.rows]
        if missing:
            raise ValueError(f"features_list: the shards' rows {names} lack {', '.join(missing)} (the DPO token "
                             f"generator writes {', '.join(FEATURES)})")
        self.vocab_size = vocab_size
        counts, msl = [], None
        for path in self.files:
            n, file_msl = self._check_file(path, len(names))
            if msl is not None and file_msl != msl:
                raise ValueError(f"data_dir: {path.name} has max_sequence_length {file_msl}, other shards {msl}")
            msl = file_msl
            counts.append(n)
        self.max_sequence_length = msl
        self.offsets = np.cumsum([0] + counts)
        self.samples = replica_share(int(self.offsets[-1]), rank, num_ranks, drop_last)
        self._handles: dict[int, h5py.File] = {}
        self._pid = os.getpid()

    @staticmethod
    def _check_file(path: Path, rows: int) -> tuple[int, int]:
        """``(n_examples, max_sequence_length)`` of a shard whose ``data`` is ``[n, rows, msl]`` integers."""
        try:
            with h5py.File(path, "r") as f:
                if "data" not in f:
                    raise ValueError(f"data_dir: {path} has no dataset 'data' (keys: {', '.join(f.keys())})")
                d = f["data"]
                if d.ndim != 3 or d.shape[1] != rows or not np.issubdtype(d.dtype, np.integer):
                    raise ValueError(f"data_dir: {path} 'data' is {d.dtype}{list(d.shape)}; expected integers of "
                                     f"shape [n_examples, {rows}, max_sequence_length] (the DPO token generator's "
                                     "six rows per pair)")
                n = int(f.attrs.get("n_examples", d.shape[0]))
                if not 0 <= n <= d.shape[0]:
                    raise ValueError(f"data_dir: {path} attribute n_examples={n} but 'data' holds {d.shape[0]} rows")
                return n, int(d.shape[2])
        except _H5_ERRORS as e:
            if isinstance(e, ValueError) and str(e).startswith("data_dir: "):
                raise  # one of the checks above
            raise ValueError(f"data_dir: {path} is not a readable HDF5 file ({' '.join(str(e).split())})") from None

    def __len__(self) -> int:
        return len(self.samples)

    def _file(self, i: int) -> h5py.File:
        if os.getpid() != self._pid:  # a forked worker: never share the parent's HDF5 handles
            self._handles, self._pid = {}, os.getpid()
        if i not in self._handles:
            self._handles[i] = h5py.File(self.files[i], "r")
        return self._handles[i]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        sample = self.samples[index] % int(self.offsets[-1])
        i = int(np.searchsorted(self.offsets, sample, side="right")) - 1
        local = int(sample - self.offsets[i])
        try:
            row = np.asarray(self._file(i)["data"][local], dtype=np.int32)
        except _H5_ERRORS as e:
            raise DataError(f"data_dir: {self.files[i]}: sample {local} cannot be read ({' '.join(str(e).split())}); "
                            "the shard is damaged: write it again or remove it from data_dir") from None
        high = self.vocab_size if self.vocab_size is not None else np.iinfo(np.int32).max
        for name in _TOKEN_ROWS:  # an id the model cannot embed would fail deep in the step, naming nothing
            values = row[self.rows[name]]
            bad = np.flatnonzero((values < 0) | (values >= high))
            if bad.size:
                raise DataError(f"data_dir: {self.files[i]}: sample {local} holds token id {int(values[bad[0]])} in "
                                f"{name} (position {int(bad[0])}); ids must be in [0, vocab_size={high}): set "
                                "model.policy_model.vocab_size to the tokenizer's size or write the shards again")
        return {name: torch.from_numpy(row[self.rows[name]].copy()) for name in FEATURES}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state


@register_data_processor("DpoHDF5DataProcessor")
def build_dataloader(split: str, data_dir: Union[str, list, None] = None, batch_size: int = 128,
                     data_processor: str = "DpoHDF5DataProcessor", shuffle: bool = True,
                     shuffle_seed: Optional[int] = None, shuffle_buffer: Optional[int] = None,
                     drop_last: bool = True, num_workers: int = 0, prefetch_factor: Optional[int] = None,
                     persistent_workers: bool = False, features_list: Optional[list] = None,
                     vocab_size: Optional[int] = None, use_worker_cache: bool = False) -> DataLoader:
    """Data function of the dpo model: the split's DataLoader over the Model Zoo's DPO HDF5 shards.

    The keys are DpoHDF5DataProcessorConfig's (Release 2.10). ``shuffle_buffer`` is accepted and has no
    effect (samples are shuffled as a full permutation); ``use_worker_cache`` copies shards to a Cerebras
    worker's disk there and changes nothing here. ``batch_size`` is the batch over all streamers.
    """
    if data_processor not in DATA_PROCESSORS:
        raise ValueError(f"data_processor: {data_processor!r} is not a DPO data processor; expected one of "
                         f"{', '.join(DATA_PROCESSORS)}")
    if data_dir is None:
        raise ValueError("data_dir: missing; the folder (or list of folders) holding the DPO *.h5 shards")
    dataset = DpoHDF5Dataset(data_dir, get_streaming_rank(), num_streamers(), features_list, vocab_size, drop_last)
    per_stream = get_streaming_batch_size(batch_size)
    if drop_last and len(dataset) < per_stream:
        raise ValueError(f"batch_size: {per_stream} per streamer but the {split} shards hold {len(dataset)} pairs "
                         "(with drop_last no batch would be produced)")
    generator = torch.Generator().manual_seed(shuffle_seed) if shuffle_seed is not None else None
    extra = {"prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers} if num_workers else {}
    logger.info("DPO data (%s): %d pairs of %d tokens in %d shard(s) of %s", split, int(dataset.offsets[-1]),
                dataset.max_sequence_length, len(dataset.files), data_dir)
    return DataLoader(dataset, batch_size=per_stream, shuffle=shuffle, drop_last=drop_last, num_workers=num_workers,
                      generator=generator, **extra)
