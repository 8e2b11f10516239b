"""GptHDF5DataProcessor and GptHDF5MapDataProcessor: the Model Zoo's GPT HDF5 shards as a torch DataLoader.

GptHDF5DataProcessor reads the sample layout (:mod:`cs_run.data.readers.hdf5_samples`),
GptHDF5MapDataProcessor also the corpus layout, mixtures and subsets (:mod:`cs_run.data.readers.hdf5_map`).

As in the Model Zoo, ``batch_size`` is the effective batch over all streamers. Unlike its file-by-file
sharding (file ``i`` to rank ``i % num_streamers``), the samples of all files are split over the streaming
ranks as torch's ``DistributedSampler`` splits them (:func:`~cs_run.data.readers.hdf5_map.replica_share`:
every ``num_streamers``-th sample, the remainder left out with ``drop_last_batch``, else wrapped round),
so every replica steps the same number of batches whatever the shards' sizes (replicas step together:
one with more batches would wait for the others). Unlike its buffered shuffle, samples are drawn as a
full permutation of the rank's share from the loader's generator, so the runner's RNG checkpoint replays
the exact order on resume. Every token id read is checked against model.vocab_size on the host.
"""

from __future__ import annotations

import logging
from typing import Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from cs_run.data.readers.hdf5_map import H5Reader, Mixture, replica_share
from cs_run.data.readers.hdf5_samples import FEATURES, IGNORE_INDEX, VSL_FEATURES, GptHDF5Dataset, check_vsl_rows
from cs_run.data.transforms import build_collate
from cs_run.distributed import get_streaming_batch_size, get_streaming_rank, num_streamers
from cs_run.errors import DataError
from cs_run.registry import register_data_processor

__all__ = ["GptHDF5Dataset", "build_dataloader", "DATA_PROCESSORS", "FEATURES"]

logger = logging.getLogger(__name__)

DATA_PROCESSORS = ("GptHDF5DataProcessor", "GptHDF5MapDataProcessor")


_NO_EFFECT = {
    "use_worker_cache": "copies the shards to each Cerebras worker node's local disk; here they are read where "
                        "they are",
    "repeat": "deprecated in the Model Zoo's data processors; the runner cycles the loader for the step budget",
    "use_multiple_workers": "deprecated in the Model Zoo's data processors",
    "num_examples": "Release 2.3's gemma2 27b file; read by no data processor of that release (the shards count "
                    "their samples)",
}
"""Input keys the Model Zoo's GPT data processors accept that change nothing here: noted once each."""
_NOTED: set[str] = set()


def _note(split: str, key: str, value: object) -> None:
    if value is None or value is False or key in _NOTED:
        return
    _NOTED.add(key)
    logger.info("%s_input.%s=%r: no effect here (%s)", split, key, value, _NO_EFFECT[key])


class _MapSamples(Dataset):
    """GptHDF5MapDataProcessor's samples: a reader's rows as feature dicts (corpus rows shifted by one)."""

    def __init__(self, reader: Union[H5Reader, Mixture], num_samples: Optional[int] = None, rank: int = 0,
                 num_ranks: int = 1, vocab_size: Optional[int] = None, where: object = "data_dir",
                 drop_last: bool = True, use_vsl: bool = False) -> None:
        self.reader, self.by_sample = reader, reader.by_sample
        self.names = (*FEATURES, *VSL_FEATURES) if use_vsl else FEATURES
        self.vocab_size, self.where = vocab_size, where
        self.max_sequence_length = reader.sequence_length
        if len(reader) == 0:
            raise ValueError("data_dir: the shards hold no sample of max_sequence_length tokens")
        self.epoch = len(reader) if num_samples is None else num_samples
        """The Model Zoo's epoch size (num_samples, cycling the data), else the reader's samples."""
        self.samples = replica_share(self.epoch, rank, num_ranks, drop_last)
        """This streamer's share of the epoch (position ``p`` is sample ``p % epoch``)."""

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sample = self.samples[index] % self.epoch % len(self.reader)
        row = self.reader[sample]
        # the sample layout: input_ids (row 0) and labels (row 2, where -100 means "not scored"); a corpus row
        ids = np.concatenate([row[0], row[2][row[2] != IGNORE_INDEX]]) if self.by_sample else row
        if self.vocab_size is not None and ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
            raise DataError(f"data_dir: {self.where}: sample {sample} holds token id {bad}; ids must be in "
                            f"[0, model.vocab_size={self.vocab_size}): set model.vocab_size to at least {bad + 1} "
                            "or write the shards with this vocabulary")
        if self.by_sample:
            if len(self.names) > len(FEATURES):
                check_vsl_rows(row[3], row[4], f"data_dir: {self.where}: sample {sample}")
            return {name: torch.from_numpy(row[i].copy()) for i, name in enumerate(self.names)}
        return {"input_ids": torch.from_numpy(row[:-1].copy()), "labels": torch.from_numpy(row[1:].copy()),
                "attention_mask": torch.ones(len(row) - 1, dtype=torch.int32)}


def _map_dataset(split: str, data_dir: Union[str, list, None], mixture: Optional[list], shuffle: bool,
                 shuffle_seed: Optional[int], max_sequence_length: Optional[int], data_subset: Optional[str],
                 sort_files: bool, num_samples: Optional[int], vocab_size: Optional[int] = None,
                 drop_last: bool = True, use_vsl: bool = False) -> _MapSamples:
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)
                                    or num_samples < 1):
        raise ValueError(f"num_samples: expected a positive integer (samples per epoch), got {num_samples!r}")
    if data_dir is None and mixture is None:  # e.g. the placeholder of a params file convert --from hf wrote
        raise ValueError(f"data_dir: not set; set {split}_input.data_dir to a folder of *.h5 shards (cs-run data "
                         f"preprocess -o DIR writes DIR/train and DIR/val), e.g. --set {split}_input.data_dir=DIR/"
                         f"{'train' if split == 'train' else 'val'}")
    if (data_dir is None) == (mixture is None):
        raise ValueError("data_dir: give exactly one of data_dir and mixture (a list of {data_dir, weight})")
    if mixture is None:
        reader: Union[H5Reader, Mixture] = H5Reader(data_dir, max_sequence_length, data_subset, sort_files)
    else:
        if not isinstance(mixture, list) or not mixture:
            raise ValueError(f"mixture: expected a non-empty list of {{data_dir, weight}} mappings, got {mixture!r}")
        readers, weights = [], []
        for i, entry in enumerate(mixture):
            if not isinstance(entry, dict) or "data_dir" not in entry or "weight" not in entry \
                    or set(entry) - {"data_dir", "weight", "data_subset"}:
                raise ValueError(f"mixture[{i}]: expected a mapping with data_dir, weight (and data_subset), "
                                 f"got {entry!r}")
            readers.append(H5Reader(entry["data_dir"], max_sequence_length, entry.get("data_subset"), sort_files))
            weights.append(entry["weight"])
        reader = Mixture(readers, weights, interleave=not shuffle, seed=shuffle_seed or 0)
    if reader.by_sample and reader.features < len(FEATURES):
        raise ValueError(f"data_dir: the shards hold {reader.features} rows per sample; expected input_ids, "
                         "attention_mask, labels")
    if use_vsl and not reader.by_sample:  # as the vendor's GptHDF5MapDataProcessor refuses it
        raise ValueError("use_vsl: the shards are the corpus layout (concatenated tokens), which holds no document "
                         "spans; write the sample layout with a VSL preprocessing (dataset.use_vsl: true) or set "
                         "use_vsl false")
    if use_vsl and reader.features != len(FEATURES) + len(VSL_FEATURES):
        raise ValueError(f"use_vsl: the shards hold {reader.features} rows per sample; packed shards hold 5 (input_ids, "
                         "attention_mask, labels, attention_span, position_ids): write them with a VSL preprocessing "
                         "(dataset.use_vsl: true) or set use_vsl false")
    return _MapSamples(reader, num_samples, get_streaming_rank(), num_streamers(), vocab_size,
                       data_dir if mixture is None else "the mixture's data_dirs", drop_last, use_vsl)


def _log_share(split: str, total: int, share: int, streamers: int) -> None:
    """Says how the epoch was evened over the streamers (ordinal 0 logs: the others log errors only)."""
    if streamers == 1:
        return
    left = total - share * streamers
    how = (f"the last {left} left out, as torch's DistributedSampler(drop_last=True)" if left > 0 else
           f"the first {-left} wrapped round, as torch's DistributedSampler(drop_last=False)" if left < 0 else
           "an even split")
    logger.info("GPT data (%s): %d of the %d samples to each of %d streamers (%s)", split, share, total, streamers,
                how)


@register_data_processor(*DATA_PROCESSORS)
def build_dataloader(split: str, data_dir: Union[str, list, None] = None, batch_size: int = 128,
                     data_processor: str = "GptHDF5DataProcessor", shuffle: bool = True,
                     shuffle_seed: Optional[int] = None, drop_last_batch: bool = True, drop_last: Optional[bool] = None,
                     num_workers: int = 0, prefetch_factor: Optional[int] = None,
                     persistent_workers: bool = False, shuffle_buffer: Optional[int] = None,
                     max_sequence_length: Optional[int] = None, features: Optional[list] = None,
                     mixture: Optional[list] = None, data_subset: Optional[str] = None, num_samples: Optional[int] = None,
                     sort_files: bool = True, use_vsl: bool = False, pad_last: bool = False,
                     data_transforms: Optional[list] = None, use_worker_cache: bool = False,
                     vocab_size: Optional[int] = None, repeat: Optional[bool] = None,
                     use_multiple_workers: Optional[bool] = None, num_examples: Optional[int] = None) -> DataLoader:
    """Data function of the GPT-style models: the split's DataLoader over Model Zoo GPT HDF5 shards.

    ``GptHDF5DataProcessor`` reads the sample layout ``[n, 3, msl]``; ``GptHDF5MapDataProcessor`` also
    the corpus layout, ``mixture``, ``data_subset``, ``num_samples`` and ``sort_files`` (see
    :mod:`cs_run.data.readers.hdf5_map`). ``data_dir`` is a folder or a list of folders. ``drop_last``
    is the Model Zoo's name for ``drop_last_batch``; ``data_transforms`` run on every batch
    (:mod:`cs_run.data.transforms`). ``shuffle_buffer`` is accepted and has no effect (samples
    are shuffled as a full permutation); ``use_worker_cache``, ``repeat`` and ``use_multiple_workers``
    change nothing here and are noted once, as is ``num_examples`` (Release 2.3's gemma2 27b file; read by no
    vendor data processor of that release). ``vocab_size`` is model.vocab_size (the registry copies it
    here): every token id read is checked against it on the host, so an id the model cannot embed is an
    error naming the shard (or data_dir) and the sample. ``use_vsl`` reads packed shards' ``attention_span``
    and ``position_ids`` rows too (sample layout, five rows), which keep each document's attention and
    positions its own in the decoder.
    """

    if data_processor not in DATA_PROCESSORS:
        raise ValueError(f"data_processor: {data_processor!r} is not supported by cs-run's GPT data; expected one of "
                         f"{', '.join(DATA_PROCESSORS)}")
    if shuffle_buffer is not None:
        logger.debug("%s: shuffle_buffer=%s has no effect (samples are drawn as a full permutation)", split,
                     shuffle_buffer)
    for key, value in (("use_worker_cache", use_worker_cache), ("repeat", repeat),
                       ("use_multiple_workers", use_multiple_workers), ("num_examples", num_examples)):
        _note(split, key, value)
    if pad_last:
        raise ValueError("pad_last: padding the last batch with empty samples is not supported here; drop it and "
                         "keep drop_last true (every step then sees a full batch)")
    collate = build_collate(data_transforms)
    if use_vsl and data_transforms:  # the vendor's add_sink_tokens is a BaseTransformNoVSL: spans would misalign
        raise ValueError(f"data_transforms[0].name: {data_transforms[0]['name']!r} does not run with use_vsl (it "
                         "shifts tokens but not the attention_span / position_ids rows); drop the transform or set "
                         "use_vsl false")
    map_only = {"mixture": mixture, "data_subset": data_subset, "num_samples": num_samples,
                "sort_files": None if sort_files else sort_files}
    drop = drop_last_batch if drop_last is None else drop_last
    if data_processor == "GptHDF5MapDataProcessor":
        dataset: Union[_MapSamples, GptHDF5Dataset] = _map_dataset(
            split, data_dir, mixture, shuffle, shuffle_seed, max_sequence_length, data_subset, sort_files,
            num_samples, vocab_size, drop, use_vsl)
        files = len(getattr(dataset.reader, "files", ())) or sum(len(r.files) for r in dataset.reader.readers)
        total = dataset.epoch
    else:
        given = [key for key, value in map_only.items() if value is not None]
        if given:
            raise ValueError(f"{given[0]}: a key of GptHDF5MapDataProcessor, not of {data_processor}; set "
                             "data_processor: GptHDF5MapDataProcessor")
        if data_dir is None:
            raise ValueError("data_dir: missing; the folder (or list of folders) holding the *.h5 shards")
        dataset = GptHDF5Dataset(data_dir, get_streaming_rank(), num_streamers(), features, max_sequence_length,
                                 vocab_size, drop, use_vsl)
        files = len(dataset.files)
        total = int(dataset.offsets[-1])
    per_stream = get_streaming_batch_size(batch_size)
    if drop and len(dataset) < per_stream:
        share = f" per streamer ({total} over {num_streamers()})" if num_streamers() > 1 else ""
        raise ValueError(f"batch_size: {per_stream} per streamer but the {split} shards hold {len(dataset)} samples"
                         f"{share} (with drop_last_batch no batch would be produced)")
    generator = torch.Generator().manual_seed(shuffle_seed) if shuffle_seed is not None else None
    extra = {"prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers} if num_workers else {}
    logger.info("GPT data (%s, %s): %d samples of %d tokens in %d shard(s) of %s", split, data_processor, total,
                dataset.max_sequence_length, files, data_dir if mixture is None else "a mixture")
    _log_share(split, total, len(dataset), num_streamers())
    return DataLoader(dataset, batch_size=per_stream, shuffle=shuffle, drop_last=drop, num_workers=num_workers,
                      generator=generator, collate_fn=collate, **extra)
