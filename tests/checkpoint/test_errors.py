"""Bad files give one-line CheckpointErrors naming the file; damaged tensors are named by key."""

from __future__ import annotations

import os

import h5py
import pytest
import torch
from click.testing import CliRunner

from cs_run.checkpoint import info, is_checkpoint_file, load, save
from cs_run.checkpoint.format import ATTR_COMPLETE, ATTR_VERSION
from cs_run.errors import CheckpointError
from cs_run.frontends.checkpoint_cli import checkpoint as cli


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "good.h5"
    save({"model": {"w": torch.arange(4096, dtype=torch.float32), "b": torch.ones(3)}, "step": 5}, path)
    return path


def _error(path, **kwargs) -> str:
    with pytest.raises(CheckpointError) as exc:
        load(path, **kwargs)
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg
    assert not is_checkpoint_file(path)
    return msg


def test_missing_directory_empty_and_non_hdf5(tmp_path):
    assert "does not exist" in _error(tmp_path / "nope.h5")
    assert "is a directory" in _error(tmp_path)
    (tmp_path / "empty.h5").write_bytes(b"")
    assert "is empty" in _error(tmp_path / "empty.h5")
    (tmp_path / "text.h5").write_text("hello, not a checkpoint\n")
    assert "not an HDF5 checkpoint, torch pickle or safetensors" in _error(tmp_path / "text.h5")


@pytest.mark.parametrize("keep", [0.95, 0.5, 0.05, 100])
def test_truncated(tmp_path, good, keep):
    data = good.read_bytes()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(data[: keep if keep > 1 else int(len(data) * keep)])
    msg = _error(cut)
    assert "truncated" in msg or "corrupted" in msg


def test_incomplete_without_marker(tmp_path, good):
    with h5py.File(good, "r+") as f:
        del f.attrs[ATTR_COMPLETE]
    assert "incomplete (no completion marker)" in _error(good)


def test_newer_version(good):
    with h5py.File(good, "r+") as f:
        f.attrs[ATTR_VERSION] = 99
    assert "format version 99, newer than this cs-run reads" in _error(good)


def test_plain_hdf5_file_is_not_a_checkpoint(tmp_path):
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.create_group("g")
    assert "HDF5 file but not a checkpoint" in _error(tmp_path / "x.h5")


def test_garbage_inside_header_is_an_error_not_a_crash(tmp_path, good):
    data = bytearray(good.read_bytes())
    for offset in range(64, 2048, 97):  # superblock and object headers
        data[offset] ^= 0xFF
    bad = tmp_path / "bad.h5"
    bad.write_bytes(bytes(data))
    _error(bad)


def _flip_data_byte(path, key):
    with h5py.File(path, "r") as f:
        offset = f[key].id.get_offset()
    with open(path, "r+b") as fh:
        fh.seek(offset + 100)
        byte = fh.read(1)
        fh.seek(offset + 100)
        fh.write(bytes([byte[0] ^ 0x01]))


def test_bit_flip_named_by_verify(good):
    _flip_data_byte(good, "model.w")
    assert info(good, verify=True)["damaged"] == ["model.w"]
    for lazy in (True, False):  # verified by default
        with pytest.raises(CheckpointError, match=r"damaged: checksum mismatch in 'model.w'"):
            load(good, lazy=lazy)
    load(good, verify=False)  # the documented opt-out loads the damaged bytes
    result = CliRunner().invoke(cli, ["info", str(good), "--verify"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1].startswith("Error: ") and "'model.w'" in result.output


def test_cli_errors_are_one_line(tmp_path):
    for path, code in ((tmp_path / "nope.h5", 2), (tmp_path, 1)):  # a missing path is a usage error
        result = CliRunner().invoke(cli, ["info", str(path)])
        assert result.exit_code == code
        assert result.output.count("\n") == 1 and result.output.startswith("Error: ")


def test_file_rewritten_by_another_tool_falls_back_to_hdf5_offsets(tmp_path, good):
    moved = tmp_path / "moved.h5"
    with h5py.File(good, "r") as src, h5py.File(moved, "w") as dst:  # like h5repack: new offsets
        dst.create_dataset("padding", data=torch.zeros(1000).numpy())
        for name in src:
            src.copy(src[name], dst, name=name)
        for k, v in src.attrs.items():
            dst.attrs[k] = v
    assert torch.equal(load(moved)["model"]["w"], torch.arange(4096, dtype=torch.float32))
    assert info(moved, verify=True)["damaged"] == []


def test_stale_offset_in_spec_never_reads_past_eof(tmp_path):
    path = tmp_path / "c.h5"
    save({"w": torch.ones(10)}, path)
    os.truncate(path, os.path.getsize(path))  # unchanged size: sanity
    assert is_checkpoint_file(path)


def test_random_damage_to_hdf5_structures_is_an_error_or_harmless(tmp_path):
    """Seeded fuzz of the structures the encoder writes (object headers, symbol-table nodes, B-tree, heaps;
    not tensor data, whose damage verify=True reports, nor the checksummed spec): every load either
    raises the one-line error or returns exactly the saved values. A crash would take pytest down."""
    import json
    import random

    path = tmp_path / "c.h5"
    state = {"m": {f"w{i}": torch.arange(i + 1, dtype=torch.float32) for i in range(200)}, "step": 5, "name": "abc"}
    save(state, path)
    data = path.read_bytes()
    with h5py.File(path, "r") as f:
        spec = json.loads(f.attrs["__structure__"])
    protected = bytearray(len(data))
    for leaf in spec["leaves"]:
        if leaf.get("off") is not None:
            protected[leaf["off"]: leaf["off"] + leaf["n"]] = b"\x01" * leaf["n"]
    doc = json.dumps(spec, separators=(",", ":")).encode()
    at = data.find(doc)
    assert at > 0
    protected[at: at + len(doc)] = b"\x01" * len(doc)
    targets = [i for i in range(len(data)) if not protected[i]]
    rng = random.Random(0)
    outcomes = {"error": 0, "intact": 0}
    for _ in range(150):
        bad = bytearray(data)
        for _ in range(rng.choice((1, 2, 4))):
            bad[rng.choice(targets)] = rng.randrange(256)
        damaged = tmp_path / "bad.h5"
        damaged.write_bytes(bytes(bad))
        try:
            got = load(damaged, lazy=False)
        except CheckpointError as err:
            assert "\n" not in str(err) and str(damaged) in str(err)
            outcomes["error"] += 1
            continue
        assert got["step"] == 5 and got["name"] == "abc"
        assert all(torch.equal(got["m"][k], v) for k, v in state["m"].items())
        outcomes["intact"] += 1
    assert outcomes["error"] > 0 and outcomes["intact"] > 0  # both paths were exercised


def test_damaged_layout_never_points_a_tensor_at_other_bytes(tmp_path):
    """A damaged HDF5 layout message that HDF5 and the spec disagree on is caught by the checksums,
    rather than loading another tensor's bytes in its place."""
    import json
    import struct

    path = tmp_path / "c.h5"
    save({"a": torch.arange(16.0), "b": torch.full((16,), 7.0)}, path)
    with h5py.File(path, "r") as f:
        offsets = {leaf["key"]: leaf["off"] for leaf in json.loads(f.attrs["__structure__"])["leaves"]}
    data = bytearray(path.read_bytes())
    layout = bytes([3, 1]) + struct.pack("<QQ", offsets["a"], 64)  # layout message v3, contiguous
    at = data.find(layout)
    assert at > 0
    data[at + 2: at + 10] = struct.pack("<Q", offsets["b"])
    path.write_bytes(bytes(data))
    assert "damaged: checksum mismatch in 'a'" in _error(path)
