"""The Model Zoo's BertCSVDataProcessor (Release 2.10 ``data/nlp/bert/BertCSVDataProcessor.py``): CSV files of
already-masked MLM features, the validation data the ESM-2 and BERT files name.

``data_dir`` holds ``meta.dat`` (one ``<csv file> <rows>`` line per file, as for BertCSVDynamicMaskDataProcessor)
and CSV files whose columns are Python list literals: ``input_ids``, ``attention_mask`` and ``labels`` (required),
``masked_lm_positions`` and ``masked_lm_weights`` (read as ``masked_lm_mask``) when the labels are gathered, and
``next_sentence_label`` and ``token_type_ids`` unless ``disable_nsp``. Rows are read in file order (files
shuffled, then rows within a buffer of ``shuffle_buffer`` (10 batches by default), with ``random.Random(shuffle_seed
+ worker + 1)``, the vendor's seed; each input worker reads every ``num_workers``-th file) and batched
``batch_size`` at a time; ``dynamic_mlm_scale`` adds ``mlm_loss_scale`` = batch size / masked positions.

A missing column or a cell that is not a list of integers is a DataError naming the file, row and column.
"""

from __future__ import annotations

import ast
import random
from typing import Any, Iterator, Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from cs_run.data.processors.bert import read_meta
from cs_run.data.readers.meta_dat import batches, buffered_csv_rows
from cs_run.errors import DataError
from cs_run.registry import register_data_processor

__all__ = ["BertCSVDataset", "build_dataloader"]

_REQUIRED = ("input_ids", "attention_mask", "labels")
_GATHERED = ("masked_lm_positions", "masked_lm_weights")
_NSP = ("next_sentence_label", "token_type_ids")


class BertCSVDataset(IterableDataset):
    """Batches of the pre-masked CSV rows (see the module docstring)."""

    def __init__(self, *, data_dir, batch_size: int, disable_nsp: bool, shuffle: bool, shuffle_seed: Optional[int],
                 shuffle_buffer: Optional[int], dynamic_mlm_scale: bool, drop_last: bool) -> None:
        self.files = read_meta(data_dir)
        self.batch_size = batch_size
        self.columns = _REQUIRED + _GATHERED + (() if disable_nsp else _NSP)
        self.shuffle = shuffle
        self.seed = None if shuffle_seed is None else shuffle_seed + 1  # the vendor's worker 0 of 1
        self.shuffle_buffer = shuffle_buffer or 10 * batch_size
        self.dynamic_mlm_scale = dynamic_mlm_scale
        self.drop_last = drop_last
        if sum(n for _, n in self.files) < batch_size:
            raise DataError(f"data_dir {data_dir}: {sum(n for _, n in self.files)} rows in meta.dat, fewer than one "
                            f"batch of {batch_size}; choose a smaller batch_size")

    def __len__(self) -> int:
        rows = sum(n for _, n in self.files)
        return rows // self.batch_size if self.drop_last else -(-rows // self.batch_size)

    def _rows(self, rng: random.Random, worker: int, workers: int) -> Iterator[dict]:
        files = self.files[worker::workers]  # each input worker its own files (shard_list_interleaved)
        rows = buffered_csv_rows(files, rng, shuffle=self.shuffle, buffer_size=self.shuffle_buffer,
                                 unreadable_hint="fix meta.dat or the file")
        return (self._features(path, line, row) for path, line, row in rows)

    def _features(self, path: str, line: int, row: dict) -> dict:
        out = {}
        for column in self.columns:
            if row.get(column) is None:
                if column in _REQUIRED:
                    raise DataError(f"{path}:{line}: no {column!r} column (BertCSVDataProcessor needs "
                                    f"{', '.join(_REQUIRED)}); write the file with the Model Zoo's BERT CSV tools")
                continue
            try:
                value = np.array(ast.literal_eval(row[column]), dtype=np.int32)
            except (ValueError, SyntaxError, TypeError, OverflowError):
                raise DataError(f"{path}:{line}: column {column!r} is not a list of integers "
                                f"({row[column][:40]!r})") from None
            out["masked_lm_mask" if column == "masked_lm_weights" else column] = torch.from_numpy(value)
        return out

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rng = random.Random(None if self.seed is None else self.seed + worker)
        for batch in batches(self._rows(rng, worker, workers), self.batch_size, self.drop_last):
            yield self._collate(batch)

    def _collate(self, batch: list) -> dict:
        try:
            out = {k: torch.stack([b[k] for b in batch]) for k in batch[0]}
        except (KeyError, RuntimeError) as e:
            raise DataError(f"BertCSVDataProcessor: rows of one batch differ in their columns or lengths ({e}); "
                            "write every row with the same max_sequence_length and max_predictions_per_seq") from None
        if self.dynamic_mlm_scale and "masked_lm_mask" in out:
            scale = torch.tensor(float(len(batch))) / out["masked_lm_mask"].sum()
            out["mlm_loss_scale"] = scale.expand(len(batch), 1)
        return out


@register_data_processor("BertCSVDataProcessor")
def build_dataloader(split: str, data_processor: str = "BertCSVDataProcessor", data_dir: Union[str, list, None] = None,
                     batch_size: int = 1, disable_nsp: bool = False, dynamic_mlm_scale: bool = False,
                     buckets: Optional[list] = None, shuffle: bool = False, shuffle_seed: Optional[int] = None,
                     shuffle_buffer: Optional[int] = None, num_workers: int = 0, prefetch_factor: Optional[int] = 2,
                     persistent_workers: bool = False, drop_last: bool = True, vocab_size: Any = None,
                     vocab_file: Any = None, whole_word_masking: Any = None, max_predictions_per_seq: Any = None,
                     do_lower: Any = None, masked_lm_prob: Any = None, max_sequence_length: Any = None,
                     max_position_embeddings: Any = None) -> DataLoader:
    """Data function of BertCSVDataProcessor (its config keys and defaults; the ones after ``drop_last`` are
    deprecated there and unused). ``disable_nsp`` is the model's."""
    if data_dir is None:
        raise ValueError("data_dir: required (a folder of pre-masked BERT CSV files with meta.dat)")
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    if buckets is not None:
        raise ValueError("buckets: bucketing by length is not supported here; drop it (batches are then in order)")
    dataset = BertCSVDataset(data_dir=data_dir, batch_size=batch_size, disable_nsp=disable_nsp, shuffle=shuffle,
                             shuffle_seed=shuffle_seed, shuffle_buffer=shuffle_buffer,
                             dynamic_mlm_scale=dynamic_mlm_scale, drop_last=drop_last)
    workers = {"num_workers": num_workers}
    if num_workers:
        workers.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers)
    return DataLoader(dataset, batch_size=None, **workers)
