"""The public read verbs for both forms of a checkpoint: one file (:mod:`cs_run.checkpoint.h5`: H5, torch,
safetensors, the vendor's) or a sharded folder (:mod:`cs_run.checkpoint.sharded`). A path that is a
folder with an index is read as sharded; anything else as a file, with the file's errors. A name with
nothing under it whose save was stopped between the renames of a replacement is read from its aside
(:func:`cs_run.checkpoint.atomic.resolve`), where the old checkpoint is whole. A replica of a sharded run
reads its rows of either form (:func:`read_rows`, :func:`check_pieces`)."""

from __future__ import annotations

import os
from typing import Any

import torch

from cs_run.checkpoint import h5, sharded
from cs_run.checkpoint.atomic import resolve
from cs_run.checkpoint.crc import Piece
from cs_run.checkpoint.h5 import MapLocation, PathLike
from cs_run.checkpoint.tree import leaf_paths, map_leaves
from cs_run.errors import CheckpointError

__all__ = ["check_checkpoint_file", "check_pieces", "check_target", "info", "is_checkpoint_file", "load", "load_into",
           "read_rows"]


def _is_folder(path: PathLike) -> bool:
    return os.path.isdir(path)


def load(ckpt_path: PathLike, map_location: MapLocation = None, *, lazy: bool = True, verify: bool = True,
         allow_pickle: bool = False) -> Any:
    """:func:`cs_run.checkpoint.h5.load`; a sharded folder comes back with every tensor whole."""
    ckpt_path = resolve(ckpt_path)
    if _is_folder(ckpt_path):
        return sharded.load(ckpt_path, map_location, verify=verify)
    return h5.load(ckpt_path, map_location, lazy=lazy, verify=verify, allow_pickle=allow_pickle)


def load_into(path: PathLike, target: Any, *, map_location: MapLocation = None, verify: bool = True,
              allow_pickle: bool = False) -> Any:
    """:func:`cs_run.checkpoint.h5.load_into`; a sharded folder's shards are copied into the whole tensors."""
    path = resolve(path)
    if _is_folder(path):
        return sharded.load_into(path, target, verify=verify)
    return h5.load_into(path, target, map_location=map_location, verify=verify, allow_pickle=allow_pickle)


def read_rows(path: PathLike, target: Any, *, verify: bool = True) -> tuple[Any, list[Piece]]:
    """One replica's read for a sharded run: each :class:`~cs_run.checkpoint.sharded.LocalShard` of ``target``
    gets its rows only, read alone from a folder's shards (:func:`cs_run.checkpoint.sharded.read_rows`) or
    from one file (:func:`cs_run.checkpoint.h5.load_rows_into`); ``target``'s other tensors are read in
    place, the rest whole. Returns the state (``target``'s LocalShards in it) and the CRC32 pieces of the
    rows read, which only all replicas' pieces together check (:func:`check_pieces`)."""
    path = resolve(path)
    if _is_folder(path):
        return sharded.read_rows(path, target, verify=verify)
    shards = {p: t for p, t in leaf_paths(target).items() if isinstance(t, sharded.LocalShard)}
    whole = map_leaves(target, lambda leaf, p: torch.empty(leaf.shape, dtype=leaf.tensor.dtype, device="meta")
                       if p in shards else leaf)  # checked against the file's, never read into
    state, pieces = h5.load_rows_into(path, whole, {p: (t.offset, t.tensor) for p, t in shards.items()}, verify=verify)
    return map_leaves(state, lambda leaf, p: shards.get(p, leaf)), pieces


def check_pieces(path: PathLike, pieces: list[Piece]) -> int:
    """Check every replica's :func:`read_rows` pieces of ``path`` joined; raise naming the file and keys
    whose bytes fail their CRC32. Returns how many stored leaves the pieces checked."""
    path = resolve(path)
    return sharded.check_pieces(path, pieces) if _is_folder(path) else h5.check_pieces(path, pieces)


def check_target(path: PathLike, target: Any) -> None:
    """:func:`cs_run.checkpoint.h5.check_target`, also for a sharded folder (its index and shard 0's header)."""
    path = resolve(path)
    if _is_folder(path):
        sharded.check_target(path, target)
    else:
        h5.check_target(path, target)


def info(path: PathLike, verify: bool = False) -> dict:
    """:func:`cs_run.checkpoint.h5.info`; a sharded folder's tensors with their whole shapes."""
    path = resolve(path)
    return sharded.info(path, verify) if _is_folder(path) else h5.info(path, verify)


def check_checkpoint_file(path: PathLike) -> None:
    """:func:`cs_run.checkpoint.h5.check_checkpoint_file`; a sharded folder: its index and every shard's header."""
    path = resolve(path)
    if _is_folder(path):
        sharded.check(path)
    else:
        h5.check_checkpoint_file(path)


def is_checkpoint_file(path: PathLike) -> bool:
    """True for a complete, readable checkpoint, a file or a committed sharded folder. Never raises."""
    try:
        check_checkpoint_file(path)
        return True
    except CheckpointError:
        return False
