"""The index of a sharded checkpoint folder (:mod:`cs_run.checkpoint.sharded`): its name, the shard
file names, torch.chunk's row split, and the reading of ``index.json`` with every field checked (type,
range, shard names that are exactly ``shard_<r>_of_<N>.h5``, rows that tile each shape, the save's
identity) before any shard is opened. JSON only: nothing in a checkpoint folder is unpickled.

Version 2 (this one writes it) adds the save's identity, which binds each shard to the index: the
save's random ``checkpoint_id`` and ``step`` (also in every shard's attributes) and ``shard_crc32``, each
shard's ``__structure_crc32__`` (its spec, which records every tensor's CRC32). Version 1 indexes, written
before, have none and are still read (:func:`cs_run.checkpoint.sharded` notes it)."""

from __future__ import annotations

import json
import os
from typing import Any

from cs_run.checkpoint import format as fmt
from cs_run.checkpoint.reader import NotACheckpointError, not_regular
from cs_run.errors import CheckpointError

__all__ = ["FORMAT", "INDEX", "VERSION", "check_index", "check_regular", "is_sharded", "key_of", "read_index", "rows_of", "shard_name"]

INDEX = "index.json"
FORMAT = "cs_run.sharded_checkpoint"
VERSION = 2  # 2: the save's identity (checkpoint_id, step, shard_crc32); 1 is still read
_MAX_INDEX_BYTES = 64 << 20  # an index names each tensor once: far below this for any real model
_MAX_WORLD = 1 << 16


def shard_name(rank: int, world_size: int) -> str:
    return f"shard_{rank:05d}_of_{world_size:05d}.h5"


def is_sharded(path: str | os.PathLike) -> bool:
    """True for a folder holding an index (a committed sharded checkpoint; one whose index is no regular
    file too, so that reading it is the error, an autoload falls back past it and a save replaces it)."""
    return os.path.isdir(path) and os.path.lexists(os.path.join(path, INDEX))


def rows_of(rank: int, world_size: int, length: int) -> tuple[int, int]:
    """``(offset, rows)`` of ``rank``'s shard of ``length`` rows: torch.chunk's split (DTensor ``Shard(0)``)."""
    chunk = -(-length // world_size) if length else 0
    offset = min(rank * chunk, length)
    return offset, min(chunk, length - offset)


def key_of(path: Any) -> str:
    """A key path as the one-file format names it (``optimizer.state.0.exp_avg``)."""
    return ".".join(str(p) for p in path)


def bad(where: str, what: str) -> CheckpointError:
    """The one-line error about ``where`` (the index or a shard)."""
    return CheckpointError(f"checkpoint '{where}': {what}")


def check_regular(path: str, what: str) -> None:
    """Refuses a ``path`` of the folder (``what``: the index, a shard) that is no regular file: a FIFO would
    block the open, a device never end."""
    kind = not_regular(path)
    if kind is not None:
        raise bad(path, f"{what} is {kind}, not a regular file; copy the whole folder, or use another checkpoint")


def read_index(folder: str | os.PathLike) -> dict:
    """The checked index of a sharded checkpoint folder.

    Raises:
        NotACheckpointError: no folder, or a folder without an index (not a committed checkpoint).
        CheckpointError: an index that is not the format's JSON (each problem named, with the file).
    """
    folder = os.fspath(folder)
    where = os.path.join(folder, INDEX)
    if not os.path.isdir(folder):
        raise NotACheckpointError(f"checkpoint '{folder}' does not exist")
    check_regular(where, "the index")
    if not os.path.isfile(where):
        raise NotACheckpointError(f"checkpoint '{folder}' is a directory, not a checkpoint file or a sharded "
                                  f"checkpoint's folder (it has no {INDEX})")
    size = os.path.getsize(where)
    if size > _MAX_INDEX_BYTES:
        raise bad(where, f"the index is {size} bytes, larger than any index cs-run writes ({_MAX_INDEX_BYTES})")
    try:
        with open(where, "rb") as fh:
            index = json.loads(fh.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise bad(where, f"not valid JSON ({err}); the index is damaged") from None
    except RecursionError:
        raise bad(where, "nested too deeply to be an index") from None
    check_index(where, index)
    return index


def _is_int(value: Any, low: int = 0, high: int = 1 << 62) -> bool:
    return type(value) is int and low <= value <= high


def check_index(where: str, index: Any) -> None:
    """Every field a reader relies on, with the type and range the format allows."""
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise bad(where, f"not a cs-run sharded checkpoint index (no \"format\": \"{FORMAT}\")")
    if not _is_int(index.get("version"), 1, VERSION):
        raise bad(where, f"version {index.get('version')!r}: this cs-run reads sharded checkpoint version {VERSION}")
    world = index.get("world_size")
    if not _is_int(world, 1, _MAX_WORLD):
        raise bad(where, f"world_size {world!r} is not a number of replicas (1..{_MAX_WORLD})")
    shards = index.get("shards")
    if shards != [shard_name(r, world) for r in range(world)]:
        count = len(shards) if isinstance(shards, list) else shards
        raise bad(where, f"world_size {world} but the index names {count!r} shards, not "
                          f"{shard_name(0, world)} .. {shard_name(world - 1, world)}")
    if index["version"] >= 2:
        _check_identity(where, index, world)
    leaves = index.get("leaves")
    if not isinstance(leaves, list):
        raise bad(where, "\"leaves\" is not a list")
    seen: set[str] = set()
    for i, leaf in enumerate(leaves):
        path = leaf.get("path") if isinstance(leaf, dict) else None
        if not isinstance(path, list) or not path or not all(isinstance(p, str) or _is_int(p) for p in path):
            raise bad(where, f"leaf {i}: \"path\" is not a list of keys")
        key = key_of(path)
        if key in seen:
            raise bad(where, f"leaf {i}: key '{key}' is named twice")
        seen.add(key)
        if "tied" in leaf:
            if set(leaf) != {"path", "tied"} or not _is_int(leaf["tied"], 0, i - 1) or "tied" in leaves[leaf["tied"]]:
                raise bad(where, f"key '{key}': \"tied\" must name an earlier stored leaf")
            continue
        _check_leaf(where, key, leaf, world)


def _check_leaf(where: str, key: str, leaf: dict, world: int) -> None:
    if leaf.get("dtype") not in fmt.TORCH_DTYPES:
        raise bad(where, f"key '{key}': dtype {leaf.get('dtype')!r} is not one the format stores")
    shape = leaf.get("shape")
    if not isinstance(shape, list) or not 1 <= len(shape) <= 64 or not all(_is_int(n) for n in shape):
        raise bad(where, f"key '{key}': shape {shape!r} is not a list of 1 to 64 sizes")
    rows = leaf.get("rows")
    if not isinstance(rows, list) or len(rows) != world or not all(
            isinstance(r, list) and len(r) == 2 and _is_int(r[0]) and _is_int(r[1]) for r in rows):
        raise bad(where, f"key '{key}': \"rows\" must give [offset, rows] for each of the {world} shards")
    offset = 0
    for r, (start, count) in enumerate(rows):
        if start != offset:
            raise bad(where, f"key '{key}': shard {r}'s rows start at {start}, not {offset} where shard {r - 1}'s end")
        offset += count
    if offset != shape[0]:
        raise bad(where, f"key '{key}': the shards hold {offset} rows of its shape {shape}")


def _check_identity(where: str, index: dict, world: int) -> None:
    """A version 2 index's identity of the save: its id, its step, every shard's spec CRC32."""
    ident = index.get("checkpoint_id")
    if not (isinstance(ident, str) and len(ident) == 32 and all(c in "0123456789abcdef" for c in ident)):
        raise bad(where, f"\"checkpoint_id\" {ident!r} is not the 32 hex digits of a save's id")
    if not _is_int(index.get("step"), -1):
        raise bad(where, f"\"step\" {index.get('step')!r} is not a global step")
    crcs = index.get("shard_crc32")
    if not isinstance(crcs, list) or len(crcs) != world or not all(_is_int(c, 0, 0xFFFFFFFF) for c in crcs):
        raise bad(where, f"\"shard_crc32\" must give a CRC32 for each of the {world} shards")
