"""BERTSUM data for ``bert/extractive_summarization``: the Model Zoo's BertSumCSVDataProcessor (Release 2.10
``data/nlp/bert/BertSumCSVDataProcessor.py``), reading what its preprocessing writes.

Layout (``data_preparation/nlp/extractive_summarisation_utils.py`` lines 31 and 53-86): ``data_dir`` holds
``meta.dat`` (``<csv file> <rows>`` lines) and comma-separated CSVs with the header ``input_token_ids``,
``labels``, ``segment_ids``, ``cls_ids``, each cell a list of integers (``[2, 17, 3]``). The vendor reads the
four columns by position (``data_row.values()``), as here. Each row becomes (``create_bertsum_feature``)
``input_ids`` and ``token_type_ids`` padded or cut to ``max_sequence_length`` with ``pad_id`` (default the
vocab's [PAD] id), ``attention_mask`` = ``input_ids != pad_id``, ``labels`` and ``cls_indices`` padded or cut
to ``max_cls_tokens``, and ``cls_weights`` = ``cls_indices != pad_id`` (so a [CLS] at position 0 weighs 0 with
pad id 0: the vendor's rule, kept). With ``shuffle`` rows stream through a ``shuffle_buffer`` from which each
new row evicts a random one (``load_buffer``), seeded by ``shuffle_seed``.

A missing file or column, or a cell that is not a list of integers, is a DataError naming file and line.
"""

from __future__ import annotations

import csv
import os
import random
from typing import Optional, Union

import numpy as np
from torch.utils.data import DataLoader

from cs_run.data.processors.bert import ShardedRowsDataset, build_vocab, read_meta
from cs_run.data.readers.meta_dat import whole_batches
from cs_run.errors import DataError
from cs_run.registry import register_data_processor

__all__ = ["BertSumCSVDataset", "build_dataloader", "COLUMNS"]

COLUMNS = ("input_token_ids", "labels", "segment_ids", "cls_ids")


def _ints(cell: Optional[str], where: str, column: str) -> list[int]:
    text = (cell or "").strip()
    try:
        if not (text.startswith("[") and text.endswith("]")):
            raise ValueError
        return [int(x) for x in text[1:-1].split(",") if x.strip()]
    except ValueError:
        raise DataError(f"{where}: column {column!r} must be a list of integers like [2, 17, 3], got "
                        f"{text[:40]!r}") from None


def _pad(values: list, pad: int, length: int) -> np.ndarray:
    out = np.full((length,), pad, np.int32)
    out[:min(length, len(values))] = values[:length]
    return out


class BertSumCSVDataset(ShardedRowsDataset):
    """Batches (dicts of tensors) of the BERTSUM CSV rows; ``len(self)`` whole batches a pass (``drop_last``)."""

    def __init__(self, *, data_dir, batch_size: int, vocab_file: str, max_sequence_length: int, max_cls_tokens: int,
                 pad_id: Optional[int], do_lower: bool, shuffle: bool, shuffle_seed: Optional[int],
                 shuffle_buffer: Optional[int], drop_last: bool) -> None:
        super().__init__()
        self.files, self.num_examples = whole_batches(read_meta(data_dir), batch_size, data_dir)
        case = str.lower if do_lower else str
        vocab, _, oov_id = build_vocab(vocab_file, do_lower, case("[UNK]"))
        self.pad_id = vocab.get(case("[PAD]"), oov_id) if pad_id is None else pad_id
        self.msl, self.max_cls = max_sequence_length, max_cls_tokens
        self.batch_size, self.drop_last = batch_size, drop_last
        self.shuffle, self.shuffle_seed = shuffle, shuffle_seed
        self.shuffle_buffer = 10 * batch_size if shuffle_buffer is None else shuffle_buffer

    def _rows(self, files: list, rng: random.Random):
        buffer: list = []
        for path, count in files:
            try:
                with open(path, newline="") as f:
                    reader = csv.DictReader(f)
                    if len(reader.fieldnames or []) != len(COLUMNS):
                        raise DataError(f"{path}:1: expected the columns {', '.join(COLUMNS)} (the Model Zoo's "
                                        f"extractive summarization CSV), got {', '.join(reader.fieldnames or [])}")
                    for row_id, row in enumerate(reader):
                        if row_id >= count:
                            break
                        item = (path, row_id + 2, list(row.values()))
                        if not self.shuffle:
                            yield item
                        elif len(buffer) < self.shuffle_buffer:
                            buffer.append(item)
                        else:
                            index = rng.randrange(self.shuffle_buffer)
                            yield buffer[index]
                            buffer[index] = item
            except OSError as e:
                raise DataError(f"{path}: cannot read ({e.strerror or e}); meta.dat names it") from None
        if self.shuffle:
            rng.shuffle(buffer)
        yield from buffer

    def features(self, path: str, line: int, cells: list) -> dict:
        """create_bertsum_feature of one row."""
        ids, labels, segments, cls_ids = (_ints(cell, f"{path}:{line}", name) for cell, name in zip(cells, COLUMNS))
        input_ids = _pad(ids, self.pad_id, self.msl)
        cls_indices = _pad(cls_ids, self.pad_id, self.max_cls)
        if cls_indices.max(initial=0) >= self.msl:
            raise DataError(f"{path}:{line}: a [CLS] position ({int(cls_indices.max())}) is beyond "
                            f"max_sequence_length ({self.msl}); preprocess with this max_seq_length")
        return {"input_ids": input_ids, "token_type_ids": _pad(segments, self.pad_id, self.msl),
                "attention_mask": (input_ids != self.pad_id).astype(np.int32),
                "labels": _pad(labels, self.pad_id, self.max_cls), "cls_indices": cls_indices,
                "cls_weights": (cls_indices != self.pad_id).astype(np.float32)}


@register_data_processor("BertSumCSVDataProcessor")
def build_dataloader(split: str, data_processor: str = "BertSumCSVDataProcessor",
                     data_dir: Union[str, list, None] = None, vocab_file: Optional[str] = None, batch_size: int = 1,
                     max_sequence_length: Optional[int] = None, max_cls_tokens: Optional[int] = None,
                     pad_id: Optional[int] = None, mask_whole_word: bool = False, do_lower: bool = False,
                     shuffle: bool = True, shuffle_seed: Optional[int] = None, shuffle_buffer: Optional[int] = None,
                     num_workers: int = 0, prefetch_factor: Optional[int] = 10, persistent_workers: bool = True,
                     drop_last: bool = True) -> DataLoader:
    """Data function of ``model.name: bert/extractive_summarization`` (BertSumCSVDataProcessorConfig's keys and
    defaults). ``vocab_file`` is the model's when the input has none; ``mask_whole_word`` is accepted and unused,
    as there."""
    for key, value in (("data_dir", data_dir), ("vocab_file", vocab_file),
                       ("max_sequence_length", max_sequence_length), ("max_cls_tokens", max_cls_tokens)):
        if value is None:
            raise ValueError(f"{key}: required by BertSumCSVDataProcessor")
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    if pad_id is not None and pad_id < 0:
        raise ValueError(f"pad_id: must be >= 0, got {pad_id}")
    dataset = BertSumCSVDataset(
        data_dir=data_dir, batch_size=batch_size, vocab_file=os.path.expandvars(vocab_file),
        max_sequence_length=max_sequence_length, max_cls_tokens=max_cls_tokens, pad_id=pad_id, do_lower=do_lower,
        shuffle=shuffle, shuffle_seed=shuffle_seed, shuffle_buffer=shuffle_buffer, drop_last=drop_last)
    workers = {"num_workers": num_workers}
    if num_workers:
        workers.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers)
    return DataLoader(dataset, batch_size=None, **workers)
