"""A table of damaged, forged and hostile checkpoints, each refused the same way by every path.

The files are built here with h5py (and safetensors): data in external storage or a virtual dataset
whose bytes are a recognisable pattern in a temporary file outside the checkpoint, external and soft
links, forged spec JSON (with a valid spec checksum, so only the content is wrong), truncations,
one-bit flips at seeded random offsets of tensor data, forged safetensors headers and metadata, and
the same tricks in the vendor's legacy layout. libhdf5 itself (plain h5py) is the reference that the
out-of-file variants are live: reading them with h5py does return the outside bytes.

Every case goes through the API (``load`` lazy and materialized, with and without ``verify``,
``load_into``, ``info``, ``is_checkpoint_file``) and the CLI (``cs-run checkpoint info --verify``,
``cs-run checkpoint convert``, ``cs-run eval --checkpoint_path``), and each must end in one
``Error:`` line naming the key, exit 1, with no outside byte in any tensor, no allocation larger
than the file, no file left by convert and model_dir's checkpoints untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import tracemalloc
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cs_run.checkpoint import info, is_checkpoint_file, load, load_into, save
from cs_run.errors import CheckpointError
from cs_run.frontends.cli import cli

MARKER = b"<<OUTSIDE-THE-CHECKPOINT>>"  # the bytes of the file a hostile checkpoint points at


# --- the base: a real runner checkpoint of the toy project (so `cs-run eval` can load it) -------------

@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A trained toy project: params, its model module on sys.path, a model_dir with checkpoint_10.mdl."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_toy_conftest", Path(__file__).parents[1] / "conftest.py")
    toy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(toy)
    TOY_MODULE, TOY_PARAMS = toy.TOY_MODULE, toy.TOY_PARAMS  # noqa: N806

    root = tmp_path_factory.mktemp("hostile")
    (root / "toy_models.py").write_text(TOY_MODULE)
    (root / "params.yaml").write_text(TOY_PARAMS)
    sys.path.insert(0, str(root))
    sys.modules.pop("toy_models", None)
    result = CliRunner().invoke(cli, ["train", "--params", str(root / "params.yaml"), "--model_dir", str(root / "md"),
                                      "--max_steps", "10"])
    assert result.exit_code == 0, result.output
    outside = root / "outside.bin"
    outside.write_bytes(MARKER * 4096)
    yield {"root": root, "params": root / "params.yaml", "md": root / "md", "base": root / "md" / "checkpoint_10.mdl",
           "outside": outside}
    sys.path.remove(str(root))
    sys.modules.pop("toy_models", None)


def _spec(f) -> dict:
    return json.loads(f.attrs["__structure__"])


def _write_spec(f, doc) -> None:
    text = json.dumps(doc)
    f.attrs["__structure__"] = text
    f.attrs["__structure_crc32__"] = np.int64(zlib.crc32(text.encode()))


def _leaf(doc, key) -> dict:
    return next(s for s in doc["leaves"] if s["key"] == key)


def _data_keys(path, kind="torch.") -> list[str]:
    with h5py.File(path, "r") as f:
        return [s["key"] for s in _spec(f)["leaves"] if s["type"].startswith(kind) and s.get("n") and "tied" not in s]


# --- builders: (base checkpoint, outside file, destination) -> writes destination --------------------

def _copy(base: Path, dst: Path) -> None:
    dst.write_bytes(base.read_bytes())


def _outside_h5(outside: Path, shape, dtype) -> Path:
    """An HDF5 file next to the outside file whose dataset 'x' holds the outside bytes."""
    path = outside.with_suffix(f".{abs(hash((tuple(shape), str(dtype)))) % 10**6}.h5")
    if not path.exists():
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        raw = np.frombuffer((MARKER * (n // len(MARKER) + 1))[:n], np.uint8)
        with h5py.File(path, "w") as f:
            f["x"] = raw.view(dtype).reshape(shape)
    return path


def _replace(dst: Path, key: str, make: Callable, spec_update: Callable | None = None) -> None:
    """Swap the dataset of ``key`` for ``make(f, name, shape, dtype)`` (keeping its __type__)."""
    with h5py.File(dst, "r+") as f:
        doc = _spec(f)
        leaf = _leaf(doc, key)
        old = f[leaf["ds"]]
        shape, dtype, kind = old.shape, old.dtype, old.attrs["__type__"]
        del f[leaf["ds"]]
        make(f, leaf["ds"], shape, dtype)
        if isinstance(f.get(leaf["ds"], getlink=True), h5py.HardLink):
            f[leaf["ds"]].attrs["__type__"] = kind
        if spec_update is not None:
            spec_update(leaf, shape, dtype)
            _write_spec(f, doc)


def _forged_as_live(leaf, shape, dtype) -> None:
    """Make the spec agree with outside data: no offset (read through HDF5), the outside bytes' CRC32."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    leaf["off"], leaf["crc"] = None, zlib.crc32((MARKER * (n // len(MARKER) + 1))[:n])


def external_storage(live: bool):
    def build(p, key, dst):
        _copy(p["base"], dst)

        def make(f, name, shape, dtype):
            n = int(np.prod(shape)) * np.dtype(dtype).itemsize
            f.create_dataset(name, shape=shape, dtype=dtype, external=[(str(p["outside"]), 0, n)])
        _replace(dst, key, make, _forged_as_live if live else None)
    return build


def virtual(live: bool):
    def build(p, key, dst):
        _copy(p["base"], dst)

        def make(f, name, shape, dtype):
            src = _outside_h5(p["outside"], shape, dtype)
            layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
            layout[...] = h5py.VirtualSource(str(src), "x", shape=shape)
            f.create_virtual_dataset(name, layout)
        _replace(dst, key, make, _forged_as_live if live else None)
    return build


def external_link(p, key, dst):
    _copy(p["base"], dst)

    def make(f, name, shape, dtype):
        f[name] = h5py.ExternalLink(str(_outside_h5(p["outside"], shape, dtype)), "x")
    _replace(dst, key, make, _forged_as_live)


def self_external_link(p, key, dst):
    """An external link back into the checkpoint itself, at another tensor (loaded another offset)."""
    _copy(p["base"], dst)
    other = next(k for k in _data_keys(p["base"]) if k != key)

    def make(f, name, shape, dtype):
        f[name] = h5py.ExternalLink(str(dst), _leaf(_spec(f), other)["ds"])
    _replace(dst, key, make, lambda leaf, s, d: leaf.update(off=None))


def soft_link(p, key, dst):
    _copy(p["base"], dst)
    other = next(k for k in _data_keys(p["base"]) if k != key)

    def make(f, name, shape, dtype):
        f[name] = h5py.SoftLink("/" + _leaf(_spec(f), other)["ds"])
    _replace(dst, key, make, lambda leaf, s, d: leaf.update(off=None))


def _unknown_filter_dataset(f, name, data) -> None:
    """A chunked dataset whose filter pipeline names filter 32123, which no reader here has: libhdf5 would
    search HDF5_PLUGIN_PATH and load a shared library to decode it (code named by the file)."""
    from h5py import h5d, h5p, h5s, h5t, h5z

    dcpl = h5p.create(h5p.DATASET_CREATE)
    dcpl.set_chunk(data.shape)
    dcpl.set_filter(32123, h5z.FLAG_OPTIONAL, ())  # optional: libhdf5 writes the data unfiltered
    ds = h5d.create(f.id, name.encode(), h5t.py_create(data.dtype), h5s.create_simple(data.shape), dcpl=dcpl)
    ds.write(h5s.ALL, h5s.ALL, np.ascontiguousarray(data))


def unknown_filter(p, key, dst):
    _copy(p["base"], dst)
    with h5py.File(dst, "r") as f:
        data = f[_leaf(_spec(f), key)["ds"]][()]
    _replace(dst, key, lambda f, name, shape, dtype: _unknown_filter_dataset(f, name, data.reshape(shape)),
             lambda leaf, s, d: leaf.update(off=None))


def spec_edit(edit: Callable):
    """Forge the spec JSON of one leaf (the spec checksum is recomputed, so only the content lies)."""
    def build(p, key, dst):
        _copy(p["base"], dst)
        with h5py.File(dst, "r+") as f:
            doc = _spec(f)
            edit(doc, _leaf(doc, key) if key else None, os.path.getsize(dst))
            _write_spec(f, doc)
    return build


def truncate(fraction: float):
    def build(p, key, dst):
        data = p["base"].read_bytes()
        dst.write_bytes(data[: int(len(data) * fraction)] if fraction < 1 else data[:-1])
    return build


def bit_flip(seed: int):
    """One bit flipped at a seeded random offset inside the stored bytes of ``key``."""
    def build(p, key, dst):
        _copy(p["base"], dst)
        with h5py.File(dst, "r") as f:
            leaf = _leaf(_spec(f), key)
        rng = random.Random(seed)
        at = leaf["off"] + rng.randrange(leaf["n"])
        data = bytearray(dst.read_bytes())
        data[at] ^= 1 << rng.randrange(8)
        dst.write_bytes(bytes(data))
    return build


@dataclass
class Case:
    name: str
    build: Callable
    key: str | None  # the key the error must name
    expect: str  # part of the error message
    flip: bool = False  # a bit flip: the structure is fine, only the checksums refuse it
    eval_ok: bool = True  # the toy model can be pointed at it with `cs-run eval`


def _itemsize(spec: dict) -> int:
    from cs_run.checkpoint.format import TORCH_DTYPES

    if spec["type"] == "ndarray":
        return np.dtype(spec["dtype"]).itemsize
    return TORCH_DTYPES[spec["type"][len("torch."):]][1].itemsize


def _nested(depth: int):
    node = 0
    for _ in range(depth):
        node = {"list": [node]}
    return node


def h5_cases(p) -> list[Case]:
    tensors = _data_keys(p["base"])  # model weights, biases, optimizer momentum buffers
    arrays = _data_keys(p["base"], "ndarray")  # the numpy RNG state
    targets = tensors[:3] + tensors[-1:] + arrays[:1]
    cases: list[Case] = []
    for key in targets:
        cases += [
            Case(f"external-storage-stale-offset[{key}]", external_storage(False), key, "external storage"),
            Case(f"external-storage-live[{key}]", external_storage(True), key, "external storage"),
            Case(f"virtual-stale-offset[{key}]", virtual(False), key, "virtual dataset"),
            Case(f"virtual-live[{key}]", virtual(True), key, "virtual dataset"),
            Case(f"external-link[{key}]", external_link, key, "external link"),
            Case(f"external-link-to-itself[{key}]", self_external_link, key, "external link"),
            Case(f"soft-link[{key}]", soft_link, key, "soft link"),
            Case(f"unknown-filter-plugin[{key}]", unknown_filter, key, "HDF5 filter 32123"),
            Case(f"offset-past-eof[{key}]", spec_edit(lambda d, s, size: s.update(off=size * 4)), key,
                 "does not lie inside the file"),
            Case(f"offset-negative[{key}]", spec_edit(lambda d, s, size: s.update(off=-64)), key,
                 "does not lie inside the file"),
            Case(f"absurd-shape[{key}]", spec_edit(lambda d, s, size: s.update(shape=[1 << 40, 1 << 10],
                                                                                n=(1 << 50) * _itemsize(s))),
                 key, "does not lie inside the file"),
            Case(f"absurd-shape-compressed[{key}]",
                 spec_edit(lambda d, s, size: s.update(shape=[1 << 40, 1 << 10], n=(1 << 50) * _itemsize(s), off=None)),
                 key, "more than a"),
            Case(f"shape-disagrees-with-size[{key}]", spec_edit(lambda d, s, size: s.update(shape=[1 << 30])), key,
                 "records"),
            Case(f"negative-shape[{key}]", spec_edit(lambda d, s, size: s.update(shape=[-1, 4])), key, "has shape"),
            Case(f"rank-33[{key}]", spec_edit(lambda d, s, size: s.update(shape=[1] * 33)), key, "has shape"),
            Case(f"negative-size[{key}]", spec_edit(lambda d, s, size: s.update(shape=[0], n=-4)), key, "records"),
            Case(f"bad-crc-field[{key}]", spec_edit(lambda d, s, size: s.update(crc=-1)), key, "checksum field"),
            Case(f"unknown-leaf-type[{key}]", spec_edit(lambda d, s, size: s.update(type="object")), key,
                 "leaf type 'object'"),
            Case(f"dill-leaf-type[{key}]", spec_edit(lambda d, s, size: s.update(type="dill")), key, "leaf type 'dill'"),
            Case(f"tied-to-itself[{key}]", spec_edit(lambda d, s, size: s.update(tied=d["leaves"].index(s))), key,
                 "is tied to"),
            Case(f"tied-to-later-leaf[{key}]", spec_edit(lambda d, s, size: s.update(tied=len(d["leaves"]) - 1)), key,
                 "is tied to"),
        ]
        for seed in range(3):
            cases.append(Case(f"bit-flip-{seed}[{key}]", bit_flip(seed * 7919 + len(key)), key, "checksum mismatch",
                              flip=True))
    for key in tensors[:2]:
        cases += [
            Case(f"unknown-dtype-{dt}[{key}]", spec_edit(lambda d, s, size, dt=dt: s.update(type=f"torch.{dt}")), key,
                 f"leaf type 'torch.{dt}'") for dt in ("float128", "evil", "qint8", "")
        ]
        cases.append(Case(f"bad-device[{key}]", spec_edit(lambda d, s, size: s.update(dev="nowhere:7")), key,
                          "names device"))
    for key in arrays[:1]:
        cases += [
            Case(f"ndarray-dtype-{dt}[{key}]", spec_edit(lambda d, s, size, dt=dt: s.update(dtype=dt)), key,
                 "not a numeric numpy dtype") for dt in ("O", "V8", "<U4", "M8[s]", "[('a','<f4')]", "f4" * 20)
        ]
    steps = next(s["key"] for s in json.loads(h5py.File(p["base"], "r").attrs["__structure__"])["leaves"]
                 if s["key"] == "global_step")
    cases += [
        Case("int-value-is-str", spec_edit(lambda d, s, size: s.update(v="7")), steps, "cached value is a str"),
        Case("int-value-is-bool", spec_edit(lambda d, s, size: s.update(v=True)), steps, "cached value is a bool"),
        Case("tree-index-out-of-range", spec_edit(lambda d, s, size: d["tree"]["dict"].append(["x", 10**6])), None,
             "refers to leaf 1000000"),
        Case("tree-index-negative", spec_edit(lambda d, s, size: d["tree"]["dict"].append(["x", -1])), None,
             "refers to leaf -1"),
        Case("tree-index-bool", spec_edit(lambda d, s, size: d["tree"]["dict"].append(["x", True])), None,
             "of no known kind"),
        Case("tree-index-twice", spec_edit(lambda d, s, size: d["tree"]["dict"].append(["x", 0])), None, "used twice"),
        Case("tree-leaf-unused", spec_edit(lambda d, s, size: d["tree"]["dict"].pop()), None, "does not use leaf"),
        Case("tree-node-unknown", spec_edit(lambda d, s, size: d["tree"]["dict"].append(["x", {"set": []}])), None,
             "of no known kind"),
        Case("tree-too-deep", spec_edit(lambda d, s, size: d["tree"]["dict"].append(["x", _nested(300)])), None,
             "nested more than"),
        Case("tree-bad-key-tag", spec_edit(lambda d, s, size: d["tree"]["dict"].__setitem__(
            0, [["int", "x"], d["tree"]["dict"][0][1]])), None, "dict key"),
        Case("spec-not-an-object", spec_edit(lambda d, s, size: d.clear()), None, "is not an object"),
        Case("leaves-not-a-list", spec_edit(lambda d, s, size: d.update(leaves={})), None, "no leaf list"),
    ]
    cases += [Case(f"truncated-{fr}", truncate(fr), None, "", eval_ok=True) for fr in (0.05, 0.3, 0.6, 0.9, 0.99, 1)]
    return cases


# --- safetensors: forged headers and forged cs-run structure metadata -------------------------------

def _st_file(dst: Path, header: dict | bytes, data: bytes) -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    dst.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


def _st_good_header():
    return {"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}


def st_cases() -> list[Case]:
    def header(edit):
        def build(p, key, dst):
            h = _st_good_header()
            edit(h)
            _st_file(dst, h, MARKER[:16] * 4)
        return build

    def meta(structure):
        def build(p, key, dst):
            import safetensors.torch

            safetensors.torch.save_file({"w": torch.ones(4, 4)}, str(dst),
                                        metadata={"cs_run.structure": json.dumps(structure)})
        return build

    cases = [
        Case("st-absurd-shape", header(lambda h: h["w"].update(shape=[1 << 40, 1 << 20])), None, "safetensors"),
        Case("st-negative-shape", header(lambda h: h["w"].update(shape=[-4, 4])), None, "safetensors"),
        Case("st-offsets-past-end", header(lambda h: h["w"].update(data_offsets=[0, 1 << 40])), None, "safetensors"),
        Case("st-offsets-reversed", header(lambda h: h["w"].update(data_offsets=[64, 0])), None, "safetensors"),
        Case("st-shape-disagrees", header(lambda h: h["w"].update(shape=[5, 5])), None, "safetensors"),
        Case("st-unknown-dtype", header(lambda h: h["w"].update(dtype="F128")), None, "safetensors"),
        Case("st-header-longer-than-file", lambda p, k, d: d.write_bytes((10**6).to_bytes(8, "little") + b"{}"), None,
             "safetensors"),
        Case("st-header-not-json", lambda p, k, d: _st_file(d, b"{not json" + b" " * 7, b"\0" * 64), None,
             "safetensors"),
        Case("st-meta-unknown-type", meta({"tree": {"dict": [["w", 0]]}, "leaves": [{"key": "w", "type": "pickle"}]}),
             "w", "has type 'pickle'"),
        Case("st-meta-missing-tensor", meta({"tree": {"dict": [["v", 0]]}, "leaves": [{"key": "v", "type": "tensor"}]}),
             "v", "names a tensor the file does not hold"),
        Case("st-meta-tie-forward", meta({"tree": {"dict": [["a", 0], ["w", 1]]},
                                          "leaves": [{"key": "a", "type": "tied", "tied": 1},
                                                     {"key": "w", "type": "tensor"}]}), "a", "is tied to"),
        Case("st-meta-tree-out-of-range", meta({"tree": {"dict": [["w", 7]]}, "leaves": [{"key": "w", "type": "tensor"}]}),
             None, "refers to leaf 7"),
        Case("st-meta-value-type", meta({"tree": {"dict": [["w", 0], ["s", 1]]},
                                         "leaves": [{"key": "w", "type": "tensor"}, {"key": "s", "type": "int", "v": "x"}]}),
             "s", "is a int whose value is a str"),
        Case("st-meta-not-json", lambda p, k, d: __import__("safetensors.torch").torch.save_file(
            {"w": torch.ones(2)}, str(d), metadata={"cs_run.structure": "{"}), None, "is not JSON"),
        Case("st-meta-no-leaves", meta({"tree": 0}), None, "has no tree and leaves"),
    ]
    for c in cases:
        c.eval_ok = True
    return cases


# --- the vendor legacy layout ---------------------------------------------------------------------

def _legacy_base(dst: Path) -> None:
    from test_legacy import write_legacy

    write_legacy(dst, {"model": {"w": torch.arange(16.0).reshape(4, 4), "b": torch.ones(4)}, "step": 3})


def legacy(make: Callable, key_name: str = "model.w"):
    def build(p, key, dst):
        _legacy_base(dst)
        with h5py.File(dst, "r+") as f:
            name = key_name
            old = f[name]
            shape, dtype, attrs = old.shape, old.dtype, dict(old.attrs)
            del f[name]
            make(p, f, name, shape, dtype, dst)
            if isinstance(f.get(name, getlink=True), h5py.HardLink):
                for k, v in attrs.items():
                    f[name].attrs[k] = v
    return build


def legacy_cases() -> list[Case]:
    def ext(p, f, name, shape, dtype, dst):  # (h5py leaves a scalar's storage unallocated instead)
        f.create_dataset(name, shape=shape, dtype=dtype,
                         external=[(str(p["outside"]), 0, int(np.prod(shape)) * dtype.itemsize)])

    def virt(p, f, name, shape, dtype, dst):
        layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
        layout[...] = h5py.VirtualSource(str(_outside_h5(p["outside"], shape, dtype)), "x", shape=shape)
        f.create_virtual_dataset(name, layout)

    def elink(p, f, name, shape, dtype, dst):
        f[name] = h5py.ExternalLink(str(_outside_h5(p["outside"], shape, dtype)), "x")

    def self_link(p, f, name, shape, dtype, dst):
        f[name] = h5py.ExternalLink(str(dst), "model.b")

    def soft(p, f, name, shape, dtype, dst):
        f[name] = h5py.SoftLink("/model.b")

    def plugin(p, f, name, shape, dtype, dst):
        _unknown_filter_dataset(f, name, np.zeros(shape, dtype))

    def huge_scalar(p, f, name, shape, dtype, dst):
        f.create_dataset(name, shape=(1 << 40,), dtype="f4", chunks=(1 << 16,))

    def strings(p, f, name, shape, dtype, dst):
        f.create_dataset(name, data=np.array([b"a", b"b"]))

    return [
        Case("legacy-external-storage", legacy(ext), "model.w", "external storage"),
        Case("legacy-virtual", legacy(virt), "model.w", "virtual dataset"),
        Case("legacy-external-link", legacy(elink), "model.w", "external link"),
        Case("legacy-external-link-to-itself", legacy(self_link), "model.w", "external link"),
        Case("legacy-soft-link", legacy(soft), "model.w", "soft link"),
        Case("legacy-unknown-filter-plugin", legacy(plugin), "model.w", "HDF5 filter 32123"),
        Case("legacy-absurd-shape-unallocated-chunks", legacy(huge_scalar), "model.w", "claims"),
        Case("legacy-string-tensor", legacy(strings), "model.w", "no tensor equivalent"),
        Case("legacy-scalar-unallocated", legacy(ext, "step"), "step", "does not lie inside the file"),
    ]


# --- the assertions, the same for every case --------------------------------------------------------

def _tensor_bytes(obj) -> list[bytes]:
    out = []
    if isinstance(obj, dict):
        for v in obj.values():
            out += _tensor_bytes(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            out += _tensor_bytes(v)
    elif isinstance(obj, torch.Tensor):
        out.append(obj.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, np.ndarray):
        out.append(obj.tobytes())
    return out


def _no_outside_bytes(obj) -> None:
    assert not any(MARKER[:12] in b for b in _tensor_bytes(obj)), "bytes of the outside file reached a tensor"


class _AllocationSpy:
    """Records the largest tensor or array the reader asks for (torch.empty / np.empty)."""

    def __init__(self, monkeypatch):
        self.largest = 0
        real_torch, real_np = torch.empty, np.empty

        def torch_empty(*args, **kwargs):
            t = real_torch(*args, **kwargs)
            self.largest = max(self.largest, t.nbytes)
            return t

        def np_empty(shape, dtype=float, *args, **kwargs):
            self.largest = max(self.largest, int(np.prod(shape)) * np.dtype(dtype).itemsize)
            return real_np(shape, dtype, *args, **kwargs)

        monkeypatch.setattr(torch, "empty", torch_empty)
        monkeypatch.setattr(np, "empty", np_empty)


def _one_line(msg: str, path: Path, case: Case) -> None:
    assert "\n" not in msg.strip(), msg
    assert str(path) in msg, msg
    if case.key is not None:
        assert f"'{case.key}'" in msg, msg
    assert case.expect in msg, msg


def _api(path: Path, case: Case, target: dict, monkeypatch) -> None:
    size = path.stat().st_size
    spy = _AllocationSpy(monkeypatch)
    tracemalloc.start()
    try:
        for lazy in (True, False):
            for verify in (True, False):
                try:
                    got = load(path, lazy=lazy, verify=verify)
                except CheckpointError as err:
                    _one_line(str(err), path, case)
                    continue
                assert case.flip and not verify, f"{case.name}: load(lazy={lazy}, verify={verify}) did not refuse it"
                _no_outside_bytes(got)
        with pytest.raises(CheckpointError) as exc:
            load_into(path, target)
        _one_line(str(exc.value), path, case)
        if case.flip:
            assert info(path, verify=True)["damaged"] == [case.key]
            assert is_checkpoint_file(path)  # the structure is fine: only the data is damaged
        else:
            with pytest.raises(CheckpointError) as exc:
                info(path)
            _one_line(str(exc.value), path, case)
            # is_checkpoint_file reads only a safetensors file's first bytes (documented); H5 it checks whole
            assert not is_checkpoint_file(path) or path.suffix == ".safetensors"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert spy.largest <= size, f"{case.name}: allocated {spy.largest} bytes for a {size}-byte file"
    assert peak <= size + (8 << 20), f"{case.name}: traced peak {peak} bytes for a {size}-byte file"


def _cli_error(result, path: Path, case: Case, only_line: bool = True) -> None:
    """Exit 1 and one ``Error:`` line naming the key, last; with ``only_line`` nothing else is printed
    (a run also prints its log lines)."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith("Error: "), result.output
    assert sum(line.startswith("Error:") for line in lines) == 1, result.output
    _one_line(lines[-1], path, case)
    if only_line and not case.flip:
        assert len(lines) == 1, result.output


def _cli(path: Path, case: Case, p: dict) -> None:
    runner = CliRunner()
    _cli_error(runner.invoke(cli, ["checkpoint", "info", str(path), "--verify"]), path, case)
    out_dir = path.parent / f"out-{path.stem}"
    out_dir.mkdir()
    for dst in ("c.pt", "c.mdl", "c.safetensors"):
        _cli_error(runner.invoke(cli, ["checkpoint", "convert", str(path), str(out_dir / dst)]), path, case)
    assert not list(out_dir.iterdir()), "convert left a file behind"
    if case.eval_ok:
        before = _snapshot(p["md"])
        result = runner.invoke(cli, ["eval", "--params", str(p["params"]), "--model_dir", str(p["md"]),
                                     "--checkpoint_path", str(path), "--eval_steps", "1"])
        _cli_error(result, path, case, only_line=False)
        assert _snapshot(p["md"]) == before, "model_dir's checkpoints changed"


def _snapshot(folder: Path) -> dict:
    return {q.name: hashlib.sha256(q.read_bytes()).hexdigest() for q in folder.glob("*.mdl")}


def _target(p) -> dict:
    got = load(p["base"], lazy=False)
    return {"model": {k: torch.zeros_like(v) for k, v in got["model"].items()}}


def _cases(p) -> list[tuple[str, Case]]:
    return [("h5", c) for c in h5_cases(p)] + [("st", c) for c in st_cases()] + [("legacy", c) for c in legacy_cases()]


def test_the_forgeries_are_live(project, tmp_path):
    """libhdf5 (plain h5py) follows each out-of-file trick to the outside bytes: the cases test something."""
    key = _data_keys(project["base"])[0]
    for build in (external_storage(True), virtual(True), external_link):
        dst = tmp_path / f"{build.__name__}.mdl"
        build(project, key, dst)
        with h5py.File(dst, "r") as f:
            assert MARKER[:12] in f[_leaf(_spec(f), key)["ds"]][()].tobytes()


def test_hostile_checkpoint_table(project, tmp_path, monkeypatch):
    """Every case of the table (counted below) is refused by every API and CLI path."""
    cases = _cases(project)
    assert len(cases) >= 150, len(cases)  # the table's size; reported in the closing note
    target = _target(project)
    failures = []
    for i, (family, case) in enumerate(cases):
        path = tmp_path / f"case{i:03d}.{'safetensors' if family == 'st' else 'mdl'}"
        case.build(project, case.key, path)
        try:
            with monkeypatch.context() as m:
                _api(path, case, target, m)
            _cli(path, case, project)
        except AssertionError as err:
            failures.append(f"{case.name}: {str(err).splitlines()[0]}")
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures)
    print(f"hostile checkpoint table: {len(cases)} cases")


def test_bit_flip_is_refused_by_resume_and_a_clean_copy_is_not(project, tmp_path):
    """Resume (train with --checkpoint_path) refuses a flipped bit naming the key; the same file unflipped
    resumes. The damaged bytes are never re-saved under a fresh checksum."""
    key = _data_keys(project["base"])[0]
    damaged = tmp_path / "damaged.mdl"
    bit_flip(1)(project, key, damaged)
    md = tmp_path / "md"
    args = ["train", "--params", str(project["params"]), "--model_dir", str(md), "--max_steps", "12"]
    result = CliRunner().invoke(cli, args + ["--checkpoint_path", str(damaged)])
    assert result.exit_code == 1 and f"'{key}'" in result.output and "checksum mismatch" in result.output
    assert not list(md.glob("*.mdl"))  # nothing was saved from the damaged weights
    result = CliRunner().invoke(cli, args + ["--checkpoint_path", str(project["base"])])
    assert result.exit_code == 0, result.output
    assert (md / "checkpoint_12.mdl").exists()


@pytest.mark.parametrize("damage", ["bit-flip", "truncated"])
def test_autoload_skips_a_damaged_newest_checkpoint(project, tmp_path, damage):
    """A damaged newest checkpoint beside a good older one: autoload warns naming it and resumes from the
    older one, and the run ends where an undisturbed run from that checkpoint ends, bit for bit."""
    md, ref = tmp_path / "md", tmp_path / "ref"
    base = ["--params", str(project["params"]), "--set", "runconfig.checkpoint_steps=5"]
    assert CliRunner().invoke(cli, ["train", *base, "--model_dir", str(md), "--max_steps", "10"]).exit_code == 0
    assert CliRunner().invoke(cli, ["train", *base, "--model_dir", str(ref), "--max_steps", "15"]).exit_code == 0
    newest = md / "checkpoint_10.mdl"
    if damage == "bit-flip":
        bit_flip(3)(project, _data_keys(newest)[0], newest)
    else:
        newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    result = CliRunner().invoke(cli, ["train", *base, "--model_dir", str(md), "--max_steps", "15"])
    assert result.exit_code == 0, result.output
    log = (md / "run.log").read_text()
    assert "Skipping checkpoint" in log and "checkpoint_10.mdl" in log
    assert "Resuming from checkpoint" in log and "checkpoint_5.mdl at global step 5" in log
    a, b = load(md / "checkpoint_15.mdl", lazy=False), load(ref / "checkpoint_15.mdl", lazy=False)
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def test_eval_all_evaluates_every_readable_checkpoint(project, tmp_path):
    md = tmp_path / "md"
    base = ["--params", str(project["params"]), "--model_dir", str(md)]
    assert CliRunner().invoke(cli, ["train", *base, "--max_steps", "20", "--set",
                                    "runconfig.checkpoint_steps=5"]).exit_code == 0
    flipped, cut = md / "checkpoint_10.mdl", md / "checkpoint_15.mdl"
    bit_flip(5)(project, _data_keys(flipped)[0], flipped)
    cut.write_bytes(cut.read_bytes()[:1000])
    before = _snapshot(md)
    result = CliRunner().invoke(cli, ["eval-all", *base, "--eval_steps", "1"])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith("Error: eval_all: evaluated 2 of 4 checkpoints")
    assert "checkpoint_10.mdl" in lines[-1] and "checkpoint_15.mdl" in lines[-1]
    log = (md / "run.log").read_text()
    assert "GlobalStep=5," in log and "GlobalStep=20," in log  # the good ones were evaluated
    assert _snapshot(md) == before


def test_save_refuses_nothing_it_wrote_and_info_verify_counts(tmp_path):
    """Round trip sanity for the new defaults: a clean file verifies, counts every data leaf as good."""
    state = {"w": torch.randn(300, 300), "a": np.arange(5), "b": b"xyz", "s": "t", "n": None}
    save(state, tmp_path / "c.mdl")
    desc = info(tmp_path / "c.mdl", verify=True)
    assert desc["damaged"] == [] and desc["unverified"] == [] and desc["verified"] == 3
    result = CliRunner().invoke(cli, ["checkpoint", "info", str(tmp_path / "c.mdl"), "--verify"])
    assert result.exit_code == 0 and "checksums: 3 good, 0 damaged" in result.output
