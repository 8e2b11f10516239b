"""A replica's rows of a ONE-FILE checkpoint (cs_run.checkpoint.files.read_rows / check_pieces on a
``.mdl`` file, what a sharded run reads at its start): each of N replicas, played here one after another
in one process with torch.chunk's split (sharded.rows_of, FSDP2's Shard(0)), reads only its rows of every
sharded tensor and the rest whole; the rows' CRC32 pieces, joined over the replicas, check every byte.

References: the state itself (every row compared exactly: the same bytes), the split computed here, and
the byte counts of the leaves (what ``os.preadv`` must be asked for: exactly the rank's rows plus the
unsharded tensors, nothing else). Every form the one-file reader takes is in the table: cs-run's own
(contiguous), written compressed or rewritten by another tool (chunked, gzip: HDF5's slice read), the vendor's
(LZ4-compressed, no CRC32s), and torch's pickle-free file (read whole, the rows copied out)."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import pytest
import torch

import cs_run as cstorch
from cs_run.checkpoint import files, foreign, h5, sharded, vendor_format
from cs_run.checkpoint.tree import leaf_paths, map_leaves
from cs_run.errors import CheckpointError
from tests.h5_damage import flip_a_byte_of

VENDOR = Path(__file__).resolve().parents[1] / "data" / "vendor_oracle" / "adamw_step30.mdl"


def _state() -> dict:
    g = torch.Generator().manual_seed(0)
    wte = torch.randn(33, 64, generator=g)  # 33 rows: uneven splits over 2 and 4 (torch.chunk: 17+16, 9+9+9+6)
    model = {"wte.weight": wte, "lm_head.weight": wte, "h.0.w": torch.randn(64, 48, generator=g),
             "h.0.bias": torch.randn(48, generator=g), "one_row": torch.randn(1, 8, generator=g),
             "bf16": torch.randn(40, 3, generator=g).bfloat16()}
    optimizer = {"state": {0: {"exp_avg": torch.randn(64, 48, generator=g), "step": torch.tensor(3.0)}},
                 "param_groups": [{"lr": 0.1, "params": [0]}]}
    return {"model": model, "optimizer": optimizer, "global_step": 12}


def _sharded_paths(state: dict) -> set[tuple]:
    """What FSDP2 shards: every model / optimizer tensor of at least one dimension."""
    return {p for p, t in leaf_paths(state).items() if isinstance(t, torch.Tensor) and t.dim() and p[0] in ("model", "optimizer")}


def _target(state: dict, rank: int, world: int) -> dict:
    """Replica ``rank``'s target: a LocalShard of its rows of each sharded tensor (one per tied tensor),
    an empty tensor of each other one (read in place), everything else as the live state has it."""
    shards, made = _sharded_paths(state), {}

    def visit(leaf, path):
        if not isinstance(leaf, torch.Tensor):
            return leaf
        if path not in shards:
            return torch.empty_like(leaf)
        if id(leaf) not in made:
            offset, rows = sharded.rows_of(rank, world, leaf.shape[0])
            made[id(leaf)] = sharded.LocalShard(torch.empty((rows, *leaf.shape[1:]), dtype=leaf.dtype), tuple(leaf.shape), offset)
        return made[id(leaf)]
    return map_leaves({k: v for k, v in state.items() if k in ("model", "optimizer")}, visit)


def _rewritten(src: Path, dst: Path) -> Path:
    """``src`` as another tool (h5repack) might rewrite it: every tensor chunked and gzip-compressed, at new
    offsets (the reader asks HDF5 for them, and reads rows through HDF5's slice read)."""
    with h5py.File(src, "r") as s, h5py.File(dst, "w") as d:
        for name, ds in s.items():
            if ds.ndim and ds.size > 1:
                d.create_dataset(name, data=ds[()], chunks=True, compression="gzip")
            else:
                s.copy(ds, d, name=name)
            d[name].attrs.update(dict(ds.attrs))
        d.attrs.update(dict(s.attrs))
    return dst


def _cs_run(tmp_path, state):
    cstorch.save(state, tmp_path / "c.mdl")
    return tmp_path / "c.mdl"


FORMS = {  # name -> (write the file, CRC32s recorded)
    "cs-run": (_cs_run, True),
    "cs-run gzip": (lambda tmp_path, state: cstorch.save(state, tmp_path / "g.mdl", compression="gzip") or tmp_path / "g.mdl", True),
    "rewritten": (lambda tmp_path, state: _rewritten(_cs_run(tmp_path, state), tmp_path / "r.mdl"), True),
    "vendor": (lambda tmp_path, state: vendor_format.save(state, str(tmp_path / "v.mdl")) or tmp_path / "v.mdl", False),
    "torch": (lambda tmp_path, state: foreign.save_torch(state, str(tmp_path / "t.pt")) or tmp_path / "t.pt", False),
}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("form", list(FORMS))
def test_each_replica_gets_exactly_its_rows_of_every_form_and_the_joined_pieces_check_every_leaf(tmp_path, form, world):
    state = _state()
    write, crcs = FORMS[form]
    path = write(tmp_path, state)
    whole = leaf_paths(state)
    pieces = []
    for rank in range(world):
        loaded, mine = files.read_rows(path, _target(state, rank, world))
        pieces += mine
        flat = leaf_paths(loaded)
        assert flat.keys() == whole.keys()
        for key, value in flat.items():
            if isinstance(value, sharded.LocalShard):
                offset, rows = sharded.rows_of(rank, world, whole[key].shape[0])
                assert (value.offset, len(value.tensor), value.shape) == (offset, rows, tuple(whole[key].shape)), key
                assert torch.equal(value.tensor, whole[key][offset:offset + rows]), key
            elif isinstance(value, torch.Tensor):
                assert torch.equal(value, whole[key]), key
            else:
                assert value == whole[key], key
        assert loaded["model"]["wte.weight"] is loaded["model"]["lm_head.weight"]  # the tie: one shard
    stored = {p for p in _sharded_paths(state) if p != ("model", "lm_head.weight")}  # the tie is stored once
    assert files.check_pieces(path, pieces) == (len(stored) if crcs else 0)


def _count_preadv(monkeypatch) -> list[int]:
    """The bytes every ``os.preadv`` of the checkpoint reader is asked for (all tensor data of a cs-run file
    is read with it; h5py's reads of the header and small values are not counted)."""
    asked: list[int] = []
    original = os.preadv

    def preadv(fd, buffers, offset, *args):
        asked.append(sum(memoryview(b).nbytes for b in buffers))
        return original(fd, buffers, offset, *args)
    monkeypatch.setattr(os, "preadv", preadv)
    return asked


@pytest.mark.parametrize("world", [2, 4])
def test_each_replica_reads_its_rows_bytes_only_about_one_nth_of_the_sharded_tensors(tmp_path, monkeypatch, world):
    """The bytes asked of the file by each replica are exactly its rows of the sharded tensors (a tied one
    once) plus the unsharded tensors, so ~1/N of the sharded bytes (at most 1/N + one row of each tensor);
    the whole read of the same file asks for every byte."""
    state = _state()
    path = _cs_run(tmp_path, state)
    tensors = leaf_paths(state)
    shards = _sharded_paths(state) - {("model", "lm_head.weight")}
    sharded_bytes = sum(tensors[p].nbytes for p in shards)
    other_bytes = sum(t.nbytes for p, t in tensors.items() if isinstance(t, torch.Tensor) and p not in _sharded_paths(state))
    asked = _count_preadv(monkeypatch)
    h5.load_into(path, map_leaves(state, lambda leaf, _: torch.empty_like(leaf) if isinstance(leaf, torch.Tensor) else leaf))
    # the whole read: every byte, the tied tensor's for each of its two keys (load_into reads each key)
    assert sum(asked) == sharded_bytes + other_bytes + tensors[("model", "lm_head.weight")].nbytes
    for rank in range(world):
        asked.clear()
        files.read_rows(path, _target(state, rank, world))
        rows = sum(tensors[p][slice(*_span(rank, world, tensors[p].shape[0]))].nbytes for p in shards)
        assert sum(asked) == rows + other_bytes
        row_bytes = sum(tensors[p][0].nbytes for p in shards)
        assert rows <= sharded_bytes / world + row_bytes, (rank, rows, sharded_bytes)


def _span(rank: int, world: int, n: int) -> tuple[int, int]:
    offset, rows = sharded.rows_of(rank, world, n)
    return offset, offset + rows


def test_a_damaged_byte_only_the_last_replica_reads_is_found_by_the_pieces_joined(tmp_path):
    """Replica 1 of 2 alone reads the damaged row of h.0.w: neither replica's read can tell (its rows alone
    are not what the CRC32 was recorded of), every replica's pieces joined name the file and key; the
    same list on each replica gives each the same error."""
    state = _state()
    path = _cs_run(tmp_path, state)
    flip_a_byte_of(path, "model.h.0.w", state["model"]["h.0.w"].nbytes - 1)  # the last row: replica 1's
    pieces = [files.read_rows(path, _target(state, rank, 2))[1] for rank in range(2)]
    with pytest.raises(CheckpointError, match=rf"checkpoint '{path}' is damaged: checksum mismatch in 'model.h.0.w'$"):
        files.check_pieces(path, [p for mine in pieces for p in mine])


@pytest.mark.parametrize("which, error", [
    ("only replica 0's pieces", r"the replicas read rows of '.*' that do not cover it \(5 key\(s\)\)"),
    ("a piece missing in the middle", r"the replicas read rows of 'model.h.0.w' that do not cover it \(1 key\(s\)\)"),
])
def test_pieces_that_do_not_cover_a_leaf_are_an_error_not_a_pass(tmp_path, which, error):
    state = _state()
    path = _cs_run(tmp_path, state)
    pieces = [files.read_rows(path, _target(state, rank, 4))[1] for rank in range(4)]
    if which == "only replica 0's pieces":
        chosen = pieces[0]
    else:
        chosen = [p for mine in pieces for p in mine if not (p.leaf == "model.h.0.w" and p.start and p.start + p.nbytes < p.total)]
    with pytest.raises(CheckpointError, match=error):
        files.check_pieces(path, chosen)


def test_a_damaged_unsharded_leaf_fails_every_replicas_own_read(tmp_path):
    """A leaf every replica reads whole (the target holds the bias whole, as FSDP2 leaves a buffer) is
    checked by its own CRC32 during each replica's read, as a whole read checks it."""
    state = _state()
    path = _cs_run(tmp_path, state)
    flip_a_byte_of(path, "model.h.0.bias", 0)
    for rank in range(2):
        target = _target(state, rank, 2)
        target["model"]["h.0.bias"] = torch.empty(48)
        with pytest.raises(CheckpointError, match=rf"'{path}' is damaged: checksum mismatch in 'model.h.0.bias'"):
            files.read_rows(path, target)


def test_a_vendor_file_written_by_the_vendor_reads_by_rows(tmp_path):
    """The vendor's own LZ4-compressed AdamW checkpoint (tests/data/vendor_oracle): each of 2 replicas gets
    its rows of every weight and moment, equal to the whole load's; it records no CRC32s, so no pieces."""
    state = cstorch.load(VENDOR)
    whole = leaf_paths(state)
    for rank in range(2):
        loaded, pieces = files.read_rows(VENDOR, _target(state, rank, 2))
        assert pieces == []
        for key, value in leaf_paths(loaded).items():
            if isinstance(value, sharded.LocalShard):
                assert torch.equal(value.tensor, whole[key][slice(*_span(rank, 2, whole[key].shape[0]))]), key
            elif isinstance(value, torch.Tensor):
                assert torch.equal(value, whole[key]), key
