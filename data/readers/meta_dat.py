"""Folders indexed by a ``meta.dat`` (the Model Zoo's BERT CSV and T5/Transformer text layouts): the index, the
rows of its CSV files streamed through the vendor's shuffle buffer, and their samples in batches.

Each processor keeps its own error texts (what the folder should have been written by), so they are arguments.
"""

from __future__ import annotations

import csv
import os
import random
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, TypeVar, Union

from cs_run.errors import DataError

__all__ = ["read_meta", "whole_batches", "buffered_csv_rows", "batches"]

_T = TypeVar("_T")


def read_meta(data_dir: Union[str, list], *, form: str, written_by: str, key: str = "data_dir",
              columns: int = 2) -> list[tuple[Any, int]]:
    """(file, count) of every line of each folder's ``meta.dat``, in order (bert_utils.get_meta_data); with more
    than 2 columns the file is a tuple of the first ``columns - 1`` names (the Transformer's parallel text)."""
    out = []
    for folder in data_dir if isinstance(data_dir, list) else [data_dir]:
        meta = Path(folder) / "meta.dat"
        if not meta.is_file():
            raise DataError(f"{meta}: not found; {key} must be a folder written by {written_by}, with meta.dat")
        for n, line in enumerate(meta.read_text().splitlines(), 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != columns or not parts[-1].isdigit():
                raise DataError(f"{meta}:{n}: expected '{form}', got {line.strip()!r}")
            files = tuple(os.path.join(str(folder), p) for p in parts[:-1])
            out.append((files if columns > 2 else files[0], int(parts[-1])))
    return out


def whole_batches(files: list[tuple[str, int]], batch_size: int, data_dir) -> tuple[list[tuple[str, int]], int]:
    """(files, rows) cut to whole batches, in order (the vendor's get_data_for_task): the files up to the last
    whole batch, the last one's count cut there, and how many rows that is."""
    total = sum(rows for _, rows in files)
    if total < batch_size:
        raise DataError(f"data_dir {data_dir}: {total} rows in meta.dat, fewer than one batch of {batch_size}; "
                        "lower batch_size or add data")
    num_examples = (total // batch_size) * batch_size
    kept, left = [], num_examples
    for path, rows in files:
        if left <= 0:
            break
        kept.append((path, min(rows, left)))
        left -= rows
    return kept, num_examples


def buffered_csv_rows(files: Sequence[tuple[str, int]], rng: random.Random, *, shuffle: bool, buffer_size: int,
                      shuffle_files: bool = True, unreadable_hint: str = "meta.dat names it",
                      check_header: Optional[Callable[[str, list], None]] = None) -> Iterator[tuple[str, int, dict]]:
    """(path, line, row) of the first ``count`` rows of each CSV, as the vendor's BERT CSV readers hand them out:
    files in shuffled order, rows gathered ``buffer_size`` at a time and each full buffer shuffled, then the rest.
    ``line`` is the row's line in its file (the header is line 1)."""
    files = list(files)
    if shuffle and shuffle_files:
        rng.shuffle(files)
    buffer: list = []
    for path, count in files:
        try:
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                if check_header is not None:
                    check_header(path, reader.fieldnames or [])
                for row_id, row in enumerate(reader):
                    if row_id >= count:
                        break
                    buffer.append((path, row_id + 2, row))
                    if len(buffer) == buffer_size:
                        if shuffle:
                            rng.shuffle(buffer)
                        yield from buffer
                        buffer = []
        except OSError as e:
            raise DataError(f"{path}: cannot read ({e.strerror or e}); {unreadable_hint}") from None
    if shuffle:
        rng.shuffle(buffer)
    yield from buffer


def batches(samples: Iterable[_T], batch_size: int, drop_last: bool) -> Iterator[list[_T]]:
    """``samples`` in lists of ``batch_size``, the last shorter one kept unless ``drop_last``: the rule of a torch
    DataLoader's batches, which these processors' iterable datasets batch themselves (``batch_size=None``)."""
    batch: list = []
    for sample in samples:
        batch.append(sample)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch and not drop_last:
        yield batch
