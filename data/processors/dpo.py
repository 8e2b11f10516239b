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

import logging
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader

from cs_run.data.readers.hdf5_samples import SampleShards
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


class DpoHDF5Dataset(SampleShards):
    """One streaming rank's share of the shards' preference pairs, as dicts of the six int32 rows."""

    FEATURES = FEATURES
    FEATURES_KEY = "features_list"
    ROWS_WRITER = "DPO token generator"

    def _check_sample(self, path: Path, local: int, row: np.ndarray) -> None:
        high = self.vocab_size if self.vocab_size is not None else np.iinfo(np.int32).max
        for name in _TOKEN_ROWS:  # an id the model cannot embed would fail deep in the step, naming nothing
            values = row[self.feature_rows[name]]
            bad = np.flatnonzero((values < 0) | (values >= high))
            if bad.size:
                raise DataError(f"data_dir: {path}: sample {local} holds token id {int(values[bad[0]])} in "
                                f"{name} (position {int(bad[0])}); ids must be in [0, vocab_size={high}): set "
                                "model.policy_model.vocab_size to the tokenizer's size or write the shards again")


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
    dataset = DpoHDF5Dataset(data_dir, get_streaming_rank(), num_streamers(), features=features_list,
                             vocab_size=vocab_size, drop_last=drop_last)
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
