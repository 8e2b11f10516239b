"""T5 span-corruption data: the Model Zoo's T5DynamicDataProcessor (Release 2.10 ``data/nlp/t5/``), reading
the layout its own preprocessing writes (``data_preparation/nlp/t5/preprocess_external.sh``).

``src_data_dir`` (a folder or a list of them) holds ``meta.dat`` (one ``<text file> <lines>`` line per file) and
text files of whitespace-separated, already tokenized pieces, one document a line; ``src_vocab_file`` is one
piece a line (the pad, end, start and unknown pieces among them). Per document, in the vendor's order
(t5_utils.py): the pieces to ids (unknown ones to ``oov_token``'s id), a random chunk of at most 65536,
split into runs of the raw length whose corruption fills ``src_max_sequence_length``
(``get_raw_sequence_lengths``), shuffled in a buffer when ``shuffle``, then 15% of each run's tokens in
spans of mean length 3 (``random_spans_noise_mask``) replaced by one sentinel per span, counting down from
the last id of the vocabulary plus ``extra_ids``; the target is the spans behind their sentinels and the end
token, the decoder input the start token and the target less its last token. Padded to the two lengths with
the pad id; masks are 1 on the tokens. The RNGs are the vendor's: numpy's ``default_rng`` for the chunks and
spans, ``random.Random`` for the buffer and the files' order, both seeded ``shuffle_seed + worker + 1``.

TransformerDynamicDataProcessor (``data/nlp/transformer/``, ``model.name: transformer``) reads parallel text
the same way, without corruption: see :class:`TransformerDynamicDataset`.

A file that is missing or malformed is a DataError naming the file (and line) and what to fix.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from cs_run.data.readers.meta_dat import batches
from cs_run.data.readers.meta_dat import read_meta as _read_meta
from cs_run.errors import DataError
from cs_run.registry import register_data_processor

__all__ = ["T5DynamicDataset", "TransformerDynamicDataset", "build_dataloader", "random_spans_noise_mask", "noise_span_to_unique_sentinel",
           "construct_denoising_objective", "raw_sequence_lengths", "read_meta"]


def read_meta(data_dir: Union[str, list], pairs: bool = False) -> list[tuple[Any, int]]:
    """(text file, lines) of every line of each folder's ``meta.dat``, in order; with ``pairs`` (the
    Transformer's parallel text) ((source file, target file), lines)."""
    form = "<source file> <target file> <number of lines>" if pairs else "<text file> <number of lines>"
    return _read_meta(data_dir, form=form, key="src_data_dir", columns=3 if pairs else 2,
                      written_by="the Model Zoo's T5 preprocessing (preprocess_external.sh)")


def _vocab(vocab_file: str, special: dict[str, str]) -> tuple[dict[str, int], int, int]:
    """(piece -> id, vocabulary size, OOV id) of a one-piece-per-line file (bert_utils.build_vocab): a repeated
    piece keeps its last id."""
    if not os.path.isfile(vocab_file):
        raise DataError(f"src_vocab_file: {vocab_file} not found; give the vocabulary the text was tokenized with")
    words = [w.strip() for w in Path(vocab_file).read_text(encoding="utf-8", errors="ignore").splitlines(True)]
    for key, token in special.items():
        if token not in words:
            raise DataError(f"src_vocab_file: {vocab_file} has no {token!r} ({key}); name a piece it has")
    return {w: i for i, w in enumerate(words)}, len(words), words.index(special["oov_token"])


def raw_sequence_lengths(max_sequence_length: int, corruption_prob: float = 0.15,
                         mean_span_len: int = 3) -> tuple[int, int]:
    """(raw tokens per run, target length) whose corruption makes an input of ``max_sequence_length``
    (t5_utils.get_raw_sequence_lengths): the input holds the kept tokens, a sentinel per span and one more."""
    def lengths(raw: int) -> tuple[int, int]:
        noise = int(round(raw * corruption_prob))
        spans = int(round(noise / mean_span_len))
        return raw - noise + spans + 1, noise + spans + 1
    raw = max_sequence_length
    while lengths(raw)[0] < max_sequence_length:
        raw += 1
    return raw, lengths(raw)[1]


def _segment_lengths(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """``num_items`` split into ``num_segments`` non-empty runs at random (one shuffle of the run starts)."""
    first = np.arange(num_items - 1) < num_segments - 1
    rng.shuffle(first)
    segment = np.cumsum(np.pad(first, [[1, 0]]))
    return np.bincount(segment, minlength=num_segments).astype(np.int32)


def random_spans_noise_mask(length: int, rng: np.random.Generator, noise_density: float = 0.15,
                            mean_noise_span_length: float = 3.0) -> np.ndarray:
    """Which of ``length`` tokens are noise: round(15%) of them (at least 1, at most length - 1) in
    round(noise / 3) spans, interleaved with as many kept runs, the first run kept."""
    original = length
    length = max(length, 2)
    noise = min(max(round(length * noise_density), 1), length - 1)
    spans = max(round(noise / mean_noise_span_length), 1)
    noise_lengths = _segment_lengths(noise, spans, rng)
    kept_lengths = _segment_lengths(length - noise, spans, rng)
    starts = np.cumsum(np.stack([kept_lengths, noise_lengths], axis=1).reshape(-1))[:-1]
    span_number = np.cumsum(np.bincount(starts, minlength=length)[:length])
    return (span_number % 2 == 1)[:original]


def noise_span_to_unique_sentinel(tokens: np.ndarray, noise_mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """Each noise span's first token replaced by a sentinel (vocab_size - 1, then - 2, ...), the rest dropped."""
    previous = np.pad(noise_mask[:-1], [[1, 0]])
    first = noise_mask & ~previous
    sentinel = vocab_size - np.cumsum(first)
    return np.where(first, sentinel, tokens)[~(noise_mask & previous)]


def construct_denoising_objective(tokens: np.ndarray, vocab_size: int, sos_token: int, eos_token: int,
                                  rng: np.random.Generator) -> dict[str, np.ndarray]:
    """input_ids (kept tokens, a sentinel per span), labels (the spans behind their sentinels, then eos),
    decoder_input_ids (sos, then the labels less eos)."""
    noise = random_spans_noise_mask(len(tokens), rng)
    inputs = noise_span_to_unique_sentinel(tokens, noise, vocab_size)
    targets = noise_span_to_unique_sentinel(tokens, ~noise, vocab_size)
    return {"input_ids": inputs, "decoder_input_ids": np.concatenate(([sos_token], targets)),
            "labels": np.concatenate((targets, [eos_token]))}


def _pad(features: dict, src_len: int, tgt_len: int, input_pad: int, labels_pad: int) -> dict[str, np.ndarray]:
    """pad_t5_input_features: every row to its length; the masks cover the tokens."""
    out = {}
    for key, length, pad in (("input_ids", src_len, input_pad), ("decoder_input_ids", tgt_len, input_pad),
                             ("labels", tgt_len, labels_pad)):
        row = np.full((length,), pad, dtype=np.int32)
        row[:len(features[key])] = features[key]
        out[key] = row
    for key, ids, length in (("attention_mask", "input_ids", src_len),
                             ("decoder_attention_mask", "decoder_input_ids", tgt_len)):
        row = np.zeros((length,), dtype=np.int32)
        row[:len(features[ids])] = 1
        out[key] = row
    out["decoder_input_length"] = np.array([len(features["decoder_input_ids"])])
    return out


def _buffer_shuffle(items: Iterator, size: int, rng: random.Random) -> Iterator:
    """t5_utils.shuffle: a reservoir of ``size``; each new item takes a random slot's place, the rest shuffled."""
    buffer: list = []
    for x in items:
        if len(buffer) < size:
            buffer.append(x)
        else:
            i = rng.randrange(size)
            yield buffer[i]
            buffer[i] = x
    rng.shuffle(buffer)
    yield from buffer


class T5DynamicDataset(IterableDataset):
    """Batches (dicts of tensors) of span-corrupted runs of the text files, as the module docstring says;
    one pass ends when the files do (whole batches only with ``drop_last``)."""

    pairs = False  # meta.dat's lines name one text file

    def __init__(self, *, src_data_dir, src_vocab_file: str, batch_size: int, src_max_sequence_length: int,
                 tgt_max_sequence_length: int, extra_ids: int, special: dict[str, str], labels_pad_id: Optional[int],
                 input_pad_id: Optional[int], shuffle: bool, shuffle_seed: Optional[int], shuffle_buffer: int,
                 drop_last: bool, dynamic_loss_weight: bool) -> None:
        super().__init__()
        files = read_meta(src_data_dir, pairs=self.pairs)
        total = sum(n for _, n in files)
        if total < batch_size:
            raise DataError(f"src_data_dir {src_data_dir}: {total} lines in meta.dat, fewer than one batch of "
                            f"{batch_size}; lower batch_size or add data")
        self.files, left = [], (total // batch_size) * batch_size  # get_data_for_task: whole batches, one task
        for path, n in files:
            if left <= 0:
                break
            self.files.append((path, min(n, left)))
            left -= n
        self.vocab, size, self.oov_id = _vocab(src_vocab_file, special)
        self.vocab_size = size + extra_ids
        ids = {k: self.vocab[v] for k, v in special.items()}
        self.sos, self.eos = ids["sos_token"], ids["eos_token"]
        self.input_pad = ids["pad_token"] if input_pad_id is None else int(input_pad_id)
        self.labels_pad = ids["pad_token"] if labels_pad_id is None else int(labels_pad_id)
        self.src_len, self.tgt_len = src_max_sequence_length, tgt_max_sequence_length
        self.raw_len, self.target_len = raw_sequence_lengths(src_max_sequence_length)
        self._check_lengths()
        self.batch_size, self.drop_last = batch_size, drop_last
        self.shuffle, self.shuffle_seed, self.shuffle_buffer = shuffle, shuffle_seed, shuffle_buffer
        self.dynamic_loss_weight = dynamic_loss_weight

    def _check_lengths(self) -> None:
        if self.target_len > self.tgt_len:
            raise DataError(f"tgt_max_sequence_length: {self.tgt_len} is shorter than the targets "
                            f"src_max_sequence_length {self.src_len} makes ({self.target_len}); raise it")

    def _lines(self, files: list) -> Iterator[tuple[str, int, str]]:
        for path, count in files:
            try:
                with open(path, newline="", encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f):
                        if n >= count:
                            break
                        yield path, n + 1, line.replace("\0", "")
            except OSError as e:
                raise DataError(f"{path}: cannot read ({e.strerror or e}); meta.dat names it") from None

    def _samples(self, np_rng: np.random.Generator, rng: random.Random, files: list) -> Iterator[dict]:
        def runs() -> Iterator[np.ndarray]:
            for _, _, line in self._lines(files):
                tokens = [self.vocab.get(t, self.oov_id) for t in line.split()]
                segments = math.ceil(len(tokens) / 65536)  # select_random_chunk
                if segments:
                    start = 65536 * int(np_rng.uniform(0, segments - 1e-5))
                    tokens = tokens[start:start + 65536]
                for i in range(0, len(tokens), self.raw_len):
                    yield np.asarray(tokens[i:i + self.raw_len])
        items = _buffer_shuffle(runs(), self.shuffle_buffer, rng) if self.shuffle else runs()
        for run in items:
            features = construct_denoising_objective(run, self.vocab_size, self.sos, self.eos, np_rng)
            yield _pad(features, self.src_len, self.tgt_len, self.input_pad, self.labels_pad)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        seed = None if self.shuffle_seed is None else self.shuffle_seed + worker + 1
        rng, np_rng = random.Random(seed), np.random.default_rng(seed)
        files = self.files[worker::workers]
        if self.shuffle:
            rng.shuffle(files)
        for batch in batches(self._samples(np_rng, rng, files), self.batch_size, self.drop_last):
            yield self._collate(batch)

    def _collate(self, batch: list) -> dict[str, torch.Tensor]:
        out = default_collate(batch)
        if self.dynamic_loss_weight:
            out["loss_weight"] = (len(batch) / out["decoder_attention_mask"].sum()).expand(len(batch), 1)
        return out


class TransformerDynamicDataset(T5DynamicDataset):
    """TransformerDynamicDataProcessor: parallel text, line n of the source file with line n of the target
    (meta.dat: ``<source> <target> <lines>``), in chunks of ``shuffle_buffer`` pairs shuffled whole when
    ``shuffle``; a pair is kept when both sides are non-empty and shorter than their maximum lengths
    (t5_utils.create_transformer_input_features): input the source ids, labels the target then eos,
    decoder input sos then the target."""

    pairs = True

    def _lines(self, files: list) -> Iterator[tuple[str, int, tuple[str, str]]]:
        for (src, tgt), count in files:
            try:
                with open(src, newline="", encoding="utf-8", errors="replace") as fs, \
                        open(tgt, newline="", encoding="utf-8", errors="replace") as ft:
                    for n, pair in enumerate(zip(fs, ft)):
                        if n >= count:
                            break
                        yield src, n + 1, pair
            except OSError as e:
                raise DataError(f"{e.filename or src}: cannot read ({e.strerror or e}); meta.dat names it") from None

    def _samples(self, np_rng: np.random.Generator, rng: random.Random, files: list) -> Iterator[dict]:
        def chunks() -> Iterator[tuple[str, str]]:
            buffer: list = []
            for _, _, pair in self._lines(files):
                buffer.append(pair)
                if len(buffer) == self.shuffle_buffer:
                    if self.shuffle:
                        rng.shuffle(buffer)
                    yield from buffer
                    buffer = []
            if self.shuffle:
                rng.shuffle(buffer)
            yield from buffer
        for src_line, tgt_line in chunks():
            src = [self.vocab.get(t, self.oov_id) for t in src_line.split()]
            tgt = [self.vocab.get(t, self.oov_id) for t in tgt_line.split()]
            if 0 < len(src) < self.src_len and 0 < len(tgt) < self.tgt_len:
                features = {"input_ids": src, "labels": tgt + [self.eos], "decoder_input_ids": [self.sos] + tgt}
                yield _pad(features, self.src_len, self.tgt_len, self.input_pad, self.labels_pad)

    def _check_lengths(self) -> None:
        """No span corruption: the targets are the text's own."""


@register_data_processor("T5DynamicDataProcessor", "TransformerDynamicDataProcessor")
def build_dataloader(split: str, data_processor: str = "T5DynamicDataProcessor",
                     src_vocab_file: Optional[str] = None, src_data_dir: Union[str, list, None] = None,
                     batch_size: int = 1, shuffle: bool = True, shuffle_seed: Optional[int] = None,
                     shuffle_buffer: Optional[int] = None, extra_ids: int = 0,
                     src_max_sequence_length: Optional[int] = None, tgt_max_sequence_length: Optional[int] = None,
                     num_workers: int = 0, drop_last: bool = True, prefetch_factor: Optional[int] = 10,
                     persistent_workers: bool = True, do_lower: bool = False, buckets: Optional[list] = None,
                     dynamic_loss_weight: bool = False, pack_sequences: bool = False,
                     num_documents_to_concatenate: int = 128, oov_token: str = "<unk>", sos_token: str = "<s>",
                     eos_token: str = "</s>", pad_token: str = "<pad>", labels_pad_id: Optional[int] = None,
                     input_pad_id: Optional[int] = None, vocab_size: Any = None, tgt_vocab_file: Any = None,
                     tgt_data_dir: Any = None) -> DataLoader:
    """Data function of ``model.name: t5`` and ``transformer``: the split's DataLoader of T5DynamicDataProcessor
    or TransformerDynamicDataProcessor (their config keys and defaults). ``do_lower`` lowercases the special
    tokens only, as the vendor's post_init does; ``vocab_size``, ``tgt_vocab_file``, ``tgt_data_dir`` are deprecated there and unused."""
    if data_processor not in ("T5DynamicDataProcessor", "TransformerDynamicDataProcessor"):
        raise ValueError(f"data_processor: {data_processor!r} is not T5DynamicDataProcessor or "
                         "TransformerDynamicDataProcessor")
    for key, value in (("src_vocab_file", src_vocab_file), ("src_data_dir", src_data_dir),
                       ("src_max_sequence_length", src_max_sequence_length),
                       ("tgt_max_sequence_length", tgt_max_sequence_length)):
        if value is None:
            raise ValueError(f"{key}: required by {data_processor}")
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    if src_max_sequence_length < 2 or tgt_max_sequence_length < 2:
        raise ValueError("src_max_sequence_length / tgt_max_sequence_length: must be >= 2")
    for key, value in (("buckets", buckets), ("pack_sequences", pack_sequences)):
        if value:
            raise ValueError(f"{key}: {value!r} is not supported by cs-run's T5DynamicDataProcessor; drop it")
    special = {"oov_token": oov_token, "sos_token": sos_token, "eos_token": eos_token, "pad_token": pad_token}
    if do_lower:
        special = {k: v.lower() for k, v in special.items()}
    cls = TransformerDynamicDataset if data_processor == "TransformerDynamicDataProcessor" else T5DynamicDataset
    dataset = cls(
        src_data_dir=src_data_dir, src_vocab_file=os.path.expandvars(src_vocab_file), batch_size=batch_size,
        src_max_sequence_length=src_max_sequence_length, tgt_max_sequence_length=tgt_max_sequence_length,
        extra_ids=extra_ids, special=special, labels_pad_id=labels_pad_id, input_pad_id=input_pad_id, shuffle=shuffle,
        shuffle_seed=shuffle_seed, shuffle_buffer=10 * batch_size if shuffle_buffer is None else shuffle_buffer,
        drop_last=drop_last, dynamic_loss_weight=dynamic_loss_weight)
    workers = {"num_workers": num_workers}
    if num_workers:
        workers.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers)
    return DataLoader(dataset, batch_size=None, **workers)
