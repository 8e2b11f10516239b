"""A sharded checkpoint is one save: every shard carries the save's identity (id, step, rank) and the
index each shard's spec CRC32, so a folder that mixes files of different saves, or holds anything but
the files of one save, is refused by every read the same way (docs/architecture.md#sharded-checkpoints).

The table damages the newest checkpoint of a toy run, written as a 2-shard folder, the way a hand copy,
a stale file or a hostile folder would, and takes it through ``cs-run checkpoint info --verify``,
``checkpoint convert``, a run's ``--checkpoint_path`` (train and eval), autoload (which falls back to the
older checkpoint) and one replica's read of its rows (a sharded run's read). The references: the
shard's own HDF5 attributes read with h5py, the error line naming the shard and what differs, and for
autoload a run that trained straight through, bit for bit (resuming from the older checkpoint is exact).
A folder written before shards carried an identity (``data/sharded_v1``, written by the previous
version) still loads, with one logged note.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Callable, NamedTuple

import h5py
import pytest
import torch
from click.testing import CliRunner

import cs_run as cstorch
from cs_run.checkpoint import files, shard_identity, sharded
from cs_run.checkpoint.tree import map_leaves
from cs_run.errors import CheckpointError
from cs_run.frontends.cli import cli

V1 = Path(__file__).parent / "data" / "sharded_v1"  # tests/checkpoint/test_sharded.py's _state(), 2 shards, by 2bfd27e
IDENTITY = ("__checkpoint_id__", "__checkpoint_step__", "__shard_rank__")  # checkpoint/format.py's shard attributes
STRUCTURE_CRC = "__structure_crc32__"


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _resave_sharded(path: Path) -> None:
    state = cstorch.load(path, lazy=False)
    path.unlink()
    sharded.save_unsharded_as(state, path, 2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The toy project: ``md`` (checkpoints of steps 5 and 10 as 2-shard folders), ``other`` (another seed,
    the same shapes and steps), ``ref`` (15 steps straight through, the autoload reference)."""
    spec = importlib.util.spec_from_file_location("_toy_conftest", Path(__file__).parents[1] / "conftest.py")
    toy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(toy)
    root = tmp_path_factory.mktemp("identity")
    (root / "toy_models.py").write_text(toy.TOY_MODULE)
    (root / "params.yaml").write_text(toy.TOY_PARAMS)
    sys.path.insert(0, str(root))
    sys.modules.pop("toy_models", None)
    base = ["--params", root / "params.yaml", "--set", "runconfig.checkpoint_steps=5"]
    for name, steps, extra in (("md", 10, []), ("other", 10, ["--set", "runconfig.seed=9"]), ("ref", 15, [])):
        result = _invoke("train", *base, *extra, "--model_dir", root / name, "--max_steps", steps)
        assert result.exit_code == 0, result.output
    for name in ("md", "other"):
        for step in (5, 10):
            _resave_sharded(root / name / f"checkpoint_{step}.mdl")
    yield {"root": root, "base": base, "md": root / "md", "other": root / "other", "ref": root / "ref"}
    sys.path.remove(str(root))
    sys.modules.pop("toy_models", None)


def _shard(folder: Path, rank: int) -> Path:
    return folder / sharded.shard_name(rank, 2)


def _edit_index(folder: Path, edit: Callable[[dict], None]) -> None:
    index = json.loads((folder / "index.json").read_text())
    edit(index)
    (folder / "index.json").write_text(json.dumps(index))


def _first_matrix(index: dict) -> dict:
    return next(leaf for leaf in index["leaves"] if len(leaf.get("shape", ())) == 2)


def _strip_identity(path: Path) -> None:
    with h5py.File(path, "r+") as f:
        for name in IDENTITY:
            if name in f.attrs:
                del f.attrs[name]


def _rewrite_with_the_saves_identity(folder: Path, runs: dict) -> None:
    """Shard 1 written again, under the save's own id, step and rank, from other data (another run's
    rows): only its checksum can tell."""
    with h5py.File(_shard(folder, 1), "r") as f:
        identity = sharded.Identity(str(f.attrs[IDENTITY[0]]), int(f.attrs[IDENTITY[1]]))
    state = cstorch.load(runs["other"] / folder.name, lazy=False)
    index = json.loads((folder / "index.json").read_text())
    paths = {tuple(leaf["path"]) for leaf in index["leaves"]}

    def rows(leaf, path):
        if path not in paths or not isinstance(leaf, torch.Tensor):
            return leaf
        offset, count = sharded.rows_of(1, 2, leaf.shape[0])
        return sharded.LocalShard(leaf[offset:offset + count], tuple(leaf.shape), offset)
    tmp = sharded.new_temp_folder(folder.parent / "rewritten.mdl")
    sharded.write_shard(tmp, map_leaves(state, rows), 1, 2, identity)
    os.replace(_shard(Path(tmp), 1), _shard(folder, 1))
    sharded.discard(tmp)


class Case(NamedTuple):
    damage: Callable[[Path, dict], None]  # of the newest checkpoint's folder (model_dir/checkpoint_10.mdl), runs
    names: str  # the file the error line names
    says: tuple[str, ...]  # what it says
    not_says: tuple[str, ...] = ()


CASES = {
    "a shard of another run, same step and shapes": Case(
        lambda d, runs: shutil.copy(_shard(runs["other"] / d.name, 1), _shard(d, 1)),
        "shard_00001_of_00002.h5", ("not shard 1 of this checkpoint", "its id ", "its checksum"), ("its step",)),
    "a shard of an earlier step of the same run": Case(
        lambda d, _: shutil.copy(_shard(d.parent / "checkpoint_5.mdl", 1), _shard(d, 1)),
        "shard_00001_of_00002.h5", ("its id ", "its step 5 is not the index's 10", "its checksum")),
    "a shard rewritten under the save's identity": Case(
        _rewrite_with_the_saves_identity, "shard_00001_of_00002.h5", ("its checksum (spec CRC32)",),
        ("its id ", "its step")),
    "shard 0 under shard 1's name": Case(
        lambda d, _: shutil.copy(_shard(d, 0), _shard(d, 1)), "shard_00001_of_00002.h5", ("it is shard 0, not 1",)),
    "a shard that is a FIFO": Case(
        lambda d, _: (_shard(d, 1).unlink(), os.mkfifo(_shard(d, 1))), "shard_00001_of_00002.h5",
        ("a FIFO (named pipe), not a regular file",)),
    "a shard that is a symlink to /dev/zero": Case(
        lambda d, _: (_shard(d, 1).unlink(), os.symlink("/dev/zero", _shard(d, 1))), "shard_00001_of_00002.h5",
        ("a character device, not a regular file",)),
    "an index that is a FIFO": Case(
        lambda d, _: ((d / "index.json").unlink(), os.mkfifo(d / "index.json")), "index.json",
        ("the index is a FIFO (named pipe), not a regular file",)),
    "the index names other shapes": Case(
        lambda d, _: _edit_index(d, lambda i: _first_matrix(i)["shape"].__setitem__(1, _first_matrix(i)["shape"][1] + 1)),
        "shard_00000_of_00002.h5", ("in this shard but the index says float32[4, 7]",)),
    "the index names other dtypes": Case(
        lambda d, _: _edit_index(d, lambda i: _first_matrix(i).__setitem__("dtype", "float64")),
        "shard_00000_of_00002.h5", ("in this shard but the index says float64[4, 6]",)),
    "the index names a key the state lacks": Case(
        lambda d, _: _edit_index(d, lambda i: _first_matrix(i)["path"].__setitem__(-1, "net.9.weight")),
        "shard_00000_of_00002.h5", ("the index names key 'model.net.9.weight', which the state",)),
    "a truncated shard": Case(
        lambda d, _: _shard(d, 1).write_bytes(_shard(d, 1).read_bytes()[:1500]), "shard_00001_of_00002.h5",
        ("is truncated",)),
    "a shard without its identity attributes": Case(
        lambda d, _: _strip_identity(_shard(d, 1)), "shard_00001_of_00002.h5",
        ("the shard carries no identity (no __checkpoint_id__ attribute)",)),
}


@pytest.fixture(params=list(CASES), ids=list(CASES))
def damaged(request, runs, tmp_path):
    """A copy of the run's model_dir whose newest checkpoint has the case's damage."""
    md = tmp_path / "md"
    shutil.copytree(runs["md"], md, symlinks=True)
    case = CASES[request.param]
    case.damage(md / "checkpoint_10.mdl", runs)
    return md, case


def _snapshot(folder: Path) -> dict:
    """Every regular file under ``folder`` by its hash (a FIFO or device is listed, never read)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink()
            else "special" for p in sorted(folder.rglob("*"))}


def _one_error(result, case: Case) -> str:
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    line = lines[0]
    assert case.names in line and all(s in line for s in case.says), line
    assert not any(s in line for s in case.not_says), line
    return line


def test_info_verify_refuses_it(damaged):
    md, case = damaged
    before = _snapshot(md)
    _one_error(_invoke("checkpoint", "info", md / "checkpoint_10.mdl", "--verify"), case)
    assert _snapshot(md) == before


def test_convert_refuses_it_and_writes_nothing(damaged, tmp_path):
    md, case = damaged
    for out in ("c.mdl", "c.pt", "c.safetensors"):
        _one_error(_invoke("checkpoint", "convert", md / "checkpoint_10.mdl", tmp_path / out), case)
        assert not (tmp_path / out).exists()


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_run_started_from_it_refuses_it_before_writing(damaged, runs, tmp_path, mode):
    md, case = damaged
    fresh = tmp_path / "fresh"
    steps = ["--max_steps", 15] if mode == "train" else ["--eval_steps", 1]
    result = _invoke(mode, *runs["base"], "--model_dir", fresh, *steps, "--checkpoint_path", md / "checkpoint_10.mdl")
    assert _one_error(result, case).startswith("Error: --checkpoint_path: ")
    assert not list(fresh.glob("*.mdl"))


def test_autoload_falls_back_past_it_to_the_older_checkpoint(damaged, runs):
    md, case = damaged
    result = _invoke("train", *runs["base"], "--model_dir", md, "--max_steps", 15)
    assert result.exit_code == 0, result.output
    log = (md / "run.log").read_text()
    skipped = next(line for line in log.splitlines() if "Skipping checkpoint" in line)
    assert "checkpoint_10.mdl" in skipped and case.names in skipped and all(s in skipped for s in case.says), skipped
    assert f"Resuming from checkpoint {md / 'checkpoint_5.mdl'} at global step 5" in log
    a, b = cstorch.load(md / "checkpoint_15.mdl", lazy=False), cstorch.load(runs["ref"] / "checkpoint_15.mdl", lazy=False)
    for key in b["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def _replica_target(folder: Path, rank: int, world: int) -> dict:
    """What replica ``rank`` of a sharded run reads into: its rows (torch.chunk's split) of every tensor
    of the model and optimizer, from the checkpoint's undamaged twin's shapes."""
    state = cstorch.load(folder, lazy=False)

    def rows(leaf, path):
        if not isinstance(leaf, torch.Tensor):
            return leaf
        if not leaf.dim():
            return torch.empty_like(leaf)
        offset, count = sharded.rows_of(rank, world, leaf.shape[0])
        return sharded.LocalShard(torch.empty((count, *leaf.shape[1:]), dtype=leaf.dtype), tuple(leaf.shape), offset)
    return map_leaves({k: state[k] for k in ("model", "optimizer")}, rows)


def test_a_replicas_read_of_its_rows_refuses_it(damaged, runs):
    """Replica 1 of 2 reads shard 0 (the state) and shard 1 (its rows): it checks both before reading a row.
    Replica 0 reads no row of shard 1; when it does not refuse, its rows are the undamaged checkpoint's
    (the replicas' errors are gathered, so both stop: tests/parallel)."""
    md, case = damaged
    folder = md / "checkpoint_10.mdl"
    with pytest.raises(CheckpointError) as err:
        files.read_rows(folder, _replica_target(runs["md"] / "checkpoint_10.mdl", 1, 2))
    assert case.names in str(err.value) and all(s in str(err.value) for s in case.says), err.value
    reference = cstorch.load(runs["md"] / "checkpoint_10.mdl", lazy=False)["model"]
    try:
        state, _ = files.read_rows(folder, _replica_target(runs["md"] / "checkpoint_10.mdl", 0, 2))
    except CheckpointError as refused:
        assert all(s in str(refused) for s in case.says), refused
        return
    for key, part in state["model"].items():
        if isinstance(part, sharded.LocalShard):
            assert torch.equal(part.tensor, reference[key][part.offset:part.offset + len(part.tensor)]), key


# ------------------------------------------------------------------------------------- the identity itself

def test_every_shard_and_the_index_record_the_saves_identity(runs, tmp_path):
    """Read back with h5py (libhdf5, not cs-run's reader): each shard's id, step and rank attributes are the
    index's, its __structure_crc32__ is the index's shard_crc32; a second save of the same state is
    another save (another id)."""
    folder = runs["md"] / "checkpoint_10.mdl"
    index = json.loads((folder / "index.json").read_text())
    assert index["version"] == 2 and index["step"] == 10 and len(index["checkpoint_id"]) == 32
    for rank in range(2):
        with h5py.File(_shard(folder, rank), "r") as f:
            assert f.attrs[IDENTITY[0]] == index["checkpoint_id"]
            assert int(f.attrs[IDENTITY[1]]) == 10 and int(f.attrs[IDENTITY[2]]) == rank
            assert int(f.attrs[STRUCTURE_CRC]) == index["shard_crc32"][rank]
    again = tmp_path / "again.mdl"
    sharded.save_unsharded_as(cstorch.load(folder, lazy=False), again, 2)
    assert json.loads((again / "index.json").read_text())["checkpoint_id"] != index["checkpoint_id"]


# ------------------------------------------------------------------- a folder written before the identity

def _v1_state() -> dict:
    from tests.checkpoint.test_sharded import _state
    return _state()


def _assert_same(a, b) -> None:
    from tests.checkpoint.test_sharded import _assert_equal
    _assert_equal(a, b)


def test_a_folder_written_before_the_identity_loads_with_one_note(tmp_path, caplog):
    """data/sharded_v1 was written by the version before this one (index version 1, shards without
    identity attributes): load, load_into, info --verify, convert and two replicas' rows read it as
    before, and the first read logs that its shards cannot be checked to be of one save."""
    folder = tmp_path / "old.mdl"
    shutil.copytree(V1, folder)
    assert json.loads((folder / "index.json").read_text())["version"] == 1
    shard_identity._NOTED.discard(str(folder))
    with caplog.at_level(logging.WARNING, logger="cs_run.checkpoint.sharded"):
        _assert_same(cstorch.load(folder), _v1_state())
        target = {"model": {k: torch.zeros_like(v) for k, v in _v1_state()["model"].items()}}
        _assert_same(cstorch.checkpoint.load_into(folder, target)["model"], _v1_state()["model"])
    notes = [r.getMessage() for r in caplog.records if "carried an identity" in r.getMessage()]
    assert len(notes) == 1 and str(folder) in notes[0], notes
    result = _invoke("checkpoint", "info", folder, "--verify")
    assert result.exit_code == 0 and " 0 damaged" in result.output, result.output
    assert _invoke("checkpoint", "convert", folder, tmp_path / "one.mdl").exit_code == 0
    _assert_same(cstorch.load(tmp_path / "one.mdl"), _v1_state())
    pieces = []
    for rank in range(2):
        state, mine = files.read_rows(folder, _replica_target(folder, rank, 2))
        pieces += mine
        for key, part in state["model"].items():
            if isinstance(part, sharded.LocalShard):
                whole = _v1_state()["model"][key]
                assert torch.equal(part.tensor, whole[part.offset:part.offset + len(part.tensor)]), key
    assert files.check_pieces(folder, pieces) > 0


def test_a_folder_written_before_the_identity_refuses_a_shard_that_has_one(tmp_path):
    """A shard of a new save copied into an old folder: the old index names no save, the shard does."""
    folder = tmp_path / "old.mdl"
    shutil.copytree(V1, folder)
    sharded.save_unsharded_as(_v1_state(), tmp_path / "new.mdl", 2)
    shutil.copy(_shard(tmp_path / "new.mdl", 1), _shard(folder, 1))
    for args in (["info", folder, "--verify"], ["convert", folder, tmp_path / "c.mdl"]):
        result = _invoke("checkpoint", *args)
        assert result.exit_code == 1 and "shard_00001_of_00002.h5': the shard is of save " in result.output, result.output
        assert "the index (version 1) names no save" in result.output
    assert not (tmp_path / "c.mdl").exists()


def _as_written_before(folder: Path) -> None:
    """A folder in the form the previous version wrote: index version 1 without the identity, shards without
    the identity attributes."""
    def old(index: dict) -> None:
        for key in ("checkpoint_id", "step", "shard_crc32"):
            del index[key]
        index["version"] = 1
    _edit_index(folder, old)
    for rank in range(2):
        _strip_identity(_shard(folder, rank))


def test_a_run_autoloads_a_folder_written_before_the_identity(runs, tmp_path):
    md = tmp_path / "md"
    shutil.copytree(runs["md"], md)
    _as_written_before(md / "checkpoint_10.mdl")
    shard_identity._NOTED.discard(str(md / "checkpoint_10.mdl"))
    result = _invoke("train", *runs["base"], "--model_dir", md, "--max_steps", 15)
    assert result.exit_code == 0, result.output
    log = (md / "run.log").read_text()
    assert f"Resuming from checkpoint {md / 'checkpoint_10.mdl'} at global step 10" in log and "Skipping" not in log
    assert "was written before sharded checkpoints carried an identity" in log
    a, b = cstorch.load(md / "checkpoint_15.mdl", lazy=False), cstorch.load(runs["ref"] / "checkpoint_15.mdl", lazy=False)
    for key in b["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


# ---------------------------------------------------------------- a FIFO or device as a one-file checkpoint

class _Unblocker(threading.Thread):
    """Every 5 s, opens ``fifo`` for writing if a reader is stuck in its open (which then reads an empty
    file), so a regression fails this test instead of hanging the suite; does nothing while none is."""

    def __init__(self, fifo: Path) -> None:
        super().__init__(daemon=True)
        self.fifo, self.stop = fifo, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(5):
            try:
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # ENXIO: no reader waits (or not a FIFO)
                pass


SPECIAL = {"a FIFO": ("a FIFO (named pipe)", lambda p: os.mkfifo(p)),
           "a symlink to /dev/zero": ("a character device", lambda p: os.symlink("/dev/zero", p))}


@pytest.mark.parametrize("kind", list(SPECIAL), ids=list(SPECIAL))
def test_a_special_file_as_a_one_file_checkpoint_is_refused_before_it_is_opened(runs, tmp_path, kind):
    what, make = SPECIAL[kind]
    path = tmp_path / "checkpoint_10.mdl"
    make(path)
    unblocker = _Unblocker(path)
    unblocker.start()
    try:
        assert not cstorch.checkpoint.is_checkpoint_file(path)
        for args in (["checkpoint", "info", path, "--verify"], ["checkpoint", "convert", path, tmp_path / "c.pt"],
                     ["eval", *runs["base"], "--model_dir", tmp_path / "md", "--checkpoint_path", path, "--eval_steps", 1]):
            result = _invoke(*args)
            errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
            assert result.exit_code != 0 and len(errors) == 1, result.output
            named = {str(path), os.path.realpath(path)}  # a run names the path its options resolved
            assert any(f"{name}' is {what}, not a regular file" in errors[0] for name in named), errors[0]
        assert not (tmp_path / "c.pt").exists() and not list((tmp_path / "md").glob("*.mdl"))
    finally:
        unblocker.stop.set()
