"""GLUE fine-tuning data for ``bert/classifier``: the Model Zoo's SST2DataProcessor and MNLIDataProcessor
(Release 2.10 ``data/nlp/bert/BertClassifierDataProcessor.py``), reading the GLUE folders as the vendor does.

Layout (BertClassifierDataProcessor.py, SST2Dataset.read_tsv and MNLIDataset.read_tsv): ``data_dir`` holds
tab-separated files with a header row, read without quoting. SST-2: ``train.tsv`` (training) or ``dev.tsv``
(eval), columns ``sentence`` and ``label`` (an integer). MNLI: ``train.tsv``, or ``dev_matched.tsv`` then
``dev_mismatched.tsv`` for eval, columns ``sentence1``, ``sentence2`` and ``gold_label`` (entailment, neutral,
contradiction: 0, 1, 2); eval samples carry ``is_matched`` / ``is_mismatched``.

Each text is word-pieced (:class:`~cs_run.data.processors._wordpiece.FullTokenizer`), a pair cut one token at a
time from the longer side to fit ``max_sequence_length`` with ``[CLS] a [SEP] b [SEP]``, padded with
``input_pad_id``. ``token_type_ids`` are 1 on positions ``len(a) .. len(a) + len(b) - 1``: the vendor's
``encode_sequence`` counts from 0, not after ``[CLS] a [SEP]``, and this keeps its rule so a model fine-tuned
there sees the same inputs here. Batches are whole (``drop_last``); shuffling draws from ``shuffle_seed``.

A missing file or column, or a label that is not one of the task's, is a DataError naming file, line and fix.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from cs_run.data.processors._wordpiece import FullTokenizer
from cs_run.data.processors.bert import build_vocab
from cs_run.errors import DataError
from cs_run.registry import register_data_processor

__all__ = ["ClassifierDataset", "build_dataloader", "MNLI_LABEL_IDX", "DATA_PROCESSORS"]

DATA_PROCESSORS = ("SST2DataProcessor", "MNLIDataProcessor")
MNLI_LABEL_IDX = {"entailment": 0, "neutral": 1, "contradiction": 2}
_COLUMNS = {"SST2DataProcessor": ("sentence", "label"),
            "MNLIDataProcessor": ("sentence1", "sentence2", "gold_label")}


def _files(task: str, is_training: bool) -> list[str]:
    if task == "SST2DataProcessor":
        return ["train.tsv" if is_training else "dev.tsv"]
    return ["train.tsv"] if is_training else ["dev_matched.tsv", "dev_mismatched.tsv"]


def read_rows(task: str, data_dir: str, is_training: bool) -> list[tuple]:
    """(text a, text b or None, label id, is_matched) of every row of the task's split files."""
    rows = []
    for name in _files(task, is_training):
        path = Path(data_dir) / name
        if not path.is_file():
            raise DataError(f"{path}: not found; data_dir must be the GLUE {task[:-13]} folder "
                            f"({', '.join(_files(task, is_training))} for is_training: {is_training})")
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            missing = [c for c in _COLUMNS[task] if c not in (reader.fieldnames or [])]
            if missing:
                raise DataError(f"{path}:1: no column {missing[0]!r} in the header; the GLUE file has "
                                f"{', '.join(_COLUMNS[task])} (tab-separated)")
            for line, row in enumerate(reader, 2):
                rows.append(_row(task, row, f"{path}:{line}", 0 if "mismatched" in name else 1))
    return rows


def _row(task: str, row: dict, where: str, is_matched: int) -> tuple:
    if task == "SST2DataProcessor":
        text, label = row["sentence"], row["label"]
        if text is None or label is None or not label.strip().lstrip("-").isdigit():
            raise DataError(f"{where}: column 'label' must be an integer class id, got {label!r}")
        return text, None, int(label), is_matched
    a, b, label = row["sentence1"], row["sentence2"], row["gold_label"]
    if label not in MNLI_LABEL_IDX or a is None or b is None:
        raise DataError(f"{where}: column 'gold_label' must be one of {', '.join(MNLI_LABEL_IDX)}, got {label!r}")
    return a, b, MNLI_LABEL_IDX[label], is_matched


class ClassifierDataset(Dataset):
    """Samples (dicts of int32 arrays) of one GLUE task's split, encoded as ``encode_sequence`` does."""

    def __init__(self, task: str, data_dir: str, is_training: bool, vocab_file: str, do_lower: bool,
                 max_sequence_length: int, pad_ids: tuple[int, int]) -> None:
        case = str.lower if do_lower else str
        vocab, _, self.oov_id = build_vocab(vocab_file, do_lower, case("[UNK]"))
        self.vocab = vocab
        self.tokenizer = FullTokenizer(vocab, do_lower, case("[UNK]"))
        self.cls_id = vocab.get(case("[CLS]"), self.oov_id)
        self.sep_id = vocab.get(case("[SEP]"), self.oov_id)
        self.rows = read_rows(task, data_dir, is_training)
        self.mnli_eval = task == "MNLIDataProcessor" and not is_training
        self.msl = max_sequence_length
        self.input_pad_id, self.attn_mask_pad_id = pad_ids

    def __len__(self) -> int:
        return len(self.rows)

    def _ids(self, tokens: list) -> list:
        return [self.vocab.get(t, self.oov_id) for t in tokens]

    def encode(self, text1: str, text2: Optional[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(input_ids, token_type_ids, attention_mask), each ``max_sequence_length`` long."""
        budget = self.msl - (3 if text2 else 2)
        a = self.tokenizer.tokenize(text1.strip())
        b = self.tokenizer.tokenize(text2.strip()) if text2 else []
        if text2:
            while len(a) + len(b) > budget:
                (a if len(a) > len(b) else b).pop()
        else:
            a = a[:budget]
        ids = [self.cls_id] + self._ids(a) + [self.sep_id] + (self._ids(b) + [self.sep_id] if text2 else [])
        input_ids = np.full((self.msl,), self.input_pad_id, np.int32)
        input_ids[:len(ids)] = ids
        attention_mask = np.full((self.msl,), self.attn_mask_pad_id, np.int32)
        attention_mask[:len(ids)] = 1
        segment_ids = np.zeros((self.msl,), np.int32)
        if text2:
            segment_ids[len(a):len(a) + len(b)] = 1  # the vendor's offsets (see the module docstring)
        return input_ids, segment_ids, attention_mask

    def __getitem__(self, index: int) -> dict:
        text1, text2, label, is_matched = self.rows[index]
        input_ids, segment_ids, attention_mask = self.encode(text1, text2)
        out = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": segment_ids,
               "labels": np.array(label, np.int32)}
        if self.mnli_eval:
            out["is_matched"] = np.array(is_matched, np.int32)
            out["is_mismatched"] = np.array(1 - is_matched, np.int32)
        return {k: torch.from_numpy(v) for k, v in out.items()}


@register_data_processor(*DATA_PROCESSORS)
def build_dataloader(split: str, data_processor: str = "SST2DataProcessor", is_training: Optional[bool] = None,
                     data_dir: Union[str, list, None] = None, batch_size: int = 1, vocab_file: Optional[str] = None,
                     do_lower: bool = False, max_sequence_length: Optional[int] = None, labels_pad_id: int = 0,
                     input_pad_id: int = 0, attn_mask_pad_id: int = 0, shuffle: bool = True,
                     shuffle_seed: Optional[int] = None, num_workers: int = 0, prefetch_factor: Optional[int] = 10,
                     persistent_workers: bool = True, drop_last: bool = True) -> DataLoader:
    """Data function of ``model.name: bert/classifier``: the split's DataLoader of SST-2 or MNLI (the vendor's
    ClassifierDataProcessorConfig keys and defaults). ``is_training`` picks the files; unset, the split does."""
    if data_processor not in DATA_PROCESSORS:
        raise ValueError(f"data_processor: {data_processor!r} is not a GLUE classifier processor; expected one of "
                         f"{', '.join(DATA_PROCESSORS)}")
    for key, value in (("data_dir", data_dir), ("vocab_file", vocab_file),
                       ("max_sequence_length", max_sequence_length)):
        if value is None:
            raise ValueError(f"{key}: required by {data_processor}")
    if isinstance(data_dir, list):
        if len(data_dir) != 1:
            raise ValueError(f"data_dir: one GLUE folder is read here, got {len(data_dir)}")
        data_dir = data_dir[0]
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    if max_sequence_length < (3 if data_processor == "MNLIDataProcessor" else 2):
        raise ValueError(f"max_sequence_length: {max_sequence_length} leaves no room for [CLS] and [SEP]")
    training = split == "train" if is_training is None else is_training
    dataset = ClassifierDataset(data_processor, os.path.expandvars(str(data_dir)), training,
                                os.path.expandvars(vocab_file), do_lower, max_sequence_length,
                                (input_pad_id, attn_mask_pad_id))
    if len(dataset) < batch_size:
        raise DataError(f"data_dir {data_dir}: {len(dataset)} samples, fewer than one batch of {batch_size}; "
                        "lower batch_size")
    workers = {"num_workers": num_workers}
    if num_workers:
        workers.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers)
    generator = torch.Generator().manual_seed(shuffle_seed) if shuffle and shuffle_seed is not None else None
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, generator=generator,
                      **workers)
