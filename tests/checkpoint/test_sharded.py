"""Sharded checkpoint folders (cs_run.checkpoint.sharded) without replicas: a state written as N shards
reads back bit-identical to the one-file form (ties kept, shards of 0 rows included), converts both ways,
restores into existing tensors, is listed and pruned by the runner like a file; and every damaged or
hostile folder is one ``Error:`` line naming the file, with a non-zero exit and nothing written.

The reference is the state itself and the one-file .mdl of it (cs_run.checkpoint.save): the shards hold
the same bytes rearranged, so every comparison is exact (torch.equal)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import cs_run as cstorch
from cs_run.checkpoint import atomic, h5, sharded
from cs_run.checkpoint.h5 import TargetMismatchError
from cs_run.checkpoint.reader import H5Source
from cs_run.checkpoint.tree import map_leaves
from cs_run.errors import CheckpointError
from cs_run.frontends.cli import cli
from cs_run.runners._checkpoint_files import latest_checkpoint, list_checkpoints, prune_checkpoints
from tests.h5_damage import flip_a_data_byte


def _state() -> dict:
    g = torch.Generator().manual_seed(0)
    wte = torch.randn(7, 4, generator=g)
    model = {"wte.weight": wte, "h.0.bias": torch.randn(4, generator=g), "one_row": torch.randn(1, 3, generator=g),
             "lm_head.weight": wte, "mask": torch.ones(2, 2, dtype=torch.bool), "bf16": torch.randn(5, generator=g).bfloat16()}
    optimizer = {"state": {0: {"exp_avg": torch.randn(7, 4, generator=g), "step": torch.tensor(3.0)}},
                 "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0]}]}
    return {"model": model, "optimizer": optimizer, "global_step": 12, "rng": {"torch": torch.arange(4, dtype=torch.uint8)}}


def _flat(tree, prefix="") -> dict:
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, sub in enumerate(tree) for k, v in _flat(sub, f"{prefix}{i}.").items()}
    return {prefix[:-1]: tree}


def _assert_equal(a, b) -> None:
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for key, value in fa.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == fb[key].dtype and torch.equal(value, fb[key]), key
        else:
            assert value == fb[key], key


def _invoke(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


@pytest.mark.parametrize("shards", [1, 2, 3, 8])
def test_a_state_written_as_shards_reads_back_as_the_one_file_form(tmp_path, shards):
    state = _state()
    sharded.save_unsharded_as(state, tmp_path / "c.mdl", shards)
    loaded = cstorch.load(tmp_path / "c.mdl")
    _assert_equal(state, loaded)
    assert loaded["model"]["lm_head.weight"] is loaded["model"]["wte.weight"]  # tied: stored once, one tensor
    index = json.loads((tmp_path / "c.mdl" / "index.json").read_text())
    assert index["world_size"] == shards and len(list((tmp_path / "c.mdl").glob("shard_*.h5"))) == shards
    # torch.chunk's rows (DTensor Shard(0)): 7 rows over 8 shards are 1 each and an empty last one
    wte = next(leaf for leaf in index["leaves"] if leaf["path"] == ["model", "wte.weight"])
    assert [n for _, n in wte["rows"]] == [len(c) for c in torch.arange(7).chunk(shards)] + [0] * (
        shards - len(torch.arange(7).chunk(shards)))


def test_convert_goes_to_one_file_and_back_exactly_and_info_shows_whole_shapes(tmp_path):
    state = _state()
    cstorch.save(state, tmp_path / "one.mdl")
    result = _invoke("checkpoint", "convert", tmp_path / "one.mdl", tmp_path / "four.mdl", "--to", "sharded",
                     "--shards", 4)
    assert result.exit_code == 0, result.output
    result = _invoke("checkpoint", "convert", tmp_path / "four.mdl", tmp_path / "back.mdl")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "back.mdl").is_file()
    _assert_equal(cstorch.load(tmp_path / "one.mdl"), cstorch.load(tmp_path / "back.mdl"))
    result = _invoke("checkpoint", "info", tmp_path / "four.mdl", "--verify")
    assert result.exit_code == 0, result.output
    assert "global step: 12" in result.output and "checksums: " in result.output and " 0 damaged" in result.output
    line = next(line for line in result.output.splitlines() if line.startswith("model.wte.weight "))
    assert "float32[7, 4]" in line
    assert "tied to model.wte.weight" in next(line for line in result.output.splitlines()
                                              if line.startswith("model.lm_head.weight "))
    assert cstorch.checkpoint.info(tmp_path / "four.mdl")["num_parameters"] == \
        cstorch.checkpoint.info(tmp_path / "one.mdl")["num_parameters"]


def test_restores_into_existing_tensors_and_refuses_a_target_of_another_shape(tmp_path):
    state = _state()
    sharded.save_unsharded_as(state, tmp_path / "c.mdl", 3)
    target = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items() if k != "lm_head.weight"}}
    loaded = cstorch.checkpoint.load_into(tmp_path / "c.mdl", target)
    for key, t in target["model"].items():
        assert torch.equal(t, state["model"][key]) and loaded["model"][key] is t, key
    assert loaded["global_step"] == 12
    with pytest.raises(TargetMismatchError, match=r"key 'model.wte.weight' is float32\[7, 4\] in the checkpoint but "
                                                  r"float32\[7, 5\] in the target"):
        cstorch.checkpoint.check_target(tmp_path / "c.mdl", {"model": {"wte.weight": torch.zeros(7, 5)}})
    with pytest.raises(TargetMismatchError, match="key 'model.mask'"):  # a whole tensor of shard 0's state
        cstorch.checkpoint.check_target(tmp_path / "c.mdl", {"model": {"mask": torch.zeros(2, 2)}})


def test_the_runner_lists_and_prunes_committed_folders_only(tmp_path):
    state = _state()
    cstorch.save(state, tmp_path / "checkpoint_5.mdl")
    sharded.save_unsharded_as(state, tmp_path / "checkpoint_10.mdl", 2)
    sharded.save_unsharded_as(state, tmp_path / "checkpoint_10.mdl", 3)  # the same step again: replaced whole
    assert json.loads((tmp_path / "checkpoint_10.mdl" / "index.json").read_text())["world_size"] == 3
    (tmp_path / "checkpoint_20.mdl").mkdir()  # a folder without an index is no checkpoint
    temp = sharded.new_temp_folder(tmp_path / "checkpoint_30.mdl")  # a save in progress
    assert [(s, p.name) for s, p in list_checkpoints(tmp_path)] == [(5, "checkpoint_5.mdl"), (10, "checkpoint_10.mdl")]
    prune_checkpoints(tmp_path, 1)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [10] and os.path.isdir(temp)
    sharded.discard(temp)


def _other_state() -> dict:
    """The same keys as :func:`_state`, every tensor and the step changed: which of the two a read returns."""
    state = _state()
    state["model"] = {k: v + 1 if v.dtype != torch.bool else ~v for k, v in state["model"].items()}
    state["model"]["lm_head.weight"] = state["model"]["wte.weight"]
    return {**state, "global_step": 13}


SAVES = {  # how a step's checkpoint is written: one file (a data-parallel run), or N shards (a sharded run)
    "file": lambda state, path: cstorch.save(state, path),
    "2 shards": lambda state, path: sharded.save_unsharded_as(state, path, 2),
    "3 shards": lambda state, path: sharded.save_unsharded_as(state, path, 3),
}
REPLACES = [("file", "2 shards"), ("2 shards", "file"), ("2 shards", "3 shards"), ("file", "file")]


@pytest.mark.parametrize("old, new", REPLACES, ids=[f"{o} by {n}" for o, n in REPLACES])
def test_a_save_replaces_the_same_steps_checkpoint_of_either_form(tmp_path, old, new):
    path = tmp_path / "checkpoint_10.mdl"
    SAVES[old](_state(), path)
    SAVES[new](_other_state(), path)
    _assert_equal(cstorch.load(path), _other_state())
    assert sharded.is_sharded(path) == (new != "file") and os.listdir(tmp_path) == ["checkpoint_10.mdl"]
    assert list_checkpoints(tmp_path) == [(10, path)]


def test_a_save_refuses_a_folder_that_is_not_a_sharded_checkpoint(tmp_path):
    (tmp_path / "checkpoint_10.mdl").mkdir()
    (tmp_path / "checkpoint_10.mdl" / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="is a directory .and not a sharded checkpoint"):
        cstorch.save(_state(), tmp_path / "checkpoint_10.mdl")
    assert (tmp_path / "checkpoint_10.mdl" / "notes.txt").read_text() == "mine"


def _stop_at_rename(monkeypatch, which: int) -> None:
    """Make the ``which``-th rename of :func:`atomic.replace` (1: old aside, 2: new in) or its removal of
    the aside (3) raise, as a kill there would stop the save."""
    rename, discard, count = os.rename, atomic.remove, [0]

    def step(fn):
        def stopping(*args):
            count[0] += 1
            if count[0] == which:
                raise KeyboardInterrupt("killed here")
            return fn(*args)
        return stopping

    monkeypatch.setattr(atomic.os, "rename", step(rename))
    monkeypatch.setattr(atomic, "remove", lambda path: step(discard)(path) if path.endswith(atomic.ASIDE_SUFFIX)
                        else discard(path))


STOPS = [(o, n, at, reads) for o, n in REPLACES[:3] for at, reads in ((2, "old"), (3, "new"))]


@pytest.mark.parametrize("old, new, at, reads", STOPS, ids=[f"{o} by {n}, stopped at step {a}" for o, n, a, _ in STOPS])
def test_a_replacement_stopped_between_its_renames_leaves_a_whole_checkpoint_the_readers_find(
        tmp_path, monkeypatch, old, new, at, reads):
    """Stopped after the old one went aside (2: before the new one moved in; 3: before the aside was
    removed): the step still loads whole (the old checkpoint, or the new), is listed and autoloaded under
    its own name, and the next save of that step recovers the aside and replaces it cleanly."""
    path = tmp_path / "checkpoint_10.mdl"
    SAVES[old](_state(), path)
    SAVES["file"](_state(), tmp_path / "checkpoint_5.mdl")
    with monkeypatch.context() as patch:
        _stop_at_rename(patch, at)
        with pytest.raises(KeyboardInterrupt):
            SAVES[new](_other_state(), path)
    assert os.path.lexists(atomic.aside_path(path)) and path.exists() == (reads == "new")
    expected = {"old": _state(), "new": _other_state()}[reads]
    _assert_equal(cstorch.load(path), expected)
    target = {"model": {k: torch.empty_like(v) for k, v in _state()["model"].items()}}
    _assert_equal(cstorch.checkpoint.load_into(path, target)["model"], expected["model"])
    assert cstorch.checkpoint.is_checkpoint_file(path) and cstorch.checkpoint.info(path)["global_step"] == \
        expected["global_step"]
    assert list_checkpoints(tmp_path) == [(5, tmp_path / "checkpoint_5.mdl"), (10, path)]
    assert latest_checkpoint(tmp_path) == path
    SAVES[new](_other_state(), path)
    _assert_equal(cstorch.load(path), _other_state())
    assert not os.path.lexists(atomic.aside_path(path))
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".") and not n.endswith(atomic.TMP_SUFFIX)]


def test_pruning_removes_a_checkpoint_left_under_its_aside_name(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint_10.mdl"
    SAVES["2 shards"](_state(), path)
    with monkeypatch.context() as patch:
        _stop_at_rename(patch, 2)
        with pytest.raises(KeyboardInterrupt):
            SAVES["file"](_other_state(), path)
    SAVES["file"](_state(), tmp_path / "checkpoint_20.mdl")
    prune_checkpoints(tmp_path, 1)
    assert list_checkpoints(tmp_path) == [(20, tmp_path / "checkpoint_20.mdl")]
    assert not os.path.lexists(atomic.aside_path(path))


def _replica_target(state: dict, index: dict, rank: int, world: int) -> dict:
    """What replica ``rank`` of ``world`` reads into: a LocalShard of its rows (torch.chunk's split) for
    each tensor the index shards, an empty whole tensor for the rest (read in place)."""
    sharded_paths = {tuple(leaf["path"]) for leaf in index["leaves"]}
    made: dict[int, sharded.LocalShard] = {}

    def visit(leaf, path):
        if not isinstance(leaf, torch.Tensor):
            return leaf
        if path not in sharded_paths:
            return torch.empty_like(leaf)
        if id(leaf) not in made:  # tied: one LocalShard
            offset, rows = sharded.rows_of(rank, world, leaf.shape[0])
            made[id(leaf)] = sharded.LocalShard(torch.empty((rows, *leaf.shape[1:]), dtype=leaf.dtype),
                                                tuple(leaf.shape), offset)
        return made[id(leaf)]
    return map_leaves({k: state[k] for k in ("model", "optimizer")}, visit)


def _record_reads(monkeypatch) -> list[tuple]:
    """Every read of a shard's tensor bytes: (shard file, key, first row, rows) of each row read, and
    (shard file, key, "whole") of any other read of a ``leaves.`` key (none may happen)."""
    seen: list[tuple] = []
    rows = H5Source.read_rows_into

    def read_rows_into(self, spec, row, count, buf):
        seen.append((Path(self.path).name, spec["key"], row, count))
        return rows(self, spec, row, count, buf)
    monkeypatch.setattr(H5Source, "read_rows_into", read_rows_into)
    for name in ("read_bytes_into", "read_into", "check_mapped", "tensor"):
        original = getattr(H5Source, name)

        def whole(self, spec, *args, _original=original, **kwargs):
            if spec["key"].startswith("leaves."):
                seen.append((Path(self.path).name, spec["key"], "whole"))
            return _original(self, spec, *args, **kwargs)
        monkeypatch.setattr(H5Source, name, whole)
    return seen


RESHARDS = [(4, 2), (2, 4), (3, 2), (1, 3), (2, 2), (8, 3)]  # (the checkpoint's shards, the replicas reading it)


@pytest.mark.parametrize("shards, world", RESHARDS, ids=[f"{n} shards read by {m}" for n, m in RESHARDS])
def test_each_replica_reads_only_its_rows_from_the_shards_that_hold_them(tmp_path, monkeypatch, shards, world):
    """The reference for the rows is the state itself, sliced by torch.chunk's split; the expected reads
    are the overlaps of the replica's rows with each shard's rows, computed here from the same split. The
    CRC32s of all replicas' pieces, joined, check every stored leaf (one replica's alone need not)."""
    state = _state()
    folder = tmp_path / "c.mdl"
    sharded.save_unsharded_as(state, folder, shards)
    index = json.loads((folder / "index.json").read_text())
    stored = [leaf for leaf in index["leaves"] if "tied" not in leaf]
    pieces = []
    for rank in range(world):
        seen = _record_reads(monkeypatch)
        target = _replica_target(state, index, rank, world)
        loaded, mine = sharded.read_rows(folder, target)
        monkeypatch.undo()
        pieces += mine
        expected = []
        for i, leaf in enumerate(stored):
            low, count = sharded.rows_of(rank, world, leaf["shape"][0])
            for s in range(shards):
                start, held = sharded.rows_of(s, shards, leaf["shape"][0])
                first, end = max(low, start), min(low + count, start + held)
                if first < end:
                    expected.append((sharded.shard_name(s, shards), f"leaves.{i}", first - start, end - first))
        assert sorted(seen) == sorted(expected)
        flat, whole = _flat(loaded), _flat(state)
        assert flat.keys() == whole.keys()
        for key, value in flat.items():
            if isinstance(value, sharded.LocalShard):
                rows = whole[key][value.offset:value.offset + value.tensor.shape[0]]
                assert value.shape == tuple(whole[key].shape) and torch.equal(value.tensor, rows), key
            elif isinstance(value, torch.Tensor):
                assert torch.equal(value, whole[key]), key
            else:
                assert value == whole[key], key
        assert loaded["model"]["wte.weight"] is loaded["model"]["lm_head.weight"]  # the tie kept
    assert sharded.check_pieces(folder, pieces) == sum(1 for leaf in stored for _, n in leaf["rows"] if n)


def test_rows_are_read_from_a_shard_that_stores_two_leaves_as_one(tmp_path):
    """One parameter under two state_dict keys (the families' ``ln_f`` alias of the final norm) comes from
    FSDP2 as two DTensor objects over one local tensor: the index names two tensors, the shard stores
    their bytes once (a tie), and a read by rows gives each key its rows from it."""
    weight = torch.arange(8.0).reshape(4, 2)
    folder = tmp_path / "c.mdl"
    tmp = sharded.new_temp_folder(folder)
    identity = sharded.new_identity({})
    manifests = []
    for rank in range(2):
        local = weight[2 * rank:2 * rank + 2]
        state = {"model": {k: sharded.LocalShard(local, (4, 2), 2 * rank) for k in ("ln_f.weight", "norm.weight")}}
        manifests.append(sharded.write_shard(tmp, state, rank, 2, identity))
    sharded.commit(tmp, folder, manifests)
    _, src = h5.open_source(str(_shard(folder, 1)))
    src.close()
    assert [spec.get("tied") for spec in src.specs] == [None, 0]  # what the read must resolve
    pieces = []
    for rank in range(2):  # two replicas, then each key's rows 1..3 of one
        target = {"model": {k: sharded.LocalShard(torch.empty(2, 2), (4, 2), 2 * rank) for k in ("ln_f.weight", "norm.weight")}}
        loaded, mine = sharded.read_rows(folder, target)
        pieces += mine
        assert all(torch.equal(v.tensor, weight[2 * rank:2 * rank + 2]) for v in loaded["model"].values())
    assert sharded.check_pieces(folder, pieces) == 4
    target = {"model": {k: sharded.LocalShard(torch.empty(3, 2), (4, 2), 1) for k in ("ln_f.weight", "norm.weight")}}
    assert all(torch.equal(v.tensor, weight[1:]) for v in sharded.read_rows(folder, target)[0]["model"].values())


def test_a_damaged_shard_is_found_by_the_replicas_crc_pieces_joined(tmp_path):
    """2 shards read by 4 replicas: each replica reads half of a shard, which alone cannot be checked;
    the four replicas' pieces together find the flipped byte and name the shard."""
    state = _state()
    folder = tmp_path / "c.mdl"
    sharded.save_unsharded_as(state, folder, 2)
    flip_a_data_byte(_shard(folder, 1))
    index = json.loads((folder / "index.json").read_text())
    pieces = [sharded.read_rows(folder, _replica_target(state, index, r, 4))[1] for r in range(4)]
    for mine in pieces:
        sharded.check_pieces(folder, mine)  # what one replica read of a shard: not all of it (or sound)
    with pytest.raises(CheckpointError, match=r"shard_00001_of_00002.h5' is damaged: checksum mismatch"):
        sharded.check_pieces(folder, [p for mine in pieces for p in mine])


def _shard(folder: Path, rank: int) -> Path:
    return next(folder.glob(f"shard_{rank:05d}_of_*.h5"))


def _edit_index(folder: Path, edit) -> None:
    index = json.loads((folder / "index.json").read_text())
    edit(index)
    (folder / "index.json").write_text(json.dumps(index))


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/cs-run-unpickled",))


DAMAGE = {  # name: (damage the 2-shard folder, the file the line names, what it says)
    "missing shard": (lambda d: _shard(d, 1).unlink(), "shard_00001_of_00002.h5", "is missing"),
    "truncated shard": (lambda d: _shard(d, 1).write_bytes(_shard(d, 1).read_bytes()[:600]),
                        "shard_00001_of_00002.h5", "truncated"),
    "index names a wrong shape": (lambda d: _edit_index(d, lambda i: i["leaves"][0]["shape"].__setitem__(1, 5)),
                                  "shard_00000_of_00002.h5", "but the index says float32[4, 5]"),
    "world size not the shard count": (lambda d: _edit_index(d, lambda i: i.__setitem__("world_size", 3)),
                                       "index.json", "world_size 3 but the index names 2 shards"),
    "crc mismatch": (lambda d: flip_a_data_byte(_shard(d, 1)), "shard_00001_of_00002.h5", "checksum mismatch"),
    "index not json": (lambda d: (d / "index.json").write_text('{"format": '), "index.json", "not valid JSON"),
    "index is a pickle": (lambda d: (d / "index.json").write_bytes(pickle.dumps(_Evil())), "index.json", "not valid JSON"),
    "index nested deep": (lambda d: (d / "index.json").write_text("[" * 100_000 + "]" * 100_000), "index.json",
                          "index"),
    "shard name leaves the folder": (lambda d: _edit_index(d, lambda i: i["shards"].__setitem__(1, "../../x.h5")),
                                     "index.json", "world_size 2 but the index names 2 shards"),
    "rows do not add up": (lambda d: _edit_index(d, lambda i: i["leaves"][0]["rows"][1].__setitem__(1, 2)),
                           "index.json", "the shards hold 6 rows of its shape"),
    "tied to itself": (lambda d: _edit_index(d, lambda i: i["leaves"].append({"path": ["x"], "tied": len(i["leaves"])})),
                       "index.json", "\"tied\" must name an earlier stored leaf"),
    "a dtype the format lacks": (lambda d: _edit_index(d, lambda i: i["leaves"][0].__setitem__("dtype", "object")),
                                 "index.json", "dtype 'object' is not one the format stores"),
    "no index (never committed)": (lambda d: (d / "index.json").unlink(), "c.mdl", "is a directory, not a checkpoint"),
}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
@pytest.mark.parametrize("command", ["convert", "info"])
def test_a_damaged_sharded_checkpoint_is_one_error_line_naming_the_file(tmp_path, damage, command):
    folder = tmp_path / "c.mdl"
    state = _state()
    sharded.save_unsharded_as(state, folder, 2)
    make, name, what = DAMAGE[damage]
    make(folder)
    out = tmp_path / "out.mdl"
    args = {"convert": ["checkpoint", "convert", folder, out], "info": ["checkpoint", "info", folder, "--verify"]}
    result = _invoke(*args[command])
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code != 0 and len(errors) == 1, result.output
    assert name in errors[0] and what in errors[0], errors[0]
    assert not out.exists()
    assert not Path("/tmp/cs-run-unpickled").exists()
