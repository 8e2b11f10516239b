"""DPR data: the Model Zoo's DPRHDF5DataProcessor (Release 2.10 ``data/nlp/dpr/DPRHDF5DataProcessor.py``, an
HDF5IterableDataProcessor) reading the layout its converter writes (``data/nlp/dpr/data_processing/
convert_dpr_dataset.py`` through ``hdf5_preprocessing/convert_dataset_to_HDF5.py``).

Layout: ``data_dir`` holds ``*.h5`` files and ``data_params.json``. The converter groups the features by shape:
each file has ``data_0`` of ``[n, 3, length]`` (``questions_input_ids``, ``questions_attention_mask``,
``questions_token_type_ids``) and ``data_1`` of ``[n, 3, num_context, length]`` (``ctx_input_ids``,
``ctx_attention_mask``, ``ctx_token_type_ids``: per question its positive context, then its hard negatives), an
``n_examples`` attribute, and ``data_params.json`` names each group's rows (``data_0_features``,
``data_1_features``). The collate adds ``labels`` (``arange(batch) * num_context``: each question's positive
among the flattened contexts) and ``context_labels`` (``arange(batch)``).

tools/modelzoo_files.py's ``write_dpr_data`` writes that layout. A file that does not fit is a DataError naming
the file and what to fix.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from cs_run.data.readers.hdf5_map import replica_share, shard_files
from cs_run.distributed import get_streaming_batch_size, get_streaming_rank, num_streamers
from cs_run.errors import DataError
from cs_run.registry import register_data_processor

logger = logging.getLogger(__name__)

__all__ = ["DPRShards", "build_dataloader", "collate", "QUESTION_FEATURES", "CONTEXT_FEATURES"]

QUESTION_FEATURES = ("questions_input_ids", "questions_attention_mask", "questions_token_type_ids")
CONTEXT_FEATURES = ("ctx_input_ids", "ctx_attention_mask", "ctx_token_type_ids")
_WRITER = "the Model Zoo's convert_dpr_dataset.py"


def _group_names(data_dir: Union[str, list]) -> tuple[list, list]:
    """(data_0 rows, data_1 rows): data_params.json's ``data_<i>_features`` where it names them, else the
    converter's order."""
    names = [list(QUESTION_FEATURES), list(CONTEXT_FEATURES)]
    path = Path(data_dir[0] if isinstance(data_dir, list) else data_dir) / "data_params.json"
    if path.is_file():
        try:
            params = json.loads(path.read_text())
        except ValueError as e:
            raise DataError(f"{path}: not readable JSON ({e}); write the data again with {_WRITER}") from None
        for i in range(2):
            names[i] = params.get(f"data_{i}_features", names[i])
    return names[0], names[1]


class DPRShards(Dataset):
    """One streaming rank's share of the DPR samples of all files (:func:`replica_share`); files opened lazily,
    once per process."""

    def __init__(self, data_dir: Union[str, list], rank: int = 0, num_ranks: int = 1, drop_last: bool = True) -> None:
        import h5py  # noqa: PLC0415 - heavy optional import, where it is used
        self.files = shard_files(data_dir)
        q_names, c_names = _group_names(data_dir)
        self.rows = {name: (0, i) for i, name in enumerate(q_names)}
        self.rows.update({name: (1, i) for i, name in enumerate(c_names)})
        missing = [f for f in (*QUESTION_FEATURES, *CONTEXT_FEATURES) if f not in self.rows]
        if missing:
            raise DataError(f"data_dir {data_dir}: data_params.json's features lack {', '.join(missing)} ({_WRITER} "
                            "writes data_0 questions_*, data_1 ctx_*)")
        counts, shapes = [], None
        for path in self.files:
            try:
                with h5py.File(path, "r") as f:
                    q, c = f["data_0"], f["data_1"]
                    n = int(f.attrs.get("n_examples", q.shape[0]))
                    shape = (q.shape[1:], c.shape[1:])
            except (OSError, KeyError) as e:
                raise DataError(f"{path}: expected datasets 'data_0' [n, 3, length] and 'data_1' [n, 3, num_context, "
                                f"length] ({_WRITER}'s layout; {' '.join(str(e).split())})") from None
            if len(shape[0]) != 2 or len(shape[1]) != 3 or shape[0][0] != len(q_names) or shape[1][0] != len(c_names) \
                    or shape[1][2] != shape[0][1] or c.shape[0] != q.shape[0] or not 0 <= n <= q.shape[0]:
                raise DataError(f"{path}: 'data_0' is [{q.shape[0]}, {', '.join(map(str, shape[0]))}] and 'data_1' "
                                f"[{c.shape[0]}, {', '.join(map(str, shape[1]))}] (n_examples {n}); expected [n, 3, "
                                f"length] and [n, 3, num_context, length] ({_WRITER}'s layout)")
            if shapes is not None and shape != shapes:
                raise DataError(f"{path}: samples of shape {shape}, other files {shapes}; all files of data_dir must "
                                "have one length and one num_context")
            shapes = shape
            counts.append(n)
        self.num_context, self.length = int(shapes[1][1]), int(shapes[0][1])
        self.offsets = np.cumsum([0] + counts)
        self.samples = replica_share(int(self.offsets[-1]), rank, num_ranks, drop_last)
        self._handles: dict = {}

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        import h5py  # noqa: PLC0415 - heavy optional import
        sample = self.samples[index] % int(self.offsets[-1])
        i = int(np.searchsorted(self.offsets, sample, side="right")) - 1
        local = int(sample - self.offsets[i])
        f = self._handles.get(i) or self._handles.setdefault(i, h5py.File(self.files[i], "r"))
        try:
            groups = (np.asarray(f["data_0"][local], np.int32), np.asarray(f["data_1"][local], np.int32))
        except (OSError, KeyError, ValueError) as e:
            raise DataError(f"{self.files[i]}: sample {local} cannot be read ({' '.join(str(e).split())}); the file "
                            "is damaged: write it again or remove it from data_dir") from None
        return {name: torch.from_numpy(groups[g][row].copy()) for name, (g, row) in self.rows.items()
                if name in QUESTION_FEATURES or name in CONTEXT_FEATURES}

    def __getstate__(self) -> dict:  # open handles stay in the process that opened them
        return {**self.__dict__, "_handles": {}}


def collate(batch: list) -> dict[str, torch.Tensor]:
    """default_collate plus the labels (DPRHDF5DataProcessor.collate_fn)."""
    out = {k: torch.stack([b[k] for b in batch]) for k in batch[0]}
    size, num_context = out["questions_input_ids"].shape[0], out["ctx_input_ids"].shape[1]
    out["labels"] = torch.arange(size, dtype=torch.int32) * num_context
    out["context_labels"] = torch.arange(size, dtype=torch.int32)
    return out


@register_data_processor("DPRHDF5DataProcessor")
def build_dataloader(split: str, data_processor: str = "DPRHDF5DataProcessor",
                     data_dir: Union[str, list, None] = None, batch_size: int = 1, shuffle: bool = False,
                     shuffle_seed: Optional[int] = None, shuffle_buffer: Optional[int] = None, num_workers: int = 0,
                     drop_last: bool = True, prefetch_factor: Optional[int] = 10, persistent_workers: bool = True,
                     use_vsl: bool = False, features_list: Any = None, vocab_size: Any = None) -> DataLoader:
    """Data function of DPRHDF5DataProcessor (HDF5IterableDataProcessorConfig's keys and defaults).

    The vendor streams the files through a shuffle buffer (``shuffle_buffer``); here samples are drawn in a
    seeded permutation of the whole split (``shuffle_seed``), so ``shuffle_buffer`` changes nothing.
    ``features_list`` and ``vocab_size`` are read from data_params.json / deprecated there."""
    if data_dir is None:
        raise ValueError("data_dir: required (a folder written by the Model Zoo's convert_dpr_dataset.py)")
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    if use_vsl:
        raise ValueError("use_vsl: DPR's shards have no attention_span / position_ids rows; set it false")
    dataset = DPRShards(data_dir, get_streaming_rank(), num_streamers(), drop_last)
    per_stream = get_streaming_batch_size(batch_size)
    if drop_last and len(dataset) < per_stream:
        raise ValueError(f"batch_size: {per_stream} but the {split} data in {data_dir} holds {len(dataset)} samples "
                         "(with drop_last no batch would be produced)")
    generator = torch.Generator().manual_seed(shuffle_seed) if shuffle and shuffle_seed is not None else None
    extra = {"prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers} if num_workers else {}
    logger.info("DPR data (%s): %d questions with %d contexts of %d tokens in %d file(s)", split, len(dataset),
                dataset.num_context, dataset.length, len(dataset.files))
    return DataLoader(dataset, batch_size=per_stream, shuffle=shuffle, drop_last=drop_last, num_workers=num_workers,
                      generator=generator, collate_fn=collate, **extra)

