"""Which save a shard of a sharded checkpoint belongs to, and the one check of a shard against its index.

A save draws a random id (:func:`new_identity`); every shard records it, the step and its rank as HDF5
attributes (checkpoint/format.py), and the index records the id, the step and each shard's
``__structure_crc32__``: the CRC32 of its spec, which records the CRC32 of every tensor in it. Every read
of a sharded checkpoint checks each shard it opens with :func:`check_shard` (identity first, then each
leaf's dtype and shape, then shard 0's places for the sharded tensors) before it uses a tensor byte, so a
shard of another save, of another step, or rewritten since is one error naming it and what differs.

Cost: the check reads the shard's header only, which every read opens anyway (three small attributes
more). The spec's CRC32 is an attribute the header read already holds to the spec's text, so comparing
it with the index reads no tensor data; the tensor bytes are then held to the spec's CRC32s by the read
itself (``verify``, or a sharded run's joined row pieces), which binds every byte to the index.

A folder written before (index version 1) has no identity: its shards are read as before, with one
logged note per folder and process; a shard with an identity in such a folder is refused.
"""

from __future__ import annotations

import logging
import numbers
import os
import secrets
from dataclasses import dataclass
from typing import Any, Optional

import torch

from cs_run.checkpoint import format as fmt
from cs_run.checkpoint import h5
from cs_run.checkpoint.h5_checks import attr_value
from cs_run.checkpoint.reader import H5Source
from cs_run.checkpoint.shard_index import bad, key_of
from cs_run.checkpoint.tree import tree_paths

__all__ = ["Header", "Identity", "check_shard", "header_of", "new_identity", "read_header"]

logger = logging.getLogger("cs_run.checkpoint.sharded")  # the sharded checkpoint's log, whichever module notes


@dataclass(frozen=True)
class Identity:
    """Which save a sharded checkpoint is: ordinal 0 draws it once per save, every shard and the index record it."""

    checkpoint_id: str  # 32 random hex digits
    step: int  # the saved global step, -1 when the state records none


def new_identity(state: Any) -> Identity:
    """A fresh identity for one save of ``state`` (its ``global_step``)."""
    step = state.get("global_step") if isinstance(state, dict) else None
    if isinstance(step, torch.Tensor) and step.numel() == 1 and not step.is_floating_point():
        step = step.item()
    ok = isinstance(step, numbers.Integral) and not isinstance(step, bool) and step >= 0
    return Identity(secrets.token_hex(16), int(step) if ok else -1)


@dataclass(frozen=True)
class Header:
    """What a shard's header says (no tensor data read): its identity attributes, its spec's CRC32, the
    dtype name and shape of each stored leaf, whether it holds the state and where the state has None."""

    checkpoint_id: Optional[str]
    step: Optional[int]
    rank: Optional[int]
    spec_crc: Optional[int]
    leaves: list[tuple[str, list]]
    has_state: bool
    placeholders: frozenset


def header_of(path: str, tree: Any, src: H5Source) -> Header:
    """The :class:`Header` of an opened shard; ``leaves`` of another kind than tensors is no shard."""
    paths = tree_paths(tree)
    # a leaf stored as a tie to another (the writer stores equal views once: empty shards) has its shape
    specs = {paths[j]: src.specs[spec["tied"]] if "tied" in spec else spec for j, spec in enumerate(src.specs)}
    stored = [specs.get(("leaves", j)) for j in range(sum(1 for p in specs if p[0] == "leaves"))]
    if not all(spec is not None and spec["type"].startswith("torch.") for spec in stored):
        raise bad(path, "not a shard of a sharded checkpoint (no list of tensors under 'leaves')")

    def attr(name: str, kind: type) -> Any:
        value = attr_value(path, src.f, name, 256)
        value = value.decode(errors="replace") if isinstance(value, bytes) else value
        value = int(value) if kind is int and isinstance(value, numbers.Integral) else value
        if value is not None and not isinstance(value, kind):
            raise bad(path, f"its attribute {name} is {value!r}, not what a cs-run shard records")
        return value
    return Header(attr(fmt.ATTR_CHECKPOINT_ID, str), attr(fmt.ATTR_CHECKPOINT_STEP, int), attr(fmt.ATTR_SHARD_RANK, int),
                   attr(fmt.ATTR_STRUCTURE_CRC, int),
                   [(spec["type"][len("torch."):], list(spec["shape"])) for spec in stored],
                   any(p[0] == "state" for p in specs),
                   frozenset(p[1:] for p, spec in specs.items() if p[0] == "state" and spec["type"] == "none"))


def read_header(path: str) -> Header:
    """The :class:`Header` of the shard at ``path`` (opened for its header only)."""
    tree, src = h5.open_source(path, verify=False)
    try:
        return header_of(path, tree, src)
    finally:
        src.close()


_NOTED: set[str] = set()  # the folders of identity-less (version 1) checkpoints already noted in this process


def _check_identity(path: str, index: dict, rank: int, header: Header) -> None:
    """The shard is shard ``rank`` of the save the index names (id, step, rank, its spec's CRC32)."""
    fix = "the folder mixes files of different saves; copy the whole folder of one save, or use another checkpoint"
    if "checkpoint_id" not in index:  # version 1: written before shards carried an identity
        if header.checkpoint_id is not None:
            raise bad(path, f"the shard is of save {header.checkpoint_id} (step {header.step}) but the index "
                            f"(version 1) names no save; {fix}")
        folder = os.path.dirname(path)
        if folder not in _NOTED:
            _NOTED.add(folder)
            logger.warning("Checkpoint %s was written before sharded checkpoints carried an identity (index version 1): "
                           "its shards are read without checking that they are of one save; re-save it to add one "
                           "(cs-run checkpoint convert %s NEW --to sharded --shards %d)", folder, folder,
                           index["world_size"])
        return
    if header.checkpoint_id is None:
        raise bad(path, f"the shard carries no identity (no {fmt.ATTR_CHECKPOINT_ID} attribute) but the index names "
                        f"save {index['checkpoint_id']} at step {index['step']}; {fix}")
    differs = []
    if header.checkpoint_id != index["checkpoint_id"]:
        differs.append(f"its id {header.checkpoint_id} is not the index's {index['checkpoint_id']}")
    if header.step != index["step"]:
        differs.append(f"its step {header.step} is not the index's {index['step']}")
    if header.rank != rank:
        differs.append(f"it is shard {header.rank}, not {rank}")
    if header.spec_crc != index["shard_crc32"][rank]:
        crc = "none" if header.spec_crc is None else f"{header.spec_crc:08x}"
        differs.append(f"its checksum (spec CRC32) {crc} is not the index's {index['shard_crc32'][rank]:08x}")
    if differs:
        raise bad(path, f"not shard {rank} of this checkpoint: {'; '.join(differs)}; {fix}")


def check_shard(path: str, index: dict, rank: int, header: Header) -> None:
    """The one check of a shard against the index, before any of its tensor bytes is used: its identity
    (_check_identity), then its ``leaves`` (dtype name, shape each) and, for shard 0, a state with
    None at every key the index names, so every read verb (load, load_into, rows, check, info) refuses the
    same folders."""
    _check_identity(path, index, rank, header)
    stored = [leaf for leaf in index["leaves"] if "tied" not in leaf]
    if len(header.leaves) != len(stored) or (rank == 0) != header.has_state:
        raise bad(path, f"not shard {rank} of the index beside it (it should hold {len(stored)} leaves"
                         f"{' and the state' if rank == 0 else ''}); the index and the shards are of different checkpoints")
    for leaf, (dtype, shape) in zip(stored, header.leaves):
        want = [leaf["rows"][rank][1], *leaf["shape"][1:]]
        if dtype != leaf["dtype"] or list(shape) != want:
            raise bad(path, f"key '{key_of(leaf['path'])}' is {dtype}{list(shape)} in this shard but the index says "
                             f"{leaf['dtype']}{want} (rows {leaf['rows'][rank][0]}.. of {leaf['shape']}); "
                             "the index and the shards are of different checkpoints")
    if rank == 0:
        for leaf in index["leaves"]:
            if tuple(leaf["path"]) not in header.placeholders:
                raise bad(path, f"the index names key '{key_of(leaf['path'])}', which the state of this shard does not "
                                 "hold as a sharded tensor's place; the index and the shards are of different checkpoints")
