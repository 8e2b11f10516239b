"""GptHDF5MapDataProcessor's readers: the Model Zoo's map-style HDF5 layouts, read sample by sample.

Two layouts of a ``data`` dataset in every ``*.h5`` file of the data folders (Model Zoo 2.10,
``data/common/h5_map_dataset/readers.py``), told apart by the rank of the first file's ``data``:

* **sample**: ``[n, features, max_sequence_length]`` (``input_ids``, ``attention_mask`` (the loss
  mask), ``labels``; five rows with variable sequence length). ``max_sequence_length`` must be unset or
  equal the shards' length.
* **corpus**: ``[n_tokens]``, tokenized documents concatenated. ``max_sequence_length`` is required;
  sample ``i`` is tokens ``[i*msl, (i+1)*msl]`` (one extra token): ``input_ids`` the first msl,
  ``labels`` the last msl, ``attention_mask`` all ones. The same shards serve every sequence length.

Files are sorted by name (``sort_files``) and concatenated in that order. ``data_subset``
(``"0.0-0.5,0.7-1.0"``) keeps those fractions of the samples; a ``mixture`` of folders with weights
interleaves them as the Model Zoo's ``Mixture`` does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

import h5py  # noqa: TID253 - this data module reads HDF5 files; loaded only with the GPT data
import numpy as np

__all__ = ["H5Reader", "Mixture", "DataSubset", "replica_share", "shard_files"]


def shard_files(data_dirs: Union[str, list], sort: bool = True) -> list[Path]:
    """The *.h5 shards of a data_dir (a folder or a list of folders); refused: a non-folder, a folder with
    no shard (one rule for every folder: a list entry without shards is as wrong as a single one)."""
    many = isinstance(data_dirs, list)
    dirs = data_dirs if many else [data_dirs]
    if many and not dirs:
        raise ValueError("data_dir: an empty list; give the folder (or folders) holding the *.h5 shards")
    files: list[Path] = []
    for i, folder in enumerate(dirs):
        where = f"data_dir[{i}]" if many else "data_dir"
        path = Path(folder)
        if not path.is_dir():
            raise ValueError(f"{where}: {folder} is not a folder (expected one holding the *.h5 shards)")
        found = list(path.glob("*.h5"))
        if not found:
            raise ValueError(f"{where}: no *.h5 files in {folder}; write shards with `cs-run data preprocess` or the "
                             "Model Zoo's hdf5_preprocessing scripts, or leave the folder out")
        files.extend(found)
    return sorted(files) if sort else files


def replica_share(num_samples: int, rank: int, num_ranks: int, drop: bool) -> range:
    """Rank ``rank``'s positions in an epoch of ``num_samples`` (a position ``p`` is sample ``p % num_samples``),
    evened as torch's ``DistributedSampler(shuffle=False)`` does, so every replica steps the same number of
    batches whatever the shards' sizes: with ``drop`` the last ``num_samples % num_ranks`` samples are left
    out (``num_samples // num_ranks`` each, disjoint), else the first ones are wrapped round to fill the last
    row (``ceil(num_samples / num_ranks)`` each, together covering every sample). Each rank takes every
    ``num_ranks``-th position from its own, so the split depends only on the counts, known before a step."""
    each = num_samples // num_ranks if drop else -(-num_samples // num_ranks)
    return range(rank, each * num_ranks, num_ranks)


class DataSubset:
    """The Model Zoo's ``_DatasetSegmenter``: keep the fractions ``data_subset`` names of n samples."""

    def __init__(self, num_samples: int, data_subset: str) -> None:
        try:
            ranges = [(float(a), float(b)) for a, b in (part.split("-") for part in data_subset.strip().split(","))]
        except ValueError:
            raise ValueError(f"data_subset: {data_subset!r} is not comma-separated ranges of fractions such as "
                             "'0.0-0.5,0.7-1.0'") from None
        kept, skipped, previous_end = [], [], 0.0
        for start, end in [(0.0, 0.0), *ranges, (1.0, 1.0)]:
            if not 0.0 <= start <= end <= 1.0 or start < previous_end:
                raise ValueError(f"data_subset: {data_subset!r}: every range must lie in [0, 1], start <= end, "
                                 "in increasing order")
            kept.append(int(num_samples * end) - int(num_samples * start))
            skipped.append(int(num_samples * start) - int(num_samples * previous_end))
            previous_end = end
        self._kept, self._skipped = np.cumsum(kept), np.cumsum(skipped)
        self.length = int(self._kept[-1])

    def __call__(self, i: int) -> int:
        """The index of kept sample ``i`` among all samples."""
        return int(i + self._skipped[int(self._kept.searchsorted(i, side="right"))])


class H5Reader:
    """Samples of the ``*.h5`` shards in ``data_dirs`` (a folder or a list), int32 numpy arrays.

    Handles are opened lazily, once per process, so DataLoader workers each open their own.
    """

    def __init__(self, data_dirs: Union[str, list], sequence_length: Optional[int] = None,
                 data_subset: Optional[str] = None, sort: bool = True) -> None:
        self.files = shard_files(data_dirs, sort)
        counts, shapes = [], []
        for path in self.files:
            try:
                with h5py.File(path, "r") as f:
                    if "data" not in f:
                        raise ValueError(f"data_dir: {path} has no dataset 'data' (keys: {', '.join(f.keys())})")
                    d = f["data"]
                    if not np.issubdtype(d.dtype, np.integer):
                        raise ValueError(f"data_dir: {path} 'data' holds {d.dtype}; expected token ids (integers)")
                    counts.append(int(d.shape[0]))
                    shapes.append(tuple(d.shape[1:]))
            except OSError as e:
                raise ValueError(f"data_dir: {path} is not a readable HDF5 file ({e})") from None
        self.by_sample = len(shapes[0]) > 0
        for path, shape in zip(self.files, shapes):
            if shape != shapes[0]:
                raise ValueError(f"data_dir: {path} holds 'data' of shape [n, {', '.join(map(str, shape))}] but "
                                 f"{self.files[0]} [n, {', '.join(map(str, shapes[0]))}]; every shard needs one layout")
        if self.by_sample:
            if len(shapes[0]) != 2:
                raise ValueError(f"data_dir: {self.files[0]} 'data' has rank {len(shapes[0]) + 1}; expected "
                                 "[n, features, max_sequence_length] (sample layout) or [n_tokens] (corpus layout)")
            self.sequence_length = shapes[0][1]
            if sequence_length is not None and sequence_length != self.sequence_length:
                raise ValueError(f"max_sequence_length: {sequence_length} but the shards hold samples of "
                                 f"{self.sequence_length} tokens (leave it unset for the sample layout)")
            self.features = shapes[0][0]
            total = sum(counts)
        else:
            if sequence_length is None:
                raise ValueError(f"max_sequence_length: required for the corpus layout of {self.files[0]} "
                                 "('data' holds concatenated tokens; samples are cut max_sequence_length long)")
            self.sequence_length, self.features = int(sequence_length), 0
            total = (sum(counts) - 1) // self.sequence_length  # each sample reads one extra token
        self.offsets = np.cumsum([0, *counts])
        self.subset = DataSubset(total, data_subset) if data_subset is not None else None
        self.length = self.subset.length if self.subset else total
        self._handles: dict[int, h5py.Dataset] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self.length

    def _data(self, i: int) -> h5py.Dataset:
        if os.getpid() != self._pid:  # a forked worker: never share the parent's HDF5 handles
            self._handles, self._pid = {}, os.getpid()
        if i not in self._handles:
            self._handles[i] = h5py.File(self.files[i], "r")["data"]
        return self._handles[i]

    def _rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of the concatenation of every file's ``data``."""
        parts = []
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        for i in range(first, len(self.files)):
            lo, hi = max(start, self.offsets[i]), min(stop, self.offsets[i + 1])
            if lo >= hi:
                break
            parts.append(self._data(i)[lo - self.offsets[i]:hi - self.offsets[i]])
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < self.length:
            raise IndexError(i)
        if self.subset is not None:
            i = self.subset(i)
        if self.by_sample:
            return np.asarray(self._rows(i, i + 1)[0], dtype=np.int32)
        start = i * self.sequence_length
        return np.asarray(self._rows(start, start + self.sequence_length + 1), dtype=np.int32)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state


class Mixture:
    """Several readers mixed by weight (the Model Zoo's ``Mixture``).

    One epoch is the number of samples that shows every sample of each reader with a weight above 5% at
    least once; reader ``k`` holds ``int(epoch * w_k)`` of its indices, cycling through its samples. With
    ``interleave`` (unshuffled runs) the readers' samples are interleaved by a permutation of ``seed``
    that keeps each reader's own order.
    """

    def __init__(self, readers: list[H5Reader], weights: list[float], interleave: bool = False, seed: int = 0) -> None:
        if len(weights) != len(readers):
            raise ValueError(f"mixture: {len(readers)} data_dir entries but {len(weights)} weights")
        if any(w < 0 for w in weights) or not any(w > 0 for w in weights):
            raise ValueError(f"mixture: weights must be >= 0 and one of them > 0, got {weights}")
        if len({r.by_sample for r in readers}) > 1:
            raise ValueError("mixture: every data_dir needs the same layout (all sample or all corpus shards)")
        kept = [(r, float(w)) for r, w in zip(readers, weights) if w > 0]
        total = sum(w for _, w in kept)
        self.readers = [r for r, _ in kept]
        self.weights = [w / total for _, w in kept]
        epoch = max(len(r) / w for r, w in zip(self.readers, self.weights) if w > 0.05)
        self.boundaries = np.insert(np.cumsum([int(epoch * w) for w in self.weights]), 0, 0)
        self.by_sample = self.readers[0].by_sample
        self.sequence_length = self.readers[0].sequence_length
        if len({(r.features, r.sequence_length) for r in self.readers}) > 1:
            raise ValueError("mixture: every data_dir needs shards of one sample shape (features, sequence length)")
        self.features = self.readers[0].features
        self.indices = None
        if interleave:
            size = len(self)
            indices = np.arange(size)
            np.random.default_rng(seed).shuffle(indices)
            for start, end in zip(self.boundaries[:-1], self.boundaries[1:]):  # each reader's own order kept
                indices[(start <= indices) & (indices < end)] = np.arange(start, end)
            self.indices = indices

    def __len__(self) -> int:
        return int(self.boundaries[-1])

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(i)
        index = int(self.indices[i]) if self.indices is not None else i
        k = int(np.searchsorted(self.boundaries, index, side="right")) - 1
        reader = self.readers[k]
        return reader[(index - int(self.boundaries[k])) % len(reader)]
