"""NER data for ``bert/token_classifier``: the Model Zoo's BertTokenClassifierDataProcessor (Release 2.10
``data/nlp/bert/BertTokenClassifierDataProcessor.py``), reading what its NER preprocessing writes.

Layout (``data_preparation/nlp/bert/ner_data_processor.py`` and the processor's ``load_buffer`` /
``parse_ner_row`` / ``create_ner_features``): ``data_dir`` holds ``meta.dat`` (``<csv file> <rows>`` lines) and
comma-separated CSV files with a header and columns ``tokens`` (word pieces separated by spaces, already
tokenized) and ``labels`` (one label per word piece, the same count); ``label_vocab_file`` is the
``label2id.json`` written beside them (``[PAD]``, ``B``, ``I``, ``O``, ``X``, ``[CLS]``, ``[SEP]`` for BC5CDR).
Each row becomes ``input_ids`` (vocab ids, out-of-vocabulary ``[UNK]``), ``attention_mask``, ``labels`` (label
ids), ``token_type_ids`` (zeros) and ``loss_mask`` (the attention mask, or all ones with the model's
``include_padding_in_loss``), padded to ``max_sequence_length`` with the ``[PAD]`` id unless a pad id is given.
Rows stream in meta.dat order (shuffled within ``shuffle_buffer`` rows with ``shuffle``), as the pretraining CSV.

A missing file or column, a row longer than ``max_sequence_length``, a label count unlike the token count or a
label not in label2id.json is a DataError naming the file and line.
"""

from __future__ import annotations

import json
import os
import random
from typing import Optional, Union

import numpy as np
from torch.utils.data import DataLoader

from cs_run.data.processors.bert import ShardedRowsDataset, build_vocab, read_meta
from cs_run.data.readers.meta_dat import buffered_csv_rows, whole_batches
from cs_run.errors import DataError
from cs_run.registry import register_data_processor

__all__ = ["BertTokenClassifierDataset", "build_dataloader", "read_label_map"]


def read_label_map(label_vocab_file: str) -> dict:
    """label2id.json: label -> id."""
    try:
        with open(label_vocab_file, encoding="utf-8") as f:
            label_map = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"label_vocab_file: {label_vocab_file} is not a readable label2id.json ({e}); give the one "
                        "the NER preprocessing wrote beside the CSV files") from None
    if not isinstance(label_map, dict) or not all(isinstance(v, int) for v in label_map.values()):
        raise DataError(f"label_vocab_file: {label_vocab_file} must map each label to an integer id")
    return label_map



def _check_header(path: str, columns: list) -> None:
    missing = [c for c in ("tokens", "labels") if c not in columns]
    if missing:
        raise DataError(f"{path}:1: no column {missing[0]!r}; the NER CSV has 'tokens' and 'labels'")


class BertTokenClassifierDataset(ShardedRowsDataset):
    """Batches (dicts of int32 tensors) of the NER CSV rows; ``len(self)`` whole batches a pass (``drop_last``)."""

    def __init__(self, *, data_dir, batch_size: int, vocab_file: str, label_vocab_file: str, do_lower: bool,
                 max_sequence_length: int, include_padding_in_loss: bool, pad_ids: tuple, shuffle: bool,
                 shuffle_seed: Optional[int], shuffle_buffer: Optional[int], drop_last: bool) -> None:
        super().__init__()
        self.files, self.num_examples = whole_batches(read_meta(data_dir), batch_size, data_dir)
        case = str.lower if do_lower else str
        self.vocab, _, self.oov_id = build_vocab(vocab_file, do_lower, case("[UNK]"))
        self.label_map = read_label_map(label_vocab_file)
        pad_id = self.vocab.get(case("[PAD]"), self.oov_id)
        self.labels_pad_id, self.input_pad_id, self.attn_mask_pad_id = (pad_id if p is None else int(p)
                                                                         for p in pad_ids)
        self.do_lower, self.msl, self.include_padding_in_loss = do_lower, max_sequence_length, include_padding_in_loss
        self.batch_size, self.drop_last = batch_size, drop_last
        self.shuffle, self.shuffle_seed = shuffle, shuffle_seed
        self.shuffle_buffer = 10 * batch_size if shuffle_buffer is None else shuffle_buffer

    def _rows(self, files: list, rng: random.Random):
        return buffered_csv_rows(files, rng, shuffle=self.shuffle, buffer_size=self.shuffle_buffer,
                                 shuffle_files=False, check_header=_check_header)

    def features(self, path: str, line: int, row: dict) -> dict:
        """create_ner_features of one CSV row."""
        tokens = (row["tokens"] or "").split()
        tokens = [t.lower() for t in tokens] if self.do_lower else tokens
        labels = (row["labels"] or "").split()
        if len(labels) != len(tokens):
            raise DataError(f"{path}:{line}: {len(tokens)} tokens but {len(labels)} labels; each word piece needs "
                            "one label")
        if len(tokens) > self.msl:
            raise DataError(f"{path}:{line}: {len(tokens)} tokens exceed max_sequence_length ({self.msl}); "
                            "preprocess with this max_seq_length")
        unknown = [label for label in labels if label not in self.label_map]
        if unknown:
            raise DataError(f"{path}:{line}: label {unknown[0]!r} is not in label_vocab_file "
                            f"({', '.join(self.label_map)})")
        n = len(tokens)
        input_ids = np.full((self.msl,), self.input_pad_id, np.int32)
        input_ids[:n] = [self.vocab.get(t, self.oov_id) for t in tokens]
        attention_mask = np.full((self.msl,), self.attn_mask_pad_id, np.int32)
        attention_mask[:n] = 1
        label_ids = np.full((self.msl,), self.labels_pad_id, np.int32)
        label_ids[:n] = [self.label_map[label] for label in labels]
        loss_mask = np.ones((self.msl,), np.int32) if self.include_padding_in_loss else attention_mask.copy()
        return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask,
                "token_type_ids": np.zeros((self.msl,), np.int32), "labels": label_ids}


@register_data_processor("BertTokenClassifierDataProcessor")
def build_dataloader(split: str, data_processor: str = "BertTokenClassifierDataProcessor",
                     data_dir: Union[str, list, None] = None, batch_size: int = 1, vocab_file: Optional[str] = None,
                     label_vocab_file: Optional[str] = None, mask_whole_word: bool = False, do_lower: bool = False,
                     max_sequence_length: Optional[int] = None, include_padding_in_loss: bool = False,
                     labels_pad_id: Optional[int] = None, input_pad_id: Optional[int] = None,
                     attn_mask_pad_id: Optional[int] = None, shuffle: bool = True, shuffle_seed: Optional[int] = None,
                     shuffle_buffer: Optional[int] = None, num_workers: int = 0, prefetch_factor: Optional[int] = 10,
                     persistent_workers: bool = True, drop_last: bool = True) -> DataLoader:
    """Data function of ``model.name: bert/token_classifier`` (BertTokenClassifierDataProcessorConfig's keys and
    defaults). ``label_vocab_file`` and ``include_padding_in_loss`` are the model's (the vendor's post_init reads
    them from model:); ``mask_whole_word`` is accepted and unused, as there."""
    for key, value in (("data_dir", data_dir), ("vocab_file", vocab_file), ("label_vocab_file", label_vocab_file),
                       ("max_sequence_length", max_sequence_length)):
        if value is None:
            raise ValueError(f"{key}: required by BertTokenClassifierDataProcessor")
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    for key, value in (("labels_pad_id", labels_pad_id), ("input_pad_id", input_pad_id),
                       ("attn_mask_pad_id", attn_mask_pad_id)):
        if value is not None and int(value) < 0:
            raise ValueError(f"{key}: must be >= 0, got {value}")
    dataset = BertTokenClassifierDataset(
        data_dir=data_dir, batch_size=batch_size, vocab_file=os.path.expandvars(vocab_file),
        label_vocab_file=os.path.expandvars(label_vocab_file), do_lower=do_lower,
        max_sequence_length=max_sequence_length, include_padding_in_loss=include_padding_in_loss,
        pad_ids=(labels_pad_id, input_pad_id, attn_mask_pad_id), shuffle=shuffle, shuffle_seed=shuffle_seed,
        shuffle_buffer=shuffle_buffer, drop_last=drop_last)
    workers = {"num_workers": num_workers}
    if num_workers:
        workers.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers)
    return DataLoader(dataset, batch_size=None, **workers)
