"""Vendor legacy H5 layout (<= 0.4), built here with h5py the way the vendor's H5Saver writes it."""

from __future__ import annotations

import collections
import pickle
import struct
from unittest import mock
from urllib.parse import quote

import h5py
import numpy as np
import pytest
import torch
import torch.utils._pytree as torch_pytree
from click.testing import CliRunner
from torch.utils._pytree import tree_flatten

from cs_run.checkpoint import info, load, load_into
from cs_run.errors import CheckpointError
from cs_run.frontends.checkpoint_cli import checkpoint as cli

# --- a tiny pickle assembler, to write specs the way old torch + dill did (dict state, _load_type) ---


def _str(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def _global(mod: str, name: str) -> bytes:
    return b"c" + mod.encode() + b"\n" + name.encode() + b"\n"


def _dill_type(name: str) -> bytes:
    return _global("dill._dill", "_load_type") + b"(" + _str(name) + b"tR"


def _list(items: list[bytes]) -> bytes:
    return b"](" + b"".join(items) + b"e" if items else b"]"


def _spec_node(tp: bytes | None, context: bytes, children: list[bytes]) -> bytes:
    cls = "LeafSpec" if tp is None else "TreeSpec"
    state = b"}(" + _str("type") + (tp or b"N") + _str("context") + context + _str("children_specs") + _list(children)
    return _global("torch.utils._pytree", cls) + b")\x81" + state + b"ub"


def _old_style_spec(obj) -> bytes:
    def node(v):
        if isinstance(v, dict):
            return _spec_node(_dill_type("dict"), _list([_str(k) for k in v]), [node(x) for x in v.values()])
        if isinstance(v, list):
            return _spec_node(_dill_type("list"), b"N", [node(x) for x in v])
        return _spec_node(None, b"N", [])

    return b"\x80\x02" + node(obj) + b"."


def _spec_as_torch_2_14_pickles(obj) -> bytes:
    """The spec pickled the way torch 2.14 does on any torch: a leaf is a call of ``treespec_leaf()`` (2.14's
    ``LeafSpec.__reduce__``; before 2.14 a leaf was a LeafSpec instance)."""
    with mock.patch.object(torch_pytree.LeafSpec, "__reduce__", lambda self: (torch_pytree.treespec_leaf, ()),
                           create=True):
        data = pickle.dumps(tree_flatten(obj)[1])
    assert b"treespec_leaf" in data and b"LeafSpec" not in data
    return data


def _leaf_keys(obj, scope=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaf_keys(v, scope + (str(k),))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaf_keys(v, scope + (str(i),))
    else:
        yield ".".join(scope), obj


def write_legacy(path, obj, version=0.4, spec="new", objects=()):
    """Write ``obj`` in the vendor layout. Tensors identical by identity become hard links."""
    with h5py.File(path, "w") as f:
        if spec == "new":
            f.attrs["__spec__"] = pickle.dumps(tree_flatten(obj)[1]).hex()
        elif spec == "torch 2.14":
            f.attrs["__spec__"] = _spec_as_torch_2_14_pickles(obj).hex()
        elif spec == "old":
            f.attrs["__spec__"] = _old_style_spec(obj).hex()
        elif spec is not None:
            f.attrs["__spec__"] = spec
        if version is not None:
            f.attrs["__version__"] = version
        first = {}
        for key, value in _leaf_keys(obj):
            name = quote(key, safe="")
            if isinstance(value, torch.Tensor) and id(value) in first:
                f[name] = f[first[id(value)]]  # the vendor's create_links
                continue
            if isinstance(value, torch.Tensor):
                bf16 = value.dtype == torch.bfloat16
                data = value.view(torch.int16).numpy().view(np.uint16) if bf16 else value.numpy()
                ds = f.create_dataset(name, data=data)
                ds.attrs["is_bfloat16"] = bf16
                ds.attrs["__H5_TYPE__"] = "TorchTensorH5Type"
                first[id(value)] = name
            elif isinstance(value, np.ndarray):
                ds = f.create_dataset(name, data=value)
                ds.attrs["is_bfloat16"] = False
                ds.attrs["__H5_TYPE__"] = "NumpyArrayH5Type"
            elif isinstance(value, str):
                ds = f.create_dataset(name, data=h5py.Empty("f"))
                ds.attrs["string_value"] = value
                ds.attrs["__H5_TYPE__"] = "StringH5Type"
            elif value is None:
                ds = f.create_dataset(name, data=h5py.Empty("f"))
                ds.attrs["__H5_TYPE__"] = "NoneH5Type"
            elif key in objects:
                ds = f.create_dataset(name, data=h5py.Empty("f"))
                ds.attrs["object_value"] = b"\x80\x04not-really-dill".hex()
                ds.attrs["__H5_TYPE__"] = "ObjectH5Type"
            else:
                ds = f.create_dataset(name, data=np.array(value))
                ds.attrs["__H5_TYPE__"] = "ScalarH5Type"


def _vendor_state():
    w = torch.randn(4, 3)
    return {
        "model": {"embedding.weight": w, "lm_head.weight": w, "ln.bias": torch.randn(3).to(torch.bfloat16),
                  "a/b": torch.arange(5)},
        "optimizer": {"state": {"0": {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1, "name": "g", "x": None}]},
        "global_step": 7,
        "arr": np.arange(4.0),
    }


@pytest.mark.parametrize("spec", ["new", "old", "torch 2.14"])
def test_reads_vendor_layout(tmp_path, spec):
    obj = _vendor_state()
    write_legacy(tmp_path / "v.mdl", obj, spec=spec)
    got = load(tmp_path / "v.mdl")
    m = got["model"]
    assert torch.equal(m["embedding.weight"], obj["model"]["embedding.weight"])
    assert m["lm_head.weight"] is m["embedding.weight"]  # the hard link comes back tied
    assert m["ln.bias"].dtype == torch.bfloat16 and torch.equal(m["ln.bias"], obj["model"]["ln.bias"])
    assert torch.equal(m["a/b"], torch.arange(5))
    assert got["optimizer"]["param_groups"] == [{"lr": 0.1, "name": "g", "x": None}]
    assert torch.equal(got["optimizer"]["state"]["0"]["step"], torch.tensor(3.0))
    assert got["global_step"] == 7 and type(got["global_step"]) is int
    assert isinstance(got["arr"], np.ndarray) and np.array_equal(got["arr"], obj["arr"])
    assert type(got) is dict and list(got) == list(obj)


def test_version_03_arrays_are_tensors_and_load_into(tmp_path):
    obj = {"model": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}}
    write_legacy(tmp_path / "v.mdl", obj, version=0.3)
    assert isinstance(load(tmp_path / "v.mdl")["model"]["w"], torch.Tensor)
    w = torch.zeros(2, 3)
    load_into(tmp_path / "v.mdl", {"model": {"w": w}})
    assert torch.equal(w, torch.arange(6.0).reshape(2, 3))


def test_info_on_legacy(tmp_path):
    write_legacy(tmp_path / "v.mdl", _vendor_state())
    desc = info(tmp_path / "v.mdl", verify=True)
    assert desc["format"] == "cerebras-legacy-h5" and desc["version"] == pytest.approx(0.4)
    keys = {k["key"]: k for k in desc["keys"]}
    # the legacy layout records no checksums: every leaf with data is unverified, none counted good
    assert desc["damaged"] == [] and desc["verified"] == 0
    assert desc["unverified"] == [k for k, e in keys.items() if e.get("nbytes") and "tied_to" not in e]
    out = CliRunner().invoke(cli, ["info", str(tmp_path / "v.mdl"), "--verify"])
    assert out.exit_code == 0 and f"0 good, 0 damaged, {len(desc['unverified'])} unverified" in out.output
    assert keys["model.lm_head.weight"]["tied_to"] == "model.embedding.weight"
    assert keys["model.ln.bias"]["dtype"] == "bfloat16"
    assert CliRunner().invoke(cli, ["info", str(tmp_path / "v.mdl")]).exit_code == 0


def test_dill_objects_reported_by_name(tmp_path):
    obj = {"model": {"w": torch.ones(2)}, "scheduler": 0}
    write_legacy(tmp_path / "v.mdl", obj, objects=("scheduler",))
    with pytest.raises(CheckpointError, match=r"key 'scheduler' holds a pickled Python object.*dill"):
        load(tmp_path / "v.mdl")


def test_newer_vendor_version_refused(tmp_path):
    """0.5 is the vendor's current layout (checkpoint/vendor_format.py, tests/checkpoint/test_vendor_format.py);
    a later one is refused by name."""
    write_legacy(tmp_path / "v.mdl", {"w": torch.ones(1)}, version=0.6)
    with pytest.raises(CheckpointError, match=r"vendor format version 0.6, newer than cs-run reads \(up to 0.5\)"):
        load(tmp_path / "v.mdl")


def test_missing_or_hostile_spec_gives_flat_dict_and_runs_nothing(tmp_path, caplog):
    marker = tmp_path / "pwned"
    hostile = (b"\x80\x02" + _global("os", "system") + b"(" + _str(f"touch {marker}") + b"tR.").hex()
    obj = {"model": {"w": torch.ones(2)}, "step": 3}
    for spec in (None, hostile):
        write_legacy(tmp_path / "v.mdl", obj, spec=spec)
        got = load(tmp_path / "v.mdl")
        assert set(got) == {"model.w", "step"} and got["step"] == 3
    assert not marker.exists()
    assert "os.system is not allowed" in caplog.text


def test_ordered_dict_spec(tmp_path):
    obj = collections.OrderedDict([("b", torch.ones(1)), ("a", 2)])
    write_legacy(tmp_path / "v.mdl", obj)
    got = load(tmp_path / "v.mdl")
    assert type(got) is collections.OrderedDict and list(got) == ["b", "a"]
