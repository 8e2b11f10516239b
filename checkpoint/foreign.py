"""The foreign checkpoint formats: torch pickle files and safetensors (when installed), read and written.

safetensors holds a flat ``{name: tensor}`` dict. Writing one, cs-run names tensors by flattened
key, stores tied tensors once, and keeps the rest of the structure (nesting, scalars, strings, None,
numpy arrays, tie aliases) as JSON in the metadata entry ``cs_run.structure``, so H5 -> safetensors
-> H5 round-trips. A safetensors file without that entry loads as its flat dict.
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
from cs_run.checkpoint.tree import flatten, unflatten
from cs_run.errors import CheckpointError, ParamsError

__all__ = ["FORMATS", "format_for_path", "info_foreign", "load_foreign", "save_safetensors", "save_torch"]

FORMATS = ("h5", "torch", "safetensors")
_EXTENSIONS = {
    ".h5": "h5", ".hdf5": "h5", ".mdl": "h5",
    ".pt": "torch", ".pth": "torch", ".bin": "torch", ".ckpt": "torch", ".pkl": "torch",
    ".safetensors": "safetensors",
}
_META_KEY = "cs_run.structure"


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
        raise CheckpointError("safetensors is not installed; pip install safetensors") from err
    return safetensors


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
    doc = json.loads(meta[_META_KEY])
    values: list = []
    for spec in doc["leaves"]:
        if "tied" in spec:
            values.append(values[spec["tied"]])
        elif spec["type"] == "tensor":
            values.append(tensors[spec["key"]])
        elif spec["type"] == "ndarray":
            values.append(tensors[spec["key"]].numpy())
        else:
            values.append(spec.get("v"))
    return unflatten(doc["tree"], values)


def load_foreign(path: str, kind: str, map_location: Any = None, allow_pickle: bool = False) -> Any:
    """Load a torch pickle (``weights_only`` unless ``allow_pickle``) or a safetensors file."""
    if kind == "safetensors":
        return _to_device(_load_safetensors(path), map_location)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=not allow_pickle, mmap=True)
    except Exception as err:
        hint = " (it holds non-tensor objects: pass allow_pickle=True only if you trust it)" if "weights_only" in str(err) else ""
        raise CheckpointError(f"checkpoint '{path}' is not a readable torch file: {one_line(err)}{hint}") from err
    return _to_device(obj, map_location)


def info_foreign(path: str, kind: str) -> dict:
    """``info`` for a torch or safetensors file (loads it memory-mapped)."""
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
        seen[leaf.key] = entry
        keys.append(entry)
    return {
        "path": path, "format": kind, "version": None, "keys": keys,
        "num_tensors": sum(1 for k in keys if k["type"] in ("tensor", "ndarray") and "tied_to" not in k),
        "total_bytes": sum(k.get("nbytes", 0) for k in keys),
    }


def save_torch(obj: Any, path: str) -> None:
    """torch.save, atomically (temp file, fsync, rename)."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


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
