"""The hand-written HDF5 encoder, checked against libhdf5 itself (through h5py) as the reference reader."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

from cs_run.checkpoint import h5_encoder
from cs_run.checkpoint.h5_encoder import Attr, H5Encoder, datatype_message, fixed_string_type

DTYPES = ["?", "u1", "i1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8", ">f4", ">i8", "<c8", "<c16"]
SHAPES = [(), (0,), (1,), (5,), (2, 3), (2, 0, 4), (3, 1, 2, 2)]


def _array(dtype: str, shape: tuple, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    arr = raw.view(dtype).reshape(shape)
    return (arr != 0) if dtype == "?" else arr  # only 0/1 are valid bools


def _encode(path, write, texts=(), string_attrs=None, attrs=(), marker=None):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        enc = H5Encoder(fd, 64, [t.encode() for t in texts])
        out = write(enc)
        slot = enc.finish(string_attrs or {}, attrs, marker)
        return out, enc, fd, slot
    finally:
        if marker is None:
            os.close(fd)


def _numbered_datasets(path, names):
    """One int32 dataset per name holding its position in ``names``."""
    one = np.ones(1, np.int32)

    def write(enc):
        for i, name in enumerate(names):
            enc.dataset(name.encode(), datatype_message(one.dtype), (1,), one * i)

    _encode(path, write)


def test_every_dtype_and_shape_reads_back_through_libhdf5(tmp_path):
    path = tmp_path / "a.h5"
    arrays = {f"{d}|{s}": _array(d, s, i) for i, (d, s) in enumerate((d, s) for d in DTYPES for s in SHAPES)}
    kind = Attr("__type__", fixed_string_type(4), b"kind")

    def write(enc):
        return {k: enc.dataset(k.encode(), datatype_message(a.dtype), a.shape, a if a.size else None, [kind])
                for k, a in arrays.items()}

    offsets, *_ = _encode(path, write)
    with h5py.File(path, "r") as f:
        assert sorted(f.keys()) == sorted(arrays)
        for key, arr in arrays.items():
            ds = f[key]
            assert ds.shape == arr.shape and ds.dtype == arr.dtype, key
            np.testing.assert_array_equal(ds[()], arr)
            assert ds.attrs["__type__"] == b"kind"
            assert ds.id.get_offset() == offsets[key]  # the offset the loader memory-maps
            if arr.size:
                assert offsets[key] % 64 == 0
            else:
                assert offsets[key] is None


def test_null_string_and_hard_link_datasets(tmp_path):
    path = tmp_path / "b.h5"
    texts = ["héllo wörld", "", "x" * 100_000]
    w = np.arange(6, dtype=np.float32).reshape(2, 3)

    def write(enc):
        enc.dataset(b"none", datatype_message(np.dtype("i1")), None)
        for i in range(len(texts)):
            enc.string_dataset(f"s{i}".encode(), i)
        enc.dataset(b"w", datatype_message(w.dtype), w.shape, w, refcount=3)
        enc.link(b"tied1", b"w")
        enc.link(b"tied2", b"w")

    _encode(path, write, texts)
    with h5py.File(path, "r") as f:
        assert f["none"].shape is None and f["none"].dtype == np.int8
        assert [f[f"s{i}"][()].decode() for i in range(3)] == texts
        assert f["tied1"] == f["w"] and f["tied2"] == f["w"]  # the same object, not copies
        np.testing.assert_array_equal(f["tied2"][()], w)


def test_thousands_of_links_need_many_symbol_nodes(tmp_path):
    """10,000 names: 79 symbol-table nodes under one B-tree node (internal K above the default 16)."""
    path = tmp_path / "c.h5"
    names = [f"layer{i % 97}.w{i}" for i in range(10_000)]
    _numbered_datasets(path, names)
    with h5py.File(path, "r") as f:
        assert list(f.keys()) == sorted(names, key=str.encode)  # libhdf5 iterates in name order
        for i, name in enumerate(names[::37]):
            assert f[name][0] == i * 37
        assert "layer5.w4" not in f  # a miss is a miss, not a neighbour


def test_file_attributes_large_and_the_reserved_marker(tmp_path):
    path = tmp_path / "d.h5"
    big = ("{" + "a" * 300_000 + "}").encode()  # over the 64 KiB limit of one object header message
    int64 = datatype_message(np.dtype("<i8"))
    marker = Attr("__complete__", int64, np.int64(1).tobytes())
    _, enc, fd, slot = _encode(
        path, lambda enc: None, string_attrs={"__structure__": big, "__format__": b"fmt"},
        attrs=[Attr("__version__", int64, np.int64(7).tobytes())], marker=marker,
    )
    try:
        with h5py.File(path, "r") as f:  # before the marker: a NIL message holds its place
            assert "__complete__" not in f.attrs and len(f) == 0
            assert f.attrs["__structure__"] == big.decode() and f.attrs["__format__"] == "fmt"
        enc.write_reserved(slot, marker)
    finally:
        os.close(fd)
    with h5py.File(path, "r") as f:
        assert f.attrs["__complete__"] == 1 and f.attrs["__version__"] == 7


def test_libhdf5_can_modify_the_file(tmp_path):
    """Structures are valid enough for libhdf5 to extend them (new links, attributes), not just read."""
    path = tmp_path / "e.h5"
    a = np.arange(10.0)

    def write(enc):
        for i in range(300):
            enc.dataset(f"d{i}".encode(), datatype_message(a.dtype), a.shape, a + i)

    _encode(path, write, string_attrs={"note": b"x"})
    with h5py.File(path, "r+") as f:
        for i in range(300):
            f[f"new{i}"] = np.full(3, i)
        f.attrs["more"] = "y" * 70_000
        del f["d5"]
    with h5py.File(path, "r") as f:
        assert len(f) == 599 and "d5" not in f
        np.testing.assert_array_equal(f["d299"][()], a + 299)
        assert f["new250"][1] == 250 and len(f.attrs["more"]) == 70_000


def test_short_writes_are_resumed(tmp_path, monkeypatch):
    real = os.writev

    def stingy(fd, buffers):  # the kernel may write less than asked: at most 7 bytes per call here
        first = np.frombuffer(buffers[0], np.uint8)[:7] if len(buffers[0]) else b""
        return real(fd, [first])

    monkeypatch.setattr(h5_encoder.os, "writev", stingy)
    arr = np.arange(100, dtype=np.float64).reshape(10, 10)
    path = tmp_path / "f.h5"
    _encode(path, lambda enc: enc.dataset(b"x", datatype_message(arr.dtype), arr.shape, arr))
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["x"][()], arr)


@pytest.mark.parametrize("name", [b"", b"a/b", b"a\0b"])
def test_invalid_names_are_refused(tmp_path, name):
    fd = os.open(tmp_path / "g.h5", os.O_WRONLY | os.O_CREAT, 0o666)
    try:
        enc = H5Encoder(fd)
        with pytest.raises(ValueError, match="link name"):
            enc.dataset(name, datatype_message(np.dtype("i1")), None)
    finally:
        os.close(fd)


def test_duplicate_name_is_refused(tmp_path):
    fd = os.open(tmp_path / "h.h5", os.O_WRONLY | os.O_CREAT, 0o666)
    try:
        enc = H5Encoder(fd)
        enc.dataset(b"x", datatype_message(np.dtype("i1")), None)
        with pytest.raises(ValueError, match="duplicate"):
            enc.dataset(b"x", datatype_message(np.dtype("i1")), None)
    finally:
        os.close(fd)


@pytest.mark.parametrize("length", [0, 4055, 4056, 4064, 10_000])
def test_global_heap_collection_edges(tmp_path, length):
    """Strings that leave 16+, 8 (too small for a free-space object), 0 or no spare bytes in a collection."""
    path = tmp_path / "i.h5"
    text = "z" * length
    _encode(path, lambda enc: enc.string_dataset(b"s", 0), texts=[text])
    with h5py.File(path, "r") as f:
        assert f["s"][()].decode() == text


def test_strings_spread_over_several_collections(tmp_path, monkeypatch):
    monkeypatch.setattr(h5_encoder, "_GCOL_MAX_OBJECTS", 3)  # 65,535 objects per collection in real files
    path = tmp_path / "j.h5"
    texts = [f"text number {i}" for i in range(10)]

    def write(enc):
        for i in range(len(texts)):
            enc.string_dataset(f"s{i}".encode(), i)

    _encode(path, write, texts, string_attrs={"a": b"A", "b": b"B", "c": b"C", "d": b"D"})
    with h5py.File(path, "r") as f:
        assert [f[f"s{i}"][()].decode() for i in range(10)] == texts
        assert [f.attrs[k] for k in "abcd"] == list("ABCD")


def test_saved_checkpoint_reads_with_plain_h5py(tmp_path):
    """Every leaf of a real save() is an ordinary HDF5 dataset, readable by tools that know nothing of cs-run."""
    import json

    import torch

    from cs_run.checkpoint import save

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 4))
    model[2].weight = torch.nn.Parameter(model[0].weight.T.contiguous())
    state = {
        "model": model.state_dict(), "tied": model[0].weight, "step": 7, "lr": 0.5, "ok": True, "z": 1 + 2j,
        "name": "run-é", "huge": 2**70, "none": None, "raw": b"\x00\x01", "bf16": torch.ones(2, dtype=torch.bfloat16),
        "arr": np.arange(3, dtype=">i4"), "npscalar": np.float16(1.5),
    }
    save(state, tmp_path / "c.h5")
    with h5py.File(tmp_path / "c.h5", "r") as f:
        spec = json.loads(f.attrs["__structure__"])
        assert f.attrs["__complete__"] == 1 and len(f) == len(spec["leaves"])
        for leaf in spec["leaves"]:
            ds = f[leaf["ds"]]
            assert ds.attrs["__type__"].decode() == leaf["type"], leaf["key"]
            if "tied" in leaf:
                assert ds == f[spec["leaves"][leaf["tied"]]["ds"]]
            elif leaf.get("off") is not None:
                assert ds.id.get_offset() == leaf["off"] and ds.id.get_storage_size() == leaf["n"]
        np.testing.assert_array_equal(f["model.0.bias"][()], state["model"]["0.bias"].numpy())
        assert f["bf16"].dtype == np.uint16 and (f["bf16"][()] == 0x3F80).all()  # bfloat16 as its bit pattern
        assert f["name"][()].decode() == "run-é" and f["huge"][()].decode() == str(2**70)
        assert f["step"][()] == 7 and f["ok"][()] and f["z"][()] == 1 + 2j and f["none"].shape is None
        assert f["arr"].dtype == np.dtype(">i4") and f["npscalar"][()] == np.float16(1.5)


def test_non_ascii_names_are_found_in_byte_order(tmp_path):
    """libhdf5 looks names up with strcmp (unsigned bytes): UTF-8 names sort after ASCII ones."""
    path = tmp_path / "k.h5"
    names = ["Zeta", "alpha", "émile", "日本", "a.b", "a%2Fb", "~", "ß"] + [f"w{i}" for i in range(300)]
    _numbered_datasets(path, names)
    with h5py.File(path, "r") as f:
        for i, name in enumerate(names):
            assert f[name][0] == i, name
