"""Sharded checkpoints: one folder ``checkpoint_<step>.mdl/`` that the replicas of a sharded run write
in parallel, each its own shard file, committed as a whole (docs/architecture.md#sharded-checkpoints).

Layout::

    checkpoint_<step>.mdl/
        shard_00000_of_00004.h5   ordinal 0: {"leaves": [its rows of each sharded tensor], "state": the rest}
        shard_00001_of_00004.h5   ordinal r: {"leaves": [its rows of each sharded tensor]}
        ...
        index.json                written last, by ordinal 0: the commit marker

Each shard is an ordinary cs-run H5 file (:func:`cs_run.checkpoint.h5.save`: CRC32s, hostile-file checks,
no pickle). ``state`` is the whole state tree with ``None`` where a sharded tensor goes; ``index.json``
names, for each sharded tensor in ``leaves`` order, its key path, dtype, global shape and the rows
(dim 0, torch.chunk's split as DTensor's ``Shard(0)``) each shard holds, plus the world size and shard
file names. The index is JSON, never a pickle: torch.distributed.checkpoint's ``.metadata`` is read with
``pickle.load``, which the project's no-unpickling rule excludes, so cs-run writes this form instead.

Identity: every shard records its save's random id, step and rank, the index the id, the step and each
shard's spec CRC32; every read checks each shard it opens against the index before it uses a tensor byte
(:mod:`cs_run.checkpoint.shard_identity`), so a folder mixing files of different saves is one error.

Commit: ordinal 0 makes a temporary folder (``.checkpoint_<step>.mdl.<pid>.<token>.cs-run-tmp``), every
replica writes its shard into it (each file itself atomic), all meet, ordinal 0 writes the index and
renames the folder to its final name. A save killed at any point leaves a temporary that the next save
removes (:func:`cs_run.checkpoint.atomic.clean_stale_temps`), never a folder under the final name.

Reading assembles each sharded tensor whole from the shards, so a checkpoint of N replicas loads into
any number of replicas, sharded or not, and :func:`load` returns what a one-file checkpoint's load would.
This module knows nothing of DTensor: the strategy hands it :class:`LocalShard` leaves. The index's
names and checks are :mod:`cs_run.checkpoint.shard_index`.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from dataclasses import dataclass
from typing import Any, Optional

import torch

from cs_run.checkpoint import format as fmt
from cs_run.checkpoint import h5
from cs_run.checkpoint.atomic import TMP_SUFFIX, atomic_path, clean_stale_temps, fsync_path, remove, replace
from cs_run.checkpoint.crc import Piece, join
from cs_run.checkpoint.h5 import TargetMismatchError
from cs_run.checkpoint.reader import H5Source, raise_if_damaged
from cs_run.checkpoint.shard_identity import Identity, check_shard, header_of, new_identity, read_header
from cs_run.checkpoint.shard_index import (
    FORMAT,
    INDEX,
    VERSION,
    bad,
    check_index,
    check_regular,
    is_sharded,
    key_of,
    read_index,
    rows_of,
    shard_name,
)
from cs_run.checkpoint.tree import flatten, leaf_paths, map_leaves, map_tensors
from cs_run.checkpoint.writer import write_file
from cs_run.errors import CheckpointError

__all__ = ["INDEX", "Identity", "LocalShard", "Piece", "check", "check_pieces", "check_target", "commit", "discard", "info",
           "is_sharded", "load", "load_into", "new_identity", "new_temp_folder", "read_index", "read_rows", "rows_of",
           "save_unsharded_as", "shard_name", "write_shard"]


@dataclass(frozen=True)
class LocalShard:
    """One replica's rows ``[offset, offset + len(tensor))`` (dim 0) of a tensor of global ``shape``."""

    tensor: torch.Tensor
    shape: tuple[int, ...]
    offset: int


# ------------------------------------------------------------------------------------------ writing

def _split(tree: Any, found: list[tuple[tuple, LocalShard]]) -> Any:
    """``tree`` with each :class:`LocalShard` replaced by None; the shards in order into ``found``."""
    def take(leaf: Any, path: tuple) -> Any:
        if not isinstance(leaf, LocalShard):
            return leaf
        found.append((path, leaf))
        return None
    return map_leaves(tree, take)


def new_temp_folder(final: str | os.PathLike) -> str:
    """A fresh temporary folder beside ``final`` for one save (ordinal 0 makes it, every replica writes into
    it); stale ones of killed saves are removed first."""
    folder, base = os.path.split(os.path.abspath(final))
    os.makedirs(folder, exist_ok=True)
    clean_stale_temps(folder)
    tmp = os.path.join(folder, f".{base}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")
    os.mkdir(tmp)
    return tmp


def write_shard(tmp: str, state: Any, rank: int, world_size: int, identity: Identity) -> dict:
    """Write this replica's shard of ``state`` (its :class:`LocalShard` leaves; ordinal 0 also the rest)
    into ``tmp``, with the save's ``identity``; returns its manifest: the identity, the shard's spec CRC32
    and, per sharded leaf, the key path, dtype, global shape and its rows, or ``tied`` (the same LocalShard
    object under a second path, stored once)."""
    found: list[tuple[tuple, LocalShard]] = []
    rest = _split(state, found)
    manifest: list[dict] = []
    stored: list[torch.Tensor] = []
    first: dict[int, int] = {}
    for path, shard in found:
        if id(shard) in first:
            manifest.append({"path": list(path), "tied": first[id(shard)]})
            continue
        first[id(shard)] = len(manifest)
        rows = int(shard.tensor.shape[0]) if shard.tensor.dim() else -1
        if tuple(shard.tensor.shape[1:]) != tuple(shard.shape[1:]) or not 0 <= shard.offset <= shard.shape[0] - rows:
            raise CheckpointError(f"cannot save key '{key_of(path)}': rows {shard.offset}+{rows} of shape "
                                  f"{list(shard.tensor.shape)} are not a dim-0 shard of {list(shard.shape)}")
        manifest.append({"path": list(path), "dtype": fmt.torch_dtype_name(shard.tensor.dtype),
                         "shape": list(shard.shape), "rows": [shard.offset, rows]})
        stored.append(shard.tensor.detach())
    content: dict[str, Any] = {"leaves": stored}
    if rank == 0:
        content["state"] = rest
    tree, leaves = flatten(content)
    # Straight into the private temporary folder (the folder's rename is the commit): no per-file temporary,
    # and no sweep of the folder for stale ones, which on several hosts could take a live replica's for dead.
    path = os.path.join(tmp, shard_name(rank, world_size))
    crc = write_file(path, tree, leaves, None, {fmt.ATTR_CHECKPOINT_ID: identity.checkpoint_id,
                                                fmt.ATTR_CHECKPOINT_STEP: identity.step, fmt.ATTR_SHARD_RANK: rank})
    fsync_path(path)
    return {"checkpoint_id": identity.checkpoint_id, "step": identity.step, "crc32": crc, "leaves": manifest}


def commit(tmp: str, final: str | os.PathLike, manifests: list[dict]) -> None:
    """Ordinal 0, once every replica wrote its shard: write the index from their ``manifests`` (one per
    rank, :func:`write_shard`'s), then rename ``tmp`` to ``final`` (replacing an older checkpoint of that name)."""
    final = os.path.abspath(final)
    first = manifests[0]
    if any((m["checkpoint_id"], m["step"]) != (first["checkpoint_id"], first["step"]) for m in manifests):
        raise CheckpointError(f"cannot save checkpoint to '{final}': the replicas wrote their shards with different "
                              "identities (each replica must get ordinal 0's)")
    leaves = []
    for i, entry in enumerate(first["leaves"]):
        if "tied" in entry:
            leaves.append(entry)
            continue
        rows = [m["leaves"][i]["rows"] for m in manifests]
        leaves.append({"path": entry["path"], "dtype": entry["dtype"], "shape": entry["shape"], "rows": rows})
    index = {"format": FORMAT, "version": VERSION, "world_size": len(manifests),
             "shards": [shard_name(r, len(manifests)) for r in range(len(manifests))],
             "checkpoint_id": first["checkpoint_id"], "step": first["step"],
             "shard_crc32": [m["crc32"] for m in manifests], "leaves": leaves}
    check_index(os.path.join(tmp, INDEX), index)  # what a reader will ask of it, before it commits
    with atomic_path(os.path.join(tmp, INDEX)) as index_tmp, open(index_tmp, "w") as fh:
        json.dump(index, fh)
    fsync_path(tmp, directory=True)
    replace(tmp, final)  # over a folder or a file of the same step: through its aside name (crash-safe)


def discard(tmp: str) -> None:
    """Remove a temporary (a failed save's folder) or a checkpoint (a pruned one: a file or a folder)."""
    remove(tmp)


def save_unsharded_as(state: Any, final: str | os.PathLike, world_size: int,
                      shard_keys: tuple[str, ...] = ("model", "optimizer")) -> None:
    """Write ``state`` (whole tensors) as a sharded checkpoint of ``world_size`` shards, in one process:
    every tensor of at least one dimension under ``shard_keys`` is split by rows as FSDP2 splits it
    (``cs-run checkpoint convert --to sharded``); the rest stays whole in shard 0."""
    seen: dict[tuple[int, int], LocalShard] = {}

    def shards_of(rank: int) -> Any:
        def visit(leaf: Any, path: tuple) -> Any:
            if not (isinstance(leaf, torch.Tensor) and path and path[0] in shard_keys and leaf.dim()):
                return leaf
            if (id(leaf), rank) not in seen:
                offset, rows = rows_of(rank, world_size, leaf.shape[0])
                seen[id(leaf), rank] = LocalShard(leaf[offset:offset + rows], tuple(leaf.shape), offset)
            return seen[id(leaf), rank]
        return map_leaves(state, visit)

    tmp = new_temp_folder(final)
    identity = new_identity(state)
    try:
        manifests = [write_shard(tmp, shards_of(rank), rank, world_size, identity) for rank in range(world_size)]
        commit(tmp, final, manifests)
    except BaseException:
        discard(tmp)
        raise


# ------------------------------------------------------------------------------------------ reading

def _shard_path(folder: str, index: dict, rank: int) -> str:
    """The path of shard ``rank``: a regular file (a FIFO would block the open, a device never end)."""
    path = os.path.join(folder, index["shards"][rank])
    check_regular(path, "the shard")
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint '{folder}': shard '{path}' is missing (the index names "
                              f"{index['world_size']} shards); copy the whole folder, or use another checkpoint")
    return path


def _check_folder(folder: str, index: dict) -> None:
    """:func:`~cs_run.checkpoint.shard_identity.check_shard` of every shard (headers only: no tensor data is read)."""
    for rank in range(index["world_size"]):
        path = _shard_path(folder, index, rank)
        check_shard(path, index, rank, read_header(path))


def _read_shard(folder: str, index: dict, rank: int, verify: bool, lazy: bool) -> tuple[list, Any]:
    """(leaves, state or None) of one shard that :func:`_check_folder` passed."""
    path = _shard_path(folder, index, rank)
    content = h5.load(path, lazy=lazy, verify=verify)
    leaves = content.get("leaves") if isinstance(content, dict) else None
    if not isinstance(leaves, list) or not all(isinstance(t, torch.Tensor) for t in leaves):
        raise bad(path, "not a shard of a sharded checkpoint (no list of tensors under 'leaves')")
    return leaves, content.get("state")


def _insert(tree: Any, path: list, value: Any, where: str) -> Any:
    """``tree`` with the placeholder at ``path`` replaced by ``value`` (containers rebuilt along it)."""
    if not path:
        if tree is not None:
            raise bad(where, "the index names a key whose place in the state holds a value, not a shard")
        return value
    head, rest = path[0], path[1:]
    if isinstance(tree, dict) and head in tree:
        return type(tree)((k, _insert(v, rest, value, where) if k == head else v) for k, v in tree.items())
    if isinstance(tree, (list, tuple)) and type(head) is int and head < len(tree):
        return type(tree)(_insert(v, rest, value, where) if i == head else v for i, v in enumerate(tree))
    raise bad(where, f"the index names key '{key_of(path)}', which the state of shard 0 does not have")


def _assemble(folder: str, index: dict, verify: bool, into: Optional[dict] = None) -> Any:
    """The state with every sharded tensor whole: concatenated from the shards, or copied into ``into``
    (key path -> tensor) where the target has the tensor. The caller has checked the folder (:func:`_check_folder`)."""
    stored = [leaf for leaf in index["leaves"] if "tied" not in leaf]
    locals_: list[list] = []
    state = None
    for rank in range(index["world_size"]):
        leaves, rank_state = _read_shard(folder, index, rank, verify, lazy=True)
        locals_.append(leaves)
        state = rank_state if rank == 0 else state
    where = os.path.join(folder, INDEX)
    whole: list[torch.Tensor] = []
    for i, leaf in enumerate(stored):
        target = (into or {}).get(tuple(leaf["path"]))
        parts = [shard[i] for shard in locals_]
        if target is not None:
            with torch.no_grad():
                for (start, count), part in zip(leaf["rows"], parts):
                    target[start:start + count].copy_(part)
            whole.append(target)
        else:
            whole.append(torch.cat(parts))  # a new tensor, also of one part
    by_stored = iter(whole)
    values: list[torch.Tensor] = []
    for leaf in index["leaves"]:
        values.append(values[leaf["tied"]] if "tied" in leaf else next(by_stored))
        state = _insert(state, leaf["path"], values[-1], where)
    return state


def load(folder: str | os.PathLike, map_location: Any = None, *, verify: bool = True) -> Any:
    """The saved state with every sharded tensor whole (what :func:`cs_run.checkpoint.load` of a one-file
    checkpoint of the same state returns); every shard's CRC32s are checked (``verify``)."""
    folder = os.fspath(folder)
    index = read_index(folder)
    _check_folder(folder, index)
    state = _assemble(folder, index, verify)
    if map_location is None:
        return state
    return map_tensors(state, lambda t: t.to(map_location) if not callable(map_location) else map_location(t, "cpu"))


def _rows_plan(index: dict, want: dict[tuple, Any]) -> tuple[list, dict[int, list]]:
    """The value of each stored leaf (the target's LocalShard or tensor, else a new whole tensor) and, per
    shard, ``(leaf, first row in the shard, rows, destination tensor, first row in it)`` of the rows to
    read: a LocalShard's rows only, from each shard its rows overlap."""
    values: list = []
    plan: dict[int, list] = {}
    for i, leaf in enumerate(x for x in index["leaves"] if "tied" not in x):
        value = want.get(tuple(leaf["path"]))
        if isinstance(value, LocalShard):
            dest, low = value.tensor, value.offset
        else:
            dest = value if isinstance(value, torch.Tensor) else \
                torch.empty(leaf["shape"], dtype=fmt.TORCH_DTYPES[leaf["dtype"]][0])
            value, low = dest, 0
        values.append(value)
        high = low + dest.shape[0]
        for rank, (start, count) in enumerate(leaf["rows"]):
            first, end = max(low, start), min(high, start + count)
            if first < end:
                plan.setdefault(rank, []).append((i, first - start, end - first, dest, first - low))
    return values, plan


def _read_planned_rows(src: H5Source, rank: int, reads: list, verify: bool) -> list[Piece]:
    """Read the planned rows of shard ``rank`` (opened as ``src``, checked against the index)."""
    pieces = []
    stored = _stored_specs(src)
    for i, row, rows, dest, at in reads:
        spec = stored[i]
        out = dest[at:at + rows]
        crc = src.read_rows_into(spec, row, rows, out.detach().reshape(-1).view(torch.uint8).numpy())
        if verify and spec.get("crc") is not None:
            row_bytes = spec["n"] // spec["shape"][0]
            pieces.append(Piece(rank, i, row * row_bytes, rows * row_bytes, crc, spec["crc"], spec["n"]))
    return pieces


def _stored_specs(src: H5Source) -> list[dict]:
    """The spec of each ``leaves.<i>`` of a checked shard (a tie resolved to the spec holding the bytes)."""
    by_key = {spec["key"]: src.specs[spec["tied"]] if "tied" in spec else spec for spec in src.specs}
    return [by_key[f"leaves.{i}"] for i in range(sum(1 for k in by_key if k.startswith("leaves.")))]


def _open_checked(folder: str, index: dict, ranks: list[int]) -> dict[int, H5Source]:
    """Shards ``ranks`` opened, each checked against the index (:func:`~cs_run.checkpoint.shard_identity.check_shard`) before any is read;
    the caller closes them."""
    opened: dict[int, H5Source] = {}
    try:
        for rank in ranks:
            path = _shard_path(folder, index, rank)
            tree, opened[rank] = h5.open_source(path, verify=False)  # CRC32s are checked by pieces (check_pieces)
            check_shard(path, index, rank, header_of(path, tree, opened[rank]))
    except BaseException:
        for src in opened.values():
            src.close()
        raise
    return opened


def read_rows(folder: str | os.PathLike, target: Any, *, verify: bool = True) -> tuple[Any, list[Piece]]:
    """The state of a sharded checkpoint with each tensor ``target`` holds as a :class:`LocalShard` read
    into that shard's tensor, its rows only (from the checkpoint shards they overlap: several when the
    world size differs), the target's whole tensors read in place and the others whole; shard 0's state
    (whole tensors, step, schedule, ...) read by every caller. Returns it with the CRC32 :class:`Piece` of
    every byte range read: a replica checks its pieces joined with the other replicas' (:func:`check_pieces`),
    since one replica's rows of a shard need not be the whole of it.

    The shards it reads (shard 0 and those its rows overlap) are checked against the index
    (:func:`~cs_run.checkpoint.shard_identity.check_shard`: headers and attributes, no tensor data) before any row is read; every shard
    holding rows is read, so checked, by some replica."""
    folder = os.fspath(folder)
    index = read_index(folder)
    want = {p: t for p, t in leaf_paths(target).items() if isinstance(t, (torch.Tensor, LocalShard))}
    for p, t in want.items():
        if isinstance(t, LocalShard) and (t.tensor.shape[1:] != t.shape[1:] or not t.tensor.is_contiguous()
                                          or not 0 <= t.offset <= t.shape[0] - t.tensor.shape[0]):
            raise CheckpointError(f"cannot read key '{key_of(p)}' into rows {t.offset}+{t.tensor.shape[0]} of "
                                  f"{list(t.shape)}: not a contiguous dim-0 shard of it")
    values, plan = _rows_plan(index, want)
    opened = _open_checked(folder, index, sorted({0, *plan}))
    try:
        _check_target(folder, index, {p: torch.empty(t.shape, dtype=t.tensor.dtype, device="meta")
                                      if isinstance(t, LocalShard) else t for p, t in want.items()})
        pieces: list[Piece] = []
        for rank, src in opened.items():
            pieces += _read_planned_rows(src, rank, plan.get(rank, []), verify)
    finally:
        for src in opened.values():
            src.close()
    in_shards = {tuple(leaf["path"]) for leaf in index["leaves"]}
    whole = {p: t for p, t in want.items() if isinstance(t, torch.Tensor) and p not in in_shards}
    shard0 = _shard_path(folder, index, 0)
    state = h5.load_into(shard0, {"state": _nest(whole)} if whole else {}, verify=verify,
                         skip=lambda p: p[0] == "leaves")["state"]
    by_stored = iter(values)
    placed: list = []
    where = os.path.join(folder, INDEX)
    for leaf in index["leaves"]:
        placed.append(placed[leaf["tied"]] if "tied" in leaf else next(by_stored))
        state = _insert(state, leaf["path"], placed[-1], where)
    return state, pieces


def check_pieces(folder: str | os.PathLike, pieces: list[Piece]) -> int:
    """Join the :class:`~cs_run.checkpoint.crc.Piece` CRC32s of each shard's leaf (every replica's) and raise
    naming the shard and its keys where they differ from the recorded ones; returns how many leaves were
    checked (those whose pieces cover them whole)."""
    folder = os.fspath(folder)
    joined = join(pieces)
    damaged: dict[int, list[str]] = {}
    for (shard, leaf), sound in sorted(joined.items()):
        if sound is False:
            damaged.setdefault(shard, []).append(f"leaves.{leaf}")
    for shard, keys in sorted(damaged.items()):
        index = read_index(folder)
        raise_if_damaged(os.path.join(folder, index["shards"][shard]), keys)
    return sum(1 for sound in joined.values() if sound is not None)


def _target_tensors(target: Any) -> dict[tuple, torch.Tensor]:
    return {p: t for p, t in leaf_paths(target).items() if isinstance(t, torch.Tensor)}


def _check_target(folder: str, index: dict, want: dict[tuple, torch.Tensor]) -> None:
    sharded = {tuple(leaf["path"]): leaf for leaf in index["leaves"]}
    for p, t in want.items():
        leaf = sharded.get(p)
        if leaf is None:
            continue
        leaf = index["leaves"][leaf["tied"]] if "tied" in leaf else leaf
        if (leaf["dtype"], list(leaf["shape"])) != (fmt.torch_dtype_name(t.dtype), list(t.shape)):
            raise TargetMismatchError(f"checkpoint '{folder}': key '{key_of(p)}' is {leaf['dtype']}{leaf['shape']} in "
                                      f"the checkpoint but {fmt.torch_dtype_name(t.dtype)}{list(t.shape)} in the target")
    rest = {p: t for p, t in want.items() if p not in sharded}
    if rest:  # the whole tensors of shard 0's state (their keys under "state")
        shard0 = _shard_path(folder, index, 0)
        try:
            h5.check_target(shard0, {"state": _nest(rest)})
        except TargetMismatchError as err:
            raise TargetMismatchError(str(err).replace("'state.", "'")) from None


def _nest(flat: dict[tuple, torch.Tensor]) -> dict:
    """Key paths -> nested dicts (integer keys stay integers, as the state's optimizer indices)."""
    out: dict = {}
    for path, t in flat.items():
        node = out
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = t
    return out


def check_target(folder: str | os.PathLike, target: Any) -> None:
    """:func:`cs_run.checkpoint.h5.check_target` for a sharded folder: every shard's header is checked against
    the index first (:func:`_check_folder`), so a damaged or mixed folder is damage (an autoload falls back
    past it), never a model mismatch; then the target against the index and shard 0's header. No tensor data."""
    folder = os.fspath(folder)
    index = read_index(folder)
    _check_folder(folder, index)
    _check_target(folder, index, _target_tensors(target))


def load_into(folder: str | os.PathLike, target: Any, *, verify: bool = True) -> Any:
    """Restore a sharded checkpoint into the whole tensors of ``target`` (each shard's rows copied into
    place) and return the full structure, as :func:`cs_run.checkpoint.h5.load_into` does."""
    folder = os.fspath(folder)
    index = read_index(folder)
    want = _target_tensors(target)
    _check_folder(folder, index)  # damage before a mismatch, as check_target
    _check_target(folder, index, want)
    state = _assemble(folder, index, verify, into=want)
    have = leaf_paths(state)
    with torch.no_grad():  # the whole (unsharded) tensors of shard 0's state
        for p, t in want.items():
            if p in have and isinstance(have[p], torch.Tensor) and have[p] is not t:
                t.copy_(have[p])
    return map_leaves(state, lambda leaf, path: want.get(path, leaf))


def check(folder: str | os.PathLike) -> None:
    """Raise unless ``folder`` is a committed sharded checkpoint whose index is sound and whose shard
    files are all there and readable (headers only: no tensor data is read)."""
    folder = os.fspath(folder)
    _check_folder(folder, read_index(folder))


def info(folder: str | os.PathLike, verify: bool = False) -> dict:
    """:func:`cs_run.checkpoint.h5.info` of the assembled state: each sharded tensor with its global shape
    (and the shard count in ``world_size``); with ``verify`` every shard's CRC32s are checked. The folder is
    checked as every read checks it (:func:`_check_folder`), so what info passes a load reads."""
    folder = os.fspath(folder)
    index = read_index(folder)
    _check_folder(folder, index)
    shard0 = info0 = None
    damaged: list[str] = []
    unverified: list[str] = []
    verified = 0
    for rank in range(index["world_size"]):
        path = _shard_path(folder, index, rank)
        described = h5.info(path, verify=verify)
        if rank == 0:
            shard0, info0 = path, described
        if verify:
            damaged += [f"{os.path.basename(path)}:{k}" for k in described["damaged"]]
            unverified += described["unverified"]
            verified += described["verified"]
    assert info0 is not None and shard0 is not None
    by_key = {key_of(leaf["path"]): leaf for leaf in index["leaves"]}
    keys = []
    for entry in info0["keys"]:
        if not entry["key"].startswith("state."):
            continue
        entry = {**entry, "key": entry["key"][len("state."):]}
        leaf = by_key.get(entry["key"])
        if leaf is not None:
            base = index["leaves"][leaf["tied"]] if "tied" in leaf else leaf
            entry = {"key": entry["key"], "type": "tensor", "dtype": base["dtype"], "shape": list(base["shape"]),
                     "nbytes": 0 if "tied" in leaf else math.prod(base["shape"]) * _itemsize(base["dtype"])}
            if "tied" in leaf:
                entry["tied_to"] = key_of(base["path"])
        keys.append(entry)
    out = {"path": folder, "format": FORMAT, "version": index["version"], "world_size": index["world_size"], "keys": keys,
           "num_tensors": sum(1 for k in keys if k["type"] in ("tensor", "ndarray") and "tied_to" not in k),
           "total_bytes": sum(k["nbytes"] for k in keys), **h5.summarize(keys)}
    if verify:
        out.update(damaged=damaged, unverified=unverified, verified=verified)
    return out


def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=fmt.TORCH_DTYPES[dtype][0]).element_size()

