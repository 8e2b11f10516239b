"""The Model Zoo's GPT HDF5 sample layout, read sample by sample (GptHDF5DataProcessor's shards).

The layout is the one the Model Zoo's ``hdf5_preprocessing`` scripts write and its
``HDF5IterableDataset`` reads (Release 1.9): every ``*.h5`` file in ``data_dir`` holds an integer
dataset ``data`` of shape ``[n_examples, 3, max_sequence_length]`` — rows ``input_ids``,
``attention_mask`` (the loss mask) and ``labels`` — and an ``n_examples`` attribute. An optional
``data_params.json`` beside the files may name the rows (``"features"``). Packed (VSL) shards hold two
more rows, ``attention_span`` and ``position_ids`` (:data:`VSL_FEATURES`), read with ``use_vsl``.

A token id the model cannot embed would fail deep inside a step (an IndexError on the CPU, a device
assert on CUDA) without naming the data. Every sample is checked on the host as it is read, against
``vocab_size`` (model.vocab_size, passed by the registry as the Model Zoo's ``set_defaults`` does):
a min and a max over ``2 * max_sequence_length`` ints per sample, next to the HDF5 decompression,
and no device sync. Shards written by ``cs-run data preprocess`` also record their largest id
(``max_token_id``), so such a mismatch is refused when the shards are opened, before the first step.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Union

import h5py  # noqa: TID253 - this reader reads HDF5 files; loaded only with the GPT data
import numpy as np
import torch
from torch.utils.data import Dataset

from cs_run.data.readers.hdf5_map import replica_share, shard_files
from cs_run.errors import DataError

__all__ = ["SampleShards", "GptHDF5Dataset", "FEATURES", "VSL_FEATURES", "IGNORE_INDEX", "check_vsl_rows"]

FEATURES = ("input_ids", "attention_mask", "labels")
VSL_FEATURES = ("attention_span", "position_ids")
"""The rows a packed document writer adds (Release 2.10 data_preprocessing/vsl_pretraining_token_generator.py
``create_features_auto_lm_vsl``: per document, span ``len-1, ..., 0`` and positions ``0, ..., len-1``;
padding 0 in both), which ``use_vsl`` reads as the vendor's processors do (``features_list.extend``)."""
IGNORE_INDEX = -100  # a label cross_entropy skips (its default ignore_index)
# what h5py raises for a damaged file, by the HDF5 error class (found by overwriting every 32 bytes of a shard)
_H5_ERRORS = (OSError, KeyError, RuntimeError, ValueError, TypeError)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def check_vsl_rows(span: np.ndarray, positions: np.ndarray, where: str) -> None:
    """Refuses VSL rows the decoder would misread: a span past the sample's end (a key seen from outside
    the sequence) or a position outside [0, max_sequence_length) (a position table read out of range)."""
    length = span.shape[-1]
    room = length - 1 - np.arange(length)
    bad = np.flatnonzero((span < 0) | (span > room))
    if bad.size:
        at = int(bad[0])
        raise DataError(f"{where}: attention_span[{at}] is {int(span[at])}; a key's span counts the tokens after "
                        f"it in its document, in [0, {int(room[at])}] here: write the shard again with a VSL "
                        "preprocessing (use_vsl: true) or set use_vsl false")
    bad = np.flatnonzero((positions < 0) | (positions >= length))
    if bad.size:
        at = int(bad[0])
        raise DataError(f"{where}: position_ids[{at}] is {int(positions[at])}; positions restart at 0 in each "
                        f"document, in [0, {length}): write the shard again with a VSL preprocessing or set use_vsl "
                        "false")


def _features(data_dir: Union[str, list], given: Optional[list], default: tuple) -> list[str]:
    """The rows' names: the input's own list, else data_params.json's ``features``, else ``default``."""
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
    return list(default)


class SampleShards(Dataset):
    """One streaming rank's share of sample shards (:func:`replica_share` of all files' samples, ``drop_last``
    deciding drop or wrap): each ``*.h5`` file holds an integer ``data`` of ``[n_examples, rows,
    max_sequence_length]`` and an ``n_examples`` attribute. A subclass names its rows (``FEATURES``) and checks
    each sample's token ids (``_check_sample``).

    Files are opened lazily, once per process (DataLoader workers each open their own handles).
    """

    FEATURES: tuple = ()
    FEATURES_KEY = "features"
    """The input key that names the rows (in the error for rows it lacks)."""
    ROWS_WRITER = ""
    """Said after a missing row or a wrong shape: who writes these rows."""

    def __init__(self, data_dir: Union[str, list], rank: int = 0, num_ranks: int = 1,
                 features: Optional[list] = None, max_sequence_length: Optional[int] = None,
                 vocab_size: Optional[int] = None, drop_last: bool = True) -> None:
        self.files = shard_files(data_dir)
        names = _features(data_dir, features, self.FEATURES)
        self.names = tuple(self.FEATURES)
        """The features of a sample (a subclass may add rows it reads, as GPT's ``use_vsl``)."""
        self.feature_rows = {name: i for i, name in enumerate(names)}
        missing = [f for f in self.FEATURES if f not in self.feature_rows]
        if missing:
            raise ValueError(f"{self.FEATURES_KEY}: the shards' rows {names} lack {', '.join(missing)}"
                             + (f" ({self.ROWS_WRITER} writes {', '.join(self.FEATURES)})" if self.ROWS_WRITER else ""))
        self.vocab_size = vocab_size
        counts, msl = [], None
        for path in self.files:
            n, file_msl = self._check_file(path, len(names), vocab_size)
            if msl is not None and file_msl != msl:
                raise ValueError(f"data_dir: {path.name} has max_sequence_length {file_msl}, other shards {msl}")
            msl = file_msl
            counts.append(n)
        if max_sequence_length is not None and max_sequence_length != msl:
            raise ValueError(f"max_sequence_length: {max_sequence_length} but the shards in data_dir hold "
                             f"sequences of {msl} tokens")
        self.max_sequence_length = msl
        self.offsets = np.cumsum([0] + counts)
        self.samples = replica_share(int(self.offsets[-1]), rank, num_ranks, drop_last)
        """This rank's positions among all files' samples (position ``p`` is sample ``p % total``)."""
        self._handles: dict[int, h5py.File] = {}
        self._pid = os.getpid()

    def _check_file(self, path: Path, rows: int, vocab_size: Optional[int]) -> tuple[int, int]:
        """``(n_examples, max_sequence_length)`` of a shard whose ``data`` is ``[n, rows, msl]`` integers."""
        try:
            with h5py.File(path, "r") as f:
                if "data" not in f:
                    raise ValueError(f"data_dir: {path} has no dataset 'data' (keys: {', '.join(f.keys())})")
                d = f["data"]
                if d.ndim != 3 or d.shape[1] != rows or not np.issubdtype(d.dtype, np.integer):
                    raise ValueError(f"data_dir: {path} 'data' is {d.dtype}{list(d.shape)}; expected integers of "
                                     f"shape [n_examples, {rows}, max_sequence_length]{self._layout_note(rows)}")
                n = int(f.attrs.get("n_examples", d.shape[0]))
                if not 0 <= n <= d.shape[0]:
                    raise ValueError(f"data_dir: {path} attribute n_examples={n} but 'data' holds {d.shape[0]} rows")
                top = f.attrs.get("max_token_id")
                if vocab_size is not None and top is not None and int(top) >= vocab_size:
                    raise ValueError(f"data_dir: {path} holds token ids up to {int(top)} (its max_token_id), but "
                                     f"model.vocab_size is {vocab_size}; set model.vocab_size to at least "
                                     f"{int(top) + 1} (the tokenizer's size) or write the shards with a smaller "
                                     "--vocab_size")
                return n, int(d.shape[2])
        except _H5_ERRORS as e:
            if isinstance(e, ValueError) and str(e).startswith("data_dir: "):
                raise  # one of the checks above
            raise ValueError(f"data_dir: {path} is not a readable HDF5 file ({_one_line(e)})") from None

    def _layout_note(self, rows: int) -> str:
        """Said after a shard of the wrong shape: what writes the ``rows`` expected."""
        return f" (the {self.ROWS_WRITER}'s {rows} rows)" if self.ROWS_WRITER else ""

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
            raise DataError(f"data_dir: {self.files[i]}: sample {local} cannot be read ({_one_line(e)}); the shard "
                            "is damaged: write it again (cs-run data preprocess) or remove it from data_dir") from None
        self._check_sample(self.files[i], local, row)
        return {name: torch.from_numpy(row[self.feature_rows[name]].copy()) for name in self.names}

    def _check_sample(self, path: Path, local: int, row: np.ndarray) -> None:
        """Raise a :class:`DataError` for a token id the model cannot embed (a subclass knows which rows)."""

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state


class GptHDF5Dataset(SampleShards):
    """GptHDF5DataProcessor's shards: rows ``input_ids``, ``attention_mask`` (the loss mask), ``labels``."""

    FEATURES = FEATURES

    def __init__(self, data_dir: Union[str, list], rank: int = 0, num_ranks: int = 1,
                 features: Optional[list] = None, max_sequence_length: Optional[int] = None,
                 vocab_size: Optional[int] = None, drop_last: bool = True, use_vsl: bool = False) -> None:
        # with use_vsl the vendor's HDF5IterableDataset names the five rows itself
        super().__init__(data_dir, rank, num_ranks, [*FEATURES, *VSL_FEATURES] if use_vsl else features,
                         max_sequence_length, vocab_size, drop_last)
        if use_vsl:
            self.names = (*FEATURES, *VSL_FEATURES)

    def _layout_note(self, rows: int) -> str:
        return (" (use_vsl reads packed shards: input_ids, attention_mask, labels, attention_span, position_ids; "
                "write them with a VSL preprocessing or set use_vsl false)") if rows == 5 else ""

    def _check_sample(self, path: Path, local: int, row: np.ndarray) -> None:
        ids, labels = row[self.feature_rows["input_ids"]], row[self.feature_rows["labels"]]
        high = self.vocab_size if self.vocab_size is not None else np.iinfo(np.int32).max
        negative_label = labels.min() < 0 and ((labels < 0) & (labels != IGNORE_INDEX)).any()
        if ids.min() < 0 or max(ids.max(), labels.max()) >= high or negative_label:
            self._bad_token(path, local, row)
        if len(self.names) > len(FEATURES):
            check_vsl_rows(row[self.feature_rows["attention_span"]], row[self.feature_rows["position_ids"]],
                           f"data_dir: {path}: sample {local}")

    def _bad_token(self, path: Path, local: int, row: np.ndarray) -> None:
        """The error for the first token id of the sample that the model cannot embed (or score)."""
        vocab = self.vocab_size
        for name in ("input_ids", "labels"):
            values = row[self.feature_rows[name]]
            bad = (values < 0) | (values >= vocab if vocab is not None else False)
            if name == "labels":
                bad &= values != IGNORE_INDEX
            where = np.flatnonzero(bad)
            if where.size:
                token, at = int(values[where[0]]), int(where[0])
                break
        fix = (f"ids must be in [0, model.vocab_size={vocab}): set model.vocab_size to at least {token + 1} or write "
               "the shards with this vocabulary" if token >= 0 else "token ids are never negative: the shard is "
               "damaged; write it again")
        raise DataError(f"data_dir: {path}: sample {local} holds token id {token} in {name} (position {at}); {fix}")
