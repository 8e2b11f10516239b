"""The foreign checkpoint formats, read and written: torch files and safetensors (when installed).

safetensors holds a flat ``{name: tensor}`` dict. Writing one, cs-run names tensors by flattened
key, stores tied tensors once, and keeps the rest of the structure (nesting, scalars, strings, None,
numpy arrays, tie aliases) as JSON in the metadata entry ``cs_run.structure``, so H5 -> safetensors
-> H5 round-trips. A safetensors file without that entry loads as its flat dict; the entry is checked
like an H5 spec (leaf types, tie and tree indices) before it is used.

A torch file written by cs-run holds only what ``torch.load(weights_only=True)`` accepts: numpy arrays
and scalars, which it refuses, are written as ``{"__cs_run__": "ndarray"|"npscalar", "dtype": str,
"shape": [...], "data": uint8 tensor}`` and turned back into numpy values when cs-run loads the file,
so H5 -> torch -> H5 round-trips exactly. Pickled objects cannot go into such a file.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Any

import numpy as np
import torch

from cs_run.checkpoint.atomic import atomic_path
from cs_run.checkpoint.placement import finish_tensor
from cs_run.checkpoint.reader import one_line
from cs_run.checkpoint.spec import check_tree, numpy_dtype
from cs_run.checkpoint.tree import flatten, map_leaves, unflatten
from cs_run.errors import CheckpointError, ParamsError

__all__ = ["FORMATS", "format_for_path", "info_foreign", "load_foreign", "save_safetensors", "save_torch"]

FORMATS = ("h5", "torch", "safetensors", "vendor")
_EXTENSIONS = {
    ".h5": "h5", ".hdf5": "h5", ".mdl": "h5",
    ".pt": "torch", ".pth": "torch", ".bin": "torch", ".ckpt": "torch", ".pkl": "torch",
    ".safetensors": "safetensors",
}
_META_KEY = "cs_run.structure"
_TAG = "__cs_run__"
_ST_KINDS = {"tensor": None, "ndarray": None, "int": int, "float": float, "bool": bool, "str": str, "none": type(None)}


def format_for_path(path: str) -> str:
    """The format implied by a file extension, or raise ParamsError listing the known ones."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in _EXTENSIONS:
        raise ParamsError(
            f"cannot tell the format of '{path}' from its extension; use --to {{{','.join(FORMATS)}}} "
            f"or one of {', '.join(sorted(_EXTENSIONS))}"
        )
    return _EXTENSIONS[ext]


def _to_device(obj: Any, map_location: Any) -> Any:
    """Apply ``map_location`` to every tensor of a nested dict/list/tuple (others pass through)."""
    if map_location is None:
        return obj
    if isinstance(obj, torch.Tensor):
        return finish_tensor(obj, {"dev": str(obj.device)}, map_location)
    if isinstance(obj, dict):
        out = type(obj)() if type(obj) in (dict, collections.OrderedDict) else {}
        for k, v in obj.items():
            out[k] = _to_device(v, map_location)
        return out
    if type(obj) in (list, tuple):
        return type(obj)(_to_device(v, map_location) for v in obj)
    return obj


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError as err:
        raise CheckpointError("safetensors is not installed; pip install 'cs-run[safetensors]'") from err
    return safetensors


def _st_leaf(path: str, i: int, spec: Any, values: list, tensors: dict) -> Any:
    """The value of leaf ``i`` of a safetensors structure entry, or a one-line error naming it."""
    key = spec.get("key") if isinstance(spec, dict) else None
    kind = spec.get("type") if isinstance(spec, dict) else None

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"checkpoint '{path}' has a corrupted or forged {_META_KEY} entry: leaf {i} "
                               f"(key {str(key)[:80]!r}) {what}; re-save it from a trusted copy")

    if not isinstance(key, str):
        raise bad("has no key")
    if kind == "tied":
        j = spec.get("tied")
        if type(j) is not int or not 0 <= j < i or not isinstance(values[j], (torch.Tensor, np.ndarray)):
            raise bad(f"is tied to {str(j)[:20]}, not an earlier tensor")
        return values[j]
    if kind not in _ST_KINDS:
        raise bad(f"has type {str(kind)[:40]!r}, which cs-run does not write")
    if kind in ("tensor", "ndarray"):
        if key not in tensors:
            raise bad("names a tensor the file does not hold")
        t = tensors[key]
        if kind == "tensor":
            return t
        try:
            return t.numpy()
        except TypeError as err:
            raise bad(f"is an ndarray stored as {t.dtype}") from err
    if type(spec.get("v")) is not _ST_KINDS[kind]:
        raise bad(f"is a {kind} whose value is a {type(spec.get('v')).__name__}")
    return spec["v"]


def _load_safetensors(path: str) -> Any:
    st = _safetensors()
    try:
        with st.safe_open(path, framework="pt") as fh:
            meta = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 - safe_open is no dict
    except Exception as err:
        raise CheckpointError(f"checkpoint '{path}' is not a readable safetensors file ({one_line(err)})") from err
    if _META_KEY not in meta:
        return tensors
    try:
        doc = json.loads(meta[_META_KEY])
    except ValueError as err:
        raise CheckpointError(f"checkpoint '{path}': its {_META_KEY} entry is not JSON ({one_line(err)})") from err
    if not isinstance(doc, dict) or not isinstance(doc.get("leaves"), list) or "tree" not in doc:
        raise CheckpointError(f"checkpoint '{path}': its {_META_KEY} entry has no tree and leaves")
    values: list = []
    for i, spec in enumerate(doc["leaves"]):
        values.append(_st_leaf(path, i, spec, values, tensors))
    check_tree(path, doc["tree"], len(values))
    return unflatten(doc["tree"], values)


def _numpy_to_tagged(value: Any) -> Any:
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        arr = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)  # (which would make 0-d 1-d)
        kind = "ndarray" if isinstance(value, np.ndarray) else "npscalar"
        data = torch.from_numpy(arr.reshape(-1).view(np.uint8).copy())
        return {_TAG: kind, "dtype": arr.dtype.str, "shape": list(arr.shape), "data": data}
    return value


def _tagged_to_numpy(path: str, node: Any) -> Any:
    if not (type(node) is dict and node.get(_TAG) in ("ndarray", "npscalar") and set(node) == {_TAG, "dtype", "shape", "data"}):
        return None
    dt, shape, data = numpy_dtype(node["dtype"]), node["shape"], node["data"]
    if (dt is None or not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or not isinstance(shape, list)
            or not all(type(d) is int and d >= 0 for d in shape) or data.numel() != int(np.prod(shape)) * dt.itemsize):
        raise CheckpointError(f"checkpoint '{path}': a {_TAG} {node[_TAG]} entry is corrupted (dtype, shape and "
                              "data size disagree)")
    arr = data.contiguous().numpy().view(dt).reshape(shape)
    return arr[()] if node[_TAG] == "npscalar" else arr


def _untag(path: str, obj: Any) -> Any:
    """Numpy values a cs-run torch file holds as tagged dicts, back as numpy values."""
    return map_leaves(obj, lambda leaf, _: leaf, plain=True, replace=lambda node: _tagged_to_numpy(path, node))


def load_foreign(path: str, kind: str, map_location: Any = None, allow_pickle: bool = False) -> Any:
    """Load a torch pickle (``weights_only`` unless ``allow_pickle``) or a safetensors file."""
    if kind == "safetensors":
        return _to_device(_load_safetensors(path), map_location)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=not allow_pickle, mmap=True)
    except Exception as err:
        hint = " (it holds non-tensor objects: pass allow_pickle=True only if you trust it)" if "weights_only" in str(err) else ""
        raise CheckpointError(f"checkpoint '{path}' is not a readable torch file: {one_line(err)}{hint}") from err
    return _to_device(_untag(path, obj), map_location)


def info_foreign(path: str, kind: str, verify: bool = False) -> dict:
    """``info`` for a torch or safetensors file (loads it memory-mapped). Neither format records a
    per-tensor checksum cs-run can check, so with ``verify`` every tensor is reported unverified."""
    obj = load_foreign(path, kind)
    _, leaves = flatten(obj, allow_pickle=True)
    keys, seen = [], {}
    for leaf in leaves:
        entry: dict[str, Any] = {"key": leaf.key, "type": "tensor" if leaf.kind in ("tensor", "tied") else leaf.kind}
        if isinstance(leaf.value, (torch.Tensor, np.ndarray)):
            entry["dtype"] = str(leaf.value.dtype).replace("torch.", "")
            entry["shape"] = list(leaf.value.shape)
            entry["nbytes"] = 0 if leaf.kind == "tied" else int(leaf.value.nbytes)
        if leaf.kind == "tied":
            entry["tied_to"] = leaves[leaf.tied_to].key
        elif entry.get("shape") == [] or leaf.kind in ("int", "float", "bool", "str", "none", "complex", "npscalar"):
            value = leaf.value.item() if hasattr(leaf.value, "item") else leaf.value
            entry["value"] = str(value) if isinstance(value, complex) else value
        seen[leaf.key] = entry
        keys.append(entry)
    out = {
        "path": path, "format": kind, "version": None, "keys": keys,
        "num_tensors": sum(1 for k in keys if k["type"] in ("tensor", "ndarray") and "tied_to" not in k),
        "total_bytes": sum(k.get("nbytes", 0) for k in keys),
    }
    if verify:
        out.update(damaged=[], verified=0, unverified=[k["key"] for k in keys if k.get("nbytes")])
    return out


def _write_error(path: str, err: BaseException) -> CheckpointError:
    return CheckpointError(f"cannot write '{path}': {one_line(err)} (nothing was written; free space or choose "
                           "a writable folder)")


def save_torch(obj: Any, path: str) -> None:
    """torch.save, atomically (temp file, fsync, rename), of only what ``torch.load(weights_only=True)``
    reads: numpy values are tagged (see the module doc); pickled objects are refused by key."""
    _, leaves = flatten(obj)  # raises naming the key of anything that would need pickle
    if any(leaf.kind in ("ndarray", "npscalar") for leaf in leaves):
        obj = map_leaves(obj, lambda leaf, _: _numpy_to_tagged(leaf), plain=True)
    sink = _WriteErrors()
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            sink.fh = fh
            torch.save(obj, sink)
    except (OSError, RuntimeError) as err:
        raise _write_error(path, sink.error or err) from err


class _WriteErrors:
    """A file for torch.save that keeps the OSError of a failed write: torch's zip writer reports it
    only as an "unexpected pos" error, which says nothing about a full or read-only disk."""

    def __init__(self) -> None:
        self.fh: Any = None
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.fh.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def flush(self) -> None:
        self.fh.flush()


def save_safetensors(obj: Any, path: str) -> None:
    """Write ``obj`` as safetensors, keeping its structure in the metadata (see module doc)."""
    st = _safetensors()
    tree, leaves = flatten(obj)
    tensors: dict[str, torch.Tensor] = {}
    specs = []
    for leaf in leaves:
        spec: dict[str, Any] = {"key": leaf.key, "type": leaf.kind}
        if leaf.kind == "tied":
            spec["tied"] = leaf.tied_to
        elif leaf.kind in ("tensor", "ndarray"):
            t = leaf.value if leaf.kind == "tensor" else torch.from_numpy(np.ascontiguousarray(leaf.value))
            if leaf.key in tensors:
                raise CheckpointError(f"cannot write safetensors '{path}': two leaves flatten to key '{leaf.key}'")
            tensors[leaf.key] = t.detach().cpu().contiguous()
        elif leaf.kind in ("int", "float", "bool", "str", "none"):
            spec["v"] = leaf.value
        else:
            raise CheckpointError(f"cannot write safetensors '{path}': key '{leaf.key}' is a {leaf.kind}, which it cannot hold")
        specs.append(spec)
    meta = {_META_KEY: json.dumps({"tree": tree, "leaves": specs})}
    try:
        with atomic_path(path) as tmp:
            st.torch.save_file(tensors, tmp, metadata=meta)
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"cannot write safetensors '{path}': {one_line(err)}") from err
    except Exception as err:  # safetensors reports a failed write as its own SafetensorError
        if isinstance(err, OSError) or type(err).__name__ == "SafetensorError":
            raise _write_error(path, err) from err
        raise
