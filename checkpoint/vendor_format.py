"""The vendor's checkpoint format 0.5 (cerebras-pytorch 2.6 - 2.10 ``cstorch.save``), read and written.

Layout (from files written by the real package; see tests/data/vendor_oracle):

File attributes
    ``__version__``          0.5 (a float); ``__SUCCESS__`` True once the save finished;
    ``__cstorch_version__``  the writer's version string;
    ``__spec__``             JSON ``[readable tree, treespec]``: the treespec is torch.utils._pytree's
                             ``treespec_dumps`` (protocol 1) of the saved structure;
    ``<key>.__metadata__``   for every leaf, by its flattened key (path joined with ``.``): JSON
                             ``{"__spec__": [...], "__objects__": [key], "<key>.__metadata__": META}``.

``META["__TYPE__"]`` says what the leaf is: ``TorchTensorSerializer`` (``shapes``, ``dtypes``; the data
is the root dataset named ``key``, bfloat16 stored as int16), ``NumpyArraySerializer`` (a dataset too),
``ScalarSerializer`` (``scalar_value``), ``StringSerializer`` (``string_value``), ``NoneSerializer``
and ``LinkedObject`` (``key`` of the tensor it is tied to). Those without data carry ``__NONE__``.

:func:`describe` gives the structure tree and leaf specs in cs-run's spec format, so the regular
reader maps the tensors from the file; :func:`save` writes such a file from a state dict.
"""

from __future__ import annotations

import collections
import json
from typing import Any

import numpy as np
import torch

from cs_run._torch_compat import TREESPEC_PROTOCOL, treespec_json_leaf, treespec_json_node
from cs_run.checkpoint.atomic import atomic_path
from cs_run.checkpoint.tree import flatten, spec_tree
from cs_run.errors import CheckpointError

__all__ = ["VENDOR_VERSION", "describe", "is_vendor_format", "save"]

VENDOR_VERSION = 0.5
_WRITER_VERSION = "2.10.0"  # the cstorch release whose layout save() writes

# torch dtype -> (numpy storage dtype, the vendor's RtFx code); bfloat16 is stored as int16
_DTYPES: dict[torch.dtype, tuple[np.dtype, int]] = {
    torch.bool: (np.dtype(np.bool_), 1), torch.int16: (np.dtype(np.int16), 3), torch.int32: (np.dtype(np.int32), 4),
    torch.int64: (np.dtype(np.int64), 5), torch.uint8: (np.dtype(np.uint8), 6), torch.float16: (np.dtype(np.float16), 10),
    torch.float32: (np.dtype(np.float32), 11), torch.float64: (np.dtype(np.float64), 12),
    torch.bfloat16: (np.dtype(np.int16), 15),
}
_BY_NAME = {str(dt): dt for dt in _DTYPES}
_CONTAINERS = {"builtins.dict": dict, "collections.OrderedDict": dict, "builtins.list": list,
               "builtins.tuple": tuple}


def is_vendor_format(f: Any) -> bool:
    """A file written by the vendor's format-0.5 saver (or later): ``__version__ >= 0.5``."""
    try:
        return float(f.attrs.get("__version__", 0.0)) >= VENDOR_VERSION
    except (TypeError, ValueError):
        return False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- reading --------------------------------------------------------------------------------------
def _tree_parts(path: str) -> Any:
    """:func:`~cs_run.checkpoint.tree.spec_tree`'s view of a pytree treespec JSON node of file ``path``."""
    def parts(node: dict, scope: tuple) -> tuple[str, list | None, list] | None:
        kind = node.get("type")
        if kind is None:
            return None
        if kind not in _CONTAINERS:
            raise CheckpointError(f"checkpoint '{path}': container type {kind!r} at '{'.'.join(scope)}' is not "
                                  "supported (dict, OrderedDict, list and tuple are)")
        children = node.get("children_spec", [])
        if _CONTAINERS[kind] is dict:
            return "dict" if kind == "builtins.dict" else "odict", json.loads(node["context"]), children
        return "list" if kind == "builtins.list" else "tuple", None, children
    return parts


def _encode_key(key: Any) -> Any:
    """A dict key in cs-run's spec encoding (str as is, others tagged)."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return ["bool", key]
    if isinstance(key, int):
        return ["int", key]
    if isinstance(key, float):
        return ["float", key]
    if key is None:
        return ["none", None]
    raise CheckpointError(f"unsupported dict key {key!r} in a vendor checkpoint spec")


def _leaf(path: str, f: Any, key: str, keys: list[str], specs: list[dict]) -> dict:
    raw = f.attrs.get(f"{key}.__metadata__")
    if raw is None:
        raise CheckpointError(f"checkpoint '{path}' is corrupted: key '{key}' from __spec__ has no metadata")
    outer = json.loads(_text(raw))
    meta = outer.get(f"{key}.__metadata__")
    if meta is None or outer.get("__objects__") != [key]:
        raise CheckpointError(f"checkpoint '{path}': key '{key}' is a nested vendor object "
                              f"({sorted(outer)}), which cs-run does not read")
    kind = meta.get("__TYPE__")
    base = {"key": key}
    if kind == "ScalarSerializer":
        value = meta.get("scalar_value")
        return {**base, "type": type(value).__name__, "v": value}
    if kind == "StringSerializer":
        return {**base, "type": "str", "v": meta.get("string_value", "")}
    if kind == "NoneSerializer":
        return {**base, "type": "none", "v": None}
    if kind == "LinkedObject":
        target = meta.get("key")
        index = keys.index(target) if target in keys else len(specs)
        if index >= len(specs) or "ds" not in specs[index]:
            raise CheckpointError(f"checkpoint '{path}': key '{key}' is tied to '{target}', which is no tensor "
                                  "saved before it")
        return {**specs[index], **base, "tied": index}
    if kind in ("TorchTensorSerializer", "NumpyArraySerializer"):
        if key not in f:
            raise CheckpointError(f"checkpoint '{path}' is corrupted: tensor '{key}' has no dataset")
        ds = f[key]
        native = ds.dtype.newbyteorder("=")
        spec = {**base, "ds": key, "shape": list(ds.shape), "n": int(ds.size * native.itemsize)}
        if kind == "NumpyArraySerializer":
            if meta.get("is_bfloat16"):
                raise CheckpointError(f"checkpoint '{path}': key '{key}' is a bfloat16 numpy array (not supported)")
            return {**spec, "type": "ndarray", "dtype": native.str}
        name = (meta.get("dtypes") or [""])[0]
        dtype = _BY_NAME.get(name)
        if dtype is None or _DTYPES[dtype][0] != native:
            raise CheckpointError(f"checkpoint '{path}': tensor '{key}' is {name or 'untyped'} stored as {ds.dtype}, "
                                  "which cs-run cannot map to a torch dtype")
        if list((meta.get("shapes") or [spec["shape"]])[0]) != spec["shape"]:
            raise CheckpointError(f"checkpoint '{path}' is corrupted: tensor '{key}' has shape {spec['shape']} "
                                  f"but its metadata says {meta['shapes'][0]}")
        return {**spec, "type": name, "mem": native.str}
    raise CheckpointError(f"checkpoint '{path}': key '{key}' has vendor type {kind!r}, which cs-run does not read "
                          "(tensors, numpy arrays, scalars, strings, None and tied tensors are read)")


_LZ4 = "32004"  # the HDF5 filter id of LZ4, the vendor's default compression of every tensor


def _filters_available(path: str, f: Any, specs: list[dict]) -> None:
    """Register hdf5plugin's filters when a tensor is LZ4-compressed; say how to get them if missing."""
    compressed = next((s["key"] for s in specs if "ds" in s and _LZ4 in f[s["ds"]]._filters), None)
    if compressed is None:
        return
    try:
        import hdf5plugin  # noqa: F401  (registers the LZ4 filter with HDF5)
    except ImportError as err:
        raise CheckpointError(f"checkpoint '{path}': its tensors (e.g. '{compressed}') are LZ4-compressed, as the "
                              "vendor writes them; install hdf5plugin to read them (pip install hdf5plugin, or "
                              "cs-run[vendor])") from err


def describe(path: str, f: Any) -> tuple[Any, list[dict]]:
    """(structure tree, leaf specs) of a vendor format-0.5 file, in the spec format of cs-run files."""
    version = float(f.attrs["__version__"])
    if version > VENDOR_VERSION:
        raise CheckpointError(f"checkpoint '{path}' has vendor format version {version}, newer than cs-run reads "
                              f"(up to {VENDOR_VERSION}); save it with the vendor's tools in an older layout or as torch")
    if not bool(f.attrs.get("__SUCCESS__", False)):
        raise CheckpointError(f"checkpoint '{path}' is incomplete (vendor format {f.attrs['__version__']} without "
                              "__SUCCESS__): its save was interrupted")
    try:
        treespec = json.loads(json.loads(_text(f.attrs["__spec__"]))[1])
        if treespec[0] != TREESPEC_PROTOCOL:
            raise CheckpointError(f"checkpoint '{path}': vendor treespec protocol {treespec[0]} (cs-run reads "
                                  f"{TREESPEC_PROTOCOL})")
        tree, keys = spec_tree(treespec[1], _tree_parts(path), _encode_key)
        specs: list[dict] = []
        for key in keys:
            specs.append(_leaf(path, f, key, keys, specs))
        _filters_available(path, f, specs)
    except CheckpointError:
        raise
    except Exception as err:
        raise CheckpointError(f"checkpoint '{path}' is corrupted: cannot read its vendor spec ({err})") from err
    return tree, specs


# -- writing --------------------------------------------------------------------------------------
def _treespec(path: str, obj: Any, scope: str) -> dict:
    """torch.utils._pytree's serialized TreeSpec node of ``obj`` (protocol 1), written by hand."""
    where = scope or "<root>"
    if type(obj) is dict or isinstance(obj, collections.OrderedDict):
        keys = list(obj)
        for k in keys:
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise CheckpointError(f"cannot write vendor checkpoint '{path}': key {k!r} under '{where}' is not a "
                                      "string or number")
        kind = "builtins.dict" if type(obj) is dict else "collections.OrderedDict"
        return treespec_json_node(kind, json.dumps(keys),
                                  [_treespec(path, obj[k], f"{scope}.{k}" if scope else str(k)) for k in keys])
    if type(obj) in (list, tuple):
        return treespec_json_node(f"builtins.{type(obj).__name__}", "null",
                                  [_treespec(path, v, f"{scope}.{i}" if scope else str(i)) for i, v in enumerate(obj)])
    if isinstance(obj, dict):
        raise CheckpointError(f"cannot write vendor checkpoint '{path}': '{where}' is a {type(obj).__name__}")
    return treespec_json_leaf()


def _readable(obj: Any) -> Any:
    """The first half of ``__spec__``: the structure with every leaf shown as ``*`` (None if not JSON)."""
    if isinstance(obj, dict):
        return {k: _readable(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return [_readable(v) for v in obj]
    return "*"


def _spec_pair(path: str, obj: Any) -> list:
    readable = _readable(obj)
    try:
        json.dumps(readable)
    except TypeError:
        readable = None
    return [readable, json.dumps([TREESPEC_PROTOCOL, _treespec(path, obj, "")])]


def _leaf_meta(path: str, key: str, value: Any, kind: str) -> tuple[dict, np.ndarray | None]:
    """(the vendor's metadata, data to store or None) of one leaf."""
    if kind == "tensor":
        t = value.detach().cpu()
        if t.dtype not in _DTYPES:
            raise CheckpointError(f"cannot write vendor checkpoint '{path}': tensor '{key}' is {t.dtype}, which the "
                                  f"vendor format cannot hold ({', '.join(sorted(_BY_NAME))})")
        storage, code = _DTYPES[t.dtype]
        t = t.contiguous()
        data = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
        assert data.dtype == storage
        meta = {"__TORCH__": True, "shapes": [list(t.shape)], "dtypes": [str(t.dtype)], "rtfx_dtypes": [code],
                "__TYPE__": "TorchTensorSerializer", "__NUMPY__": True, "compressed": False}
        return meta, data
    if kind == "ndarray":
        return {"is_bfloat16": False, "__TYPE__": "NumpyArraySerializer", "__NUMPY__": True,
                "compressed": False}, np.ascontiguousarray(value)
    if kind in ("int", "float", "bool"):
        return {"scalar_value": value, "__TYPE__": "ScalarSerializer", "__NONE__": True}, None
    if kind == "str":
        return {"string_value": value, "__TYPE__": "StringSerializer", "__NONE__": True}, None
    if kind == "none":
        return {"__TYPE__": "NoneSerializer", "__NONE__": True}, None
    raise CheckpointError(f"cannot write vendor checkpoint '{path}': key '{key}' is a {kind}, which the vendor "
                          "format cannot hold (tensors, numpy arrays, numbers, strings and None can be written)")


def save(obj: Any, path: str) -> None:
    """Write ``obj`` (a state dict: nested dicts/lists/tuples of tensors, numbers, strings, None) in the
    vendor's format 0.5, readable by the vendor's ``cstorch.load`` (2.6 - 2.10). Atomic, like cs-run's save."""
    import h5py

    _, leaves = flatten(obj)
    spec_pair = _spec_pair(path, obj)
    attrs: dict[str, Any] = {"__spec__": json.dumps(spec_pair, indent=4), "__version__": VENDOR_VERSION,
                             "__cstorch_version__": _WRITER_VERSION}
    seen: set[str] = set()
    for leaf in leaves:  # the format addresses leaves by flattened key: refuse a clash before writing
        if leaf.key in seen:
            raise CheckpointError(f"cannot write vendor checkpoint '{path}': two leaves have the flattened key "
                                  f"'{leaf.key}' (e.g. {{'a.b': x, 'a': {{'b': y}}}}); rename one")
        seen.add(leaf.key)
    with atomic_path(path) as tmp, h5py.File(tmp, "w", track_order=True) as f:
        f.attrs.update(attrs)
        for leaf in leaves:
            key = leaf.key
            if leaf.kind == "tied":
                meta, data = {"key": leaves[leaf.tied_to].key, "__LINKED__": True, "__TYPE__": "LinkedObject",
                              "__NONE__": True}, None
            else:
                meta, data = _leaf_meta(path, key, leaf.value, leaf.kind)
            if data is not None:
                ds = f.create_dataset(key, data=data)
                for name, value in meta.items():  # the vendor's reader checks __NUMPY__ on the dataset
                    ds.attrs[name] = np.asarray(value, dtype=np.int64) if name == "shapes" else value
            one_leaf = treespec_json_node("builtins.dict", json.dumps([key]), [treespec_json_leaf()])
            single = json.dumps([{key: "*"}, json.dumps([TREESPEC_PROTOCOL, one_leaf])])
            f.attrs[f"{key}.__metadata__"] = json.dumps(
                {"__spec__": json.loads(single), "__objects__": [key], f"{key}.__metadata__": meta}, indent=4)
        f.attrs["__SUCCESS__"] = True
