"""BERT pretraining data: the Model Zoo's BertCSVDynamicMaskDataProcessor and BertHDF5DataProcessor
(Release 2.10 ``data/nlp/bert/``), reading the layouts its own preprocessing writes.

CSV (``data_preparation/nlp/bert/create_csv.py`` lines 224-273 and 320-326, ``create_csv_mlm_only.py`` lines
246-253 and 342): ``data_dir`` holds ``meta.dat`` (one ``<csv file> <rows>`` line per file) and CSV files with a
``tokens`` column (a Python list literal of word pieces) and, for NSP, ``segment_ids`` (``[0, 0, 1, ...]``) and
``is_random_next``. Masks are drawn on the fly (``bert_utils.create_masked_lm_predictions``): 15% of the
tokens (``masked_lm_prob``, at most ``max_predictions_per_seq``, special tokens never), of which 80% become
``[MASK]``, 10% a random token of the vocabulary less the special tokens, 10% stay. With
``gather_mlm_labels`` (the default) labels, positions and mask are ``max_predictions_per_seq`` long.

HDF5 (``data/common/h5_map_dataset.py`` MLMHDF5Dataset, written by a preprocessing config with
``training_objective: mlm``, the esm2 config's): ``data_dir`` holds ``data_params.json`` and ``*.h5`` files, each
with ``data`` ``[n, 2, msl]`` (input_ids, attention_mask) and ``labels`` ``[n, 1, msl]`` (labels), or
``[n, 3, max_pred]`` (labels, masked_lm_positions, masked_lm_mask) when ``data_params.json``'s
``dataset.mlm_with_gather`` is true with ``training_objective: mlm``. The ``bert_pretraining`` config's output
(``data`` [n, 3, msl] of input_ids, attention_mask, token_type_ids; no ``labels``) is no such shard: the
vendor's reader needs ``labels``, and it is refused by name.

A file that is missing or malformed is a DataError naming the file (and row) and what to fix.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import random
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from cs_run.data.readers.meta_dat import batches, buffered_csv_rows, whole_batches
from cs_run.data.readers.meta_dat import read_meta as _read_meta
from cs_run.errors import DataError
from cs_run.registry import register_data_processor

logger = logging.getLogger(__name__)

__all__ = ["BertCSVDynamicMaskDataset", "BertHDF5Dataset", "build_dataloader", "read_meta", "build_vocab",
           "create_masked_lm_predictions", "ShardedRowsDataset", "stack_features", "DATA_PROCESSORS"]

DATA_PROCESSORS = ("BertCSVDynamicMaskDataProcessor", "BertHDF5DataProcessor")


def read_meta(data_dir: Union[str, list]) -> list[tuple[str, int]]:
    """(CSV path, rows) of every line of each folder's ``meta.dat`` (bert_utils.get_meta_data)."""
    return _read_meta(data_dir, form="<csv file> <number of rows>",
                      written_by="the Model Zoo's BERT CSV preprocessing (create_csv.py / create_csv_mlm_only.py)")


def build_vocab(vocab_file: str, do_lower: bool, oov_token: str) -> tuple[dict, int, int]:
    """(token -> id, vocabulary size, OOV id) of a one-token-per-line vocab file (bert_utils.build_vocab)."""
    if not os.path.isfile(vocab_file):
        raise DataError(f"vocab_file: {vocab_file} not found; give the word-piece vocabulary the CSV was made with")
    words = [w.strip() for w in Path(vocab_file).read_text(encoding="utf-8", errors="ignore").splitlines(True)]
    if do_lower:
        words = [w.lower() for w in words]
    if oov_token not in words:
        raise DataError(f"vocab_file: {vocab_file} has no out-of-vocabulary token {oov_token!r} (oov_token)")
    vocab: dict = {}
    for i, w in enumerate(words):
        vocab[w] = i  # a repeated word keeps its last id, as the vendor's dict update does
    return vocab, len(words), words.index(oov_token)


def stack_features(batch: list[dict]) -> dict[str, torch.Tensor]:
    """One batch of rows' numpy features as tensors: each key's arrays stacked on a new first axis."""
    return {k: torch.from_numpy(np.stack([b[k] for b in batch])) for k in batch[0]}


class ShardedRowsDataset(IterableDataset):
    """The batches of a meta.dat CSV folder's rows as the vendor's summarization and NER processors read it
    (bert_utils.shard_and_shuffle_data): worker w of W reads files w, w + W, ... with seed shuffle_seed + w + 1,
    the main process all of them with shuffle_seed itself (BertCSVDynamicMaskDataset's _worker_init_fn adds 1
    there too), and each row's :meth:`features` are stacked ``batch_size`` at a time.

    A subclass sets ``files``, ``num_examples``, ``batch_size``, ``drop_last`` and ``shuffle_seed`` and defines
    ``_rows(files, rng)`` (``(path, line, row)`` of those files) and ``features(path, line, row)``.
    """

    files: list
    num_examples: int
    batch_size: int
    drop_last: bool
    shuffle_seed: Optional[int]

    def __len__(self) -> int:
        return self.num_examples // self.batch_size

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        files, seed = self.files, self.shuffle_seed
        if info is not None:
            files = files[info.id::info.num_workers]
            seed = None if seed is None else seed + info.id + 1
        rows = self._rows(files, random.Random(seed))
        for batch in batches((self.features(*row) for row in rows), self.batch_size, self.drop_last):
            yield stack_features(batch)


def create_masked_lm_predictions(tokens: list, token_ids: list, max_sequence_length: int, mask_token_id: int,
                                 max_predictions_per_seq: int, pad_ids: tuple[int, int, int], vocab_size: int,
                                 masked_lm_prob: float, rng: random.Random, exclude_from_masking: list,
                                 mask_whole_word: bool, replacement_pool: list) -> tuple[np.ndarray, ...]:
    """(input_ids, labels, attention_mask, masked_lm_mask), each ``max_sequence_length`` long, by the vendor's
    draw (bert_utils.create_masked_lm_predictions: the same ``rng`` calls in the same order)."""
    input_pad, attn_pad, labels_pad = pad_ids
    input_ids = np.full((max_sequence_length,), input_pad, dtype=np.int32)
    attention_mask = np.full((max_sequence_length,), attn_pad, dtype=np.int32)
    labels = np.full((max_sequence_length,), labels_pad, dtype=np.int32)
    masked_lm_mask = np.zeros((max_sequence_length,), dtype=np.int32)
    n = len(token_ids)
    input_ids[:n] = token_ids
    attention_mask[:n] = 1
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(n * masked_lm_prob))))
    indices = list(range(n))
    rng.shuffle(indices)
    masked: list[int] = []
    while len(masked) < num_to_predict and indices and len(masked) < max_predictions_per_seq:
        current = indices[0]
        if tokens[current] in exclude_from_masking:
            indices.pop(0)
            continue
        start, end = _whole_word_span(tokens, current) if mask_whole_word else (current, current + 1)
        for index in range(start, end):
            indices.remove(index)
        if len(masked) + end - start > max_predictions_per_seq:
            continue
        masked.extend(range(start, end))
        labels[start:end] = input_ids[start:end]
    for index in masked:
        masked_lm_mask[index] = 1
        draw = rng.random()
        if draw < 0.8:
            input_ids[index] = mask_token_id
        elif draw < 0.9:
            input_ids[index] = rng.choice(replacement_pool)
    return input_ids, labels, attention_mask, masked_lm_mask


def _whole_word_span(tokens: list, start: int) -> tuple[int, int]:
    """The word around ``start``: word pieces ``##...`` continue the one before (bert_utils.get_whole_word_span)."""
    end = len(tokens)
    if start < len(tokens) - 1:
        end = min(start + 1, len(tokens) - 1)
        while tokens[end].startswith("##"):
            end += 1
            if end > len(tokens) - 1:
                break
    while tokens[start].startswith("##") and start > 0:
        start -= 1
    return start, end


class BertCSVDynamicMaskDataset(IterableDataset):
    """Batches (dicts of tensors) of the CSV rows in meta.dat order, shuffled within a buffer of
    ``shuffle_buffer`` rows (and the files' order) when ``shuffle``, masked as :func:`create_masked_lm_predictions`
    draws. One pass yields ``len(self)`` full batches (``drop_last``) or one more, partial."""

    def __init__(self, *, data_dir, batch_size: int, vocab_file: str, max_sequence_length: int,
                 max_predictions_per_seq: int, disable_nsp: bool, masked_lm_prob: float, mask_whole_word: bool,
                 do_lower: bool, oov_token: str, mask_token: str, exclude_from_masking: list, gather_mlm_labels: bool,
                 dynamic_mlm_scale: bool, pad_ids: tuple[int, int, int], segment_pad_id: int, shuffle: bool,
                 shuffle_seed: Optional[int], shuffle_buffer: Optional[int], drop_last: bool) -> None:
        super().__init__()
        self.files, self.num_examples = whole_batches(read_meta(data_dir), batch_size, data_dir)
        self.batch_size, self.drop_last = batch_size, drop_last
        case = str.lower if do_lower else str  # do_lower: the special tokens are lowercased too
        self.vocab, self.vocab_size, self.oov_id = build_vocab(vocab_file, do_lower, case(oov_token))
        self.do_lower = do_lower
        self.exclude = [case(t) for t in exclude_from_masking]
        self.mask_id = self.vocab.get(case(mask_token), self.oov_id)
        excluded_ids = {self.vocab.get(t, self.oov_id) for t in self.exclude}
        self.replacement_pool = sorted(set(range(self.vocab_size)) - excluded_ids)
        self.msl, self.max_pred = max_sequence_length, max_predictions_per_seq
        self.disable_nsp, self.masked_lm_prob, self.mask_whole_word = disable_nsp, masked_lm_prob, mask_whole_word
        self.gather, self.dynamic_mlm_scale = gather_mlm_labels, dynamic_mlm_scale
        self.pad_ids, self.segment_pad_id = pad_ids, segment_pad_id
        self.shuffle, self.shuffle_seed = shuffle, shuffle_seed
        self.shuffle_buffer = 10 * batch_size if shuffle_buffer is None else shuffle_buffer

    def __len__(self) -> int:
        return self.num_examples // self.batch_size

    def _rows(self, rng: random.Random):
        return buffered_csv_rows(self.files, rng, shuffle=self.shuffle, buffer_size=self.shuffle_buffer)

    def _features(self, path: str, line: int, row: dict, rng: random.Random) -> dict:
        try:
            tokens = ast.literal_eval(row["tokens"])
            if not isinstance(tokens, list):
                raise ValueError("not a list")
        except (KeyError, ValueError, SyntaxError, TypeError):
            raise DataError(f"{path}:{line}: column 'tokens' must hold a list of word pieces like "
                            "\"['[CLS]', 'a', '[SEP]']\" (the Model Zoo's create_csv.py writes it)") from None
        tokens = [str(t).lower() for t in tokens] if self.do_lower else [str(t) for t in tokens]
        if self.disable_nsp:
            tokens = tokens[:self.msl]
        elif len(tokens) > self.msl:
            raise DataError(f"{path}:{line}: {len(tokens)} tokens exceed max_sequence_length ({self.msl}); with NSP "
                            "rows are not cut: rewrite the CSV with this max_seq_length")
        ids = [self.vocab.get(t, self.oov_id) for t in tokens]
        input_ids, labels, attention_mask, mlm_mask = create_masked_lm_predictions(
            tokens, ids, self.msl, self.mask_id, self.max_pred, self.pad_ids, self.vocab_size, self.masked_lm_prob,
            rng, self.exclude, self.mask_whole_word, self.replacement_pool)
        out = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.gather:
            positions = np.nonzero(mlm_mask)[0]
            k = len(positions)
            out["labels"] = np.zeros((self.max_pred,), np.int32)
            out["labels"][:k] = labels[positions]
            out["masked_lm_mask"] = np.zeros((self.max_pred,), np.int32)
            out["masked_lm_mask"][:k] = mlm_mask[positions]
            out["masked_lm_positions"] = np.zeros((self.max_pred,), np.int32)
            out["masked_lm_positions"][:k] = positions
        else:
            out["labels"], out["masked_lm_mask"] = labels, mlm_mask
        if not self.disable_nsp:
            try:
                segments = [int(s) for s in row["segment_ids"].strip("[]").split(", ")]
                label = int(row["is_random_next"])
            except (KeyError, ValueError, AttributeError):
                raise DataError(f"{path}:{line}: NSP needs columns 'segment_ids' (like [0, 0, 1]) and "
                                "'is_random_next' (0 or 1); write the CSV with create_csv.py, or set "
                                "model.disable_nsp: true") from None
            token_type_ids = np.full((self.msl,), self.segment_pad_id, np.int32)
            token_type_ids[:len(segments)] = segments[:self.msl]
            out["token_type_ids"] = token_type_ids
            out["next_sentence_label"] = np.array([label], np.int32)
        return out

    def __iter__(self):
        # _worker_init_fn: worker w of W reads files w, w + W, ...; its seed is shuffle_seed + w + 1
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        seed = None if self.shuffle_seed is None else self.shuffle_seed + worker + 1
        rng = random.Random(seed)
        dataset = self
        if workers > 1:
            dataset = object.__new__(type(self))
            dataset.__dict__.update(self.__dict__, files=self.files[worker::workers])
        samples = (self._features(path, line, row, rng) for path, line, row in dataset._rows(rng))
        for batch in batches(samples, self.batch_size, self.drop_last):
            yield self._collate(batch)

    def _collate(self, batch: list) -> dict:
        out = stack_features(batch)
        if self.dynamic_mlm_scale:
            scale = len(batch) / torch.sum(out["masked_lm_mask"])
            out["mlm_loss_scale"] = scale.expand(len(batch), 1)
        return out


class BertHDF5Dataset(Dataset):
    """Samples of the ``bert_pretraining`` HDF5 shards (see the module docstring), read lazily per file."""

    def __init__(self, data_dir: Union[str, list], use_vsl: bool = False) -> None:
        import h5py  # noqa: PLC0415 - heavy optional import, where it is used
        self._h5py = h5py
        folders = data_dir if isinstance(data_dir, list) else [data_dir]
        self.files: list[tuple[str, int]] = []
        self.gather = False
        for folder in folders:
            params_path = Path(folder) / "data_params.json"
            try:
                dataset = json.loads(params_path.read_text()).get("dataset") or {}
            except (OSError, ValueError) as e:
                raise DataError(f"{params_path}: not readable JSON ({e}); data_dir must be a folder written by the "
                                "Model Zoo's bert_pretraining preprocessing") from None
            self.gather |= bool(dataset.get("training_objective") == "mlm" and dataset.get("mlm_with_gather"))
            for path in sorted(Path(folder).glob("*.h5")):
                try:
                    with h5py.File(path, "r") as f:
                        if "labels" not in f and dataset.get("training_objective") == "bert_pretraining":
                            raise DataError(f"{path}: holds bert_pretraining samples (input_ids, attention_mask, "
                                            "token_type_ids; unmasked, no 'labels'), which BertHDF5DataProcessor "
                                            "does not read (nor does the Model Zoo's); preprocess with "
                                            "dataset.training_objective: mlm (and mlm_with_gather: true) for it, "
                                            "or train from CSV with BertCSVDynamicMaskDataProcessor")
                        n = f["data"].shape[0]
                        if f["labels"].shape[0] != n or f["data"].shape[1] < (4 if use_vsl else 2):
                            raise KeyError("shape")
                except (OSError, KeyError):
                    rows = "[n, 4, msl] (input_ids, attention_mask, attention_span, position_ids: use_vsl)" \
                        if use_vsl else "[n, 2, msl]"
                    raise DataError(f"{path}: expected datasets 'data' {rows} and 'labels' [n, 1 or 3, ...] "
                                    "(the Model Zoo's bert_pretraining HDF5 layout)") from None
                self.files.append((str(path), n))
        self.use_vsl = use_vsl
        if not self.files:
            raise DataError(f"data_dir {data_dir}: no *.h5 files")
        self.offsets = np.cumsum([0] + [n for _, n in self.files])
        self._open: dict = {}

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, index: int) -> dict:
        i = int(np.searchsorted(self.offsets, index, side="right") - 1)
        path = self.files[i][0]
        f = self._open.get(path) or self._open.setdefault(path, self._h5py.File(path, "r"))
        j = index - int(self.offsets[i])
        data, labels = f["data"][j], f["labels"][j]
        out = {"input_ids": torch.from_numpy(data[0].astype(np.int32)),
               "attention_mask": torch.from_numpy(data[1].astype(np.int32)),
               "labels": torch.from_numpy(labels[0].astype(np.int32))}
        if self.use_vsl:  # BertHDF5DataProcessor's "attention_span", "position_ids" rows
            out["attention_span"] = torch.from_numpy(data[2].astype(np.int32))
            out["position_ids"] = torch.from_numpy(data[3].astype(np.int32))
        if self.gather:
            out["masked_lm_positions"] = torch.from_numpy(labels[1].astype(np.int32))
            out["masked_lm_mask"] = torch.from_numpy(labels[2].astype(np.int32))
        return out

    def __getstate__(self) -> dict:  # open handles stay in the process that opened them
        return {**self.__dict__, "_open": {}, "_h5py": None}

    def __setstate__(self, state: dict) -> None:
        import h5py  # noqa: PLC0415 - heavy optional import
        self.__dict__.update(state, _h5py=h5py)


@register_data_processor("BertCSVDynamicMaskDataProcessor", "BertHDF5DataProcessor")
def build_dataloader(split: str, data_processor: str = "BertCSVDynamicMaskDataProcessor",
                     data_dir: Union[str, list, None] = None, batch_size: int = 1, vocab_file: Optional[str] = None,
                     max_sequence_length: Optional[int] = None, max_predictions_per_seq: Optional[int] = None,
                     disable_nsp: bool = False, dynamic_mlm_scale: bool = False, buckets: Optional[list] = None,
                     mask_whole_word: bool = False, do_lower: bool = False, oov_token: str = "[UNK]",
                     mask_token: str = "[MASK]", document_separator_token: str = "[SEP]",
                     exclude_from_masking: Optional[list] = None, masked_lm_prob: float = 0.15,
                     gather_mlm_labels: bool = True, labels_pad_id: int = 0, input_pad_id: int = 0,
                     attn_mask_pad_id: int = 0, segment_pad_id: int = 0, shuffle: bool = True,
                     shuffle_seed: Optional[int] = None, shuffle_buffer: Optional[int] = None, num_workers: int = 0,
                     prefetch_factor: Optional[int] = 10, persistent_workers: bool = True, drop_last: bool = True,
                     use_vsl: bool = False, dataset_map_fn: Any = None, vocab_size: Any = None,
                     num_examples: Any = None, steps: Any = None, whole_word_masking: Any = None) -> DataLoader:
    """Data function of ``model.name: bert``: the split's DataLoader of the named Model Zoo data processor (its
    config keys and defaults). ``disable_nsp`` is the model's (the vendor's config reads model.disable_nsp);
    ``vocab_size``, ``num_examples``, ``steps``, ``whole_word_masking`` are deprecated there and unused."""
    if data_processor not in DATA_PROCESSORS:
        raise ValueError(f"data_processor: {data_processor!r} is not a BERT data processor here; expected one of "
                         f"{', '.join(DATA_PROCESSORS)}")
    if data_dir is None:
        raise ValueError("data_dir: required (a folder written by the Model Zoo's BERT preprocessing)")
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    if dataset_map_fn is not None:
        raise ValueError("dataset_map_fn: a Python callable cannot come from a params file here; drop it")
    workers = {"num_workers": num_workers}
    if num_workers:
        workers.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers)
    if data_processor == "BertHDF5DataProcessor":
        dataset = BertHDF5Dataset(data_dir, use_vsl)
        generator = torch.Generator().manual_seed(shuffle_seed) if shuffle and shuffle_seed is not None else None
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, generator=generator,
                          **workers)
    if buckets is not None:
        raise ValueError("buckets: bucketing by length is not supported here; drop it (batches are then in order)")
    for key, value in (("vocab_file", vocab_file), ("max_sequence_length", max_sequence_length),
                       ("max_predictions_per_seq", max_predictions_per_seq)):
        if value is None:
            raise ValueError(f"{key}: required by BertCSVDynamicMaskDataProcessor")
    if not 0.0 < masked_lm_prob <= 1.0:
        raise ValueError(f"masked_lm_prob: must be in (0, 1], got {masked_lm_prob}")
    dataset = BertCSVDynamicMaskDataset(
        data_dir=data_dir, batch_size=batch_size, vocab_file=os.path.expandvars(vocab_file),
        max_sequence_length=max_sequence_length, max_predictions_per_seq=max_predictions_per_seq,
        disable_nsp=disable_nsp, masked_lm_prob=masked_lm_prob, mask_whole_word=mask_whole_word, do_lower=do_lower,
        oov_token=oov_token, mask_token=mask_token,
        exclude_from_masking=exclude_from_masking or ["[CLS]", "[SEP]", "[PAD]", "[MASK]"],
        gather_mlm_labels=gather_mlm_labels, dynamic_mlm_scale=dynamic_mlm_scale,
        pad_ids=(input_pad_id, attn_mask_pad_id, labels_pad_id), segment_pad_id=segment_pad_id, shuffle=shuffle,
        shuffle_seed=shuffle_seed, shuffle_buffer=shuffle_buffer, drop_last=drop_last)
    return DataLoader(dataset, batch_size=None, **workers)
