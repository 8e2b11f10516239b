"""Flatten a nested checkpoint object into (structure tree, leaves) and rebuild it.

Validation happens here, before any file is created (safetensors' ``_evaluate_tensors_for_save``):
an unsupported value is reported with its flattened key, its type and what to do instead.
"""

from __future__ import annotations

import collections
import dataclasses
import pickle
from typing import Any, Callable

import numpy as np
import torch

from cs_run.checkpoint.format import torch_dtype_name
from cs_run.errors import CheckpointError

__all__ = ["Leaf", "UnsupportedValueError", "encode_key", "flatten", "leaf_paths", "map_leaves", "map_tensors", "spec_tree",
           "tree_paths", "unflatten"]

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_NUMPY_KINDS = "biufc"  # bool, int, uint, float, complex: what HDF5 stores natively


class UnsupportedValueError(CheckpointError, TypeError):
    """A value cannot be stored without pickle (raised before the file is created)."""


@dataclasses.dataclass(slots=True)
class Leaf:
    """One leaf of the flattened object: its flattened key, its value and how it is stored."""

    key: str
    value: Any
    kind: str  # "tensor", "ndarray", "npscalar", "int", "float", ..., "pickle", "tied"
    tied_to: int | None = None
    payload: Any = None  # pickled bytes for "pickle", big-int text for "int"


def _fix(kind: str) -> str:
    return {
        "sparse": "convert it with .to_dense() first",
        "subclass": "convert it with .as_subclass(torch.Tensor) first",
        "dtype": "cast it to a supported dtype first",
        "meta": "materialize it on a real device first",
    }[kind]


def _check_tensor(key: str, t: torch.Tensor) -> None:
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        raise UnsupportedValueError(f"cannot save key '{key}': tensor subclass {type(t).__name__}; {_fix('subclass')}")
    if t.layout != torch.strided:
        raise UnsupportedValueError(f"cannot save key '{key}': {t.layout} tensor; {_fix('sparse')}")
    if t.is_quantized or torch_dtype_name(t.dtype) is None:
        raise UnsupportedValueError(f"cannot save key '{key}': dtype {t.dtype} is not supported; {_fix('dtype')}")
    if t.device.type == "meta":
        raise UnsupportedValueError(f"cannot save key '{key}': tensor on the meta device; {_fix('meta')}")


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same bytes seen the same way (tied weights); the caller has matched ``data_ptr()``, which
    already includes the storage offset."""
    return a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype and a.device == b.device


def _classify(key: str, value: Any, allow_pickle: bool) -> tuple[str, Any]:
    """The storage kind of a non-container leaf (and its payload), or raise naming the key."""
    if value is None:
        return "none", None
    if isinstance(value, torch.Tensor):
        _check_tensor(key, value)
        return "tensor", None
    tp = type(value)
    if tp is bool:
        return "bool", None
    if tp is int:
        return "int", (None if _INT64_MIN <= value <= _INT64_MAX else str(value))
    if tp in (float, complex, str, bytes):
        return tp.__name__, None
    if tp is np.ndarray and value.dtype.kind in _NUMPY_KINDS:
        return "ndarray", None
    if isinstance(value, np.generic) and value.dtype.kind in _NUMPY_KINDS:
        return "npscalar", None
    if allow_pickle:
        try:
            return "pickle", pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as err:
            raise UnsupportedValueError(f"cannot save key '{key}': pickling {tp.__name__} failed: {err}") from err
    raise UnsupportedValueError(
        f"cannot save key '{key}': {tp.__module__}.{tp.__qualname__} is not supported without pickle "
        "(supported: tensors, numpy arrays, int/float/bool/complex/str/bytes/None in dict/list/tuple); "
        "convert it, or pass allow_pickle=True to save (and load) if every reader trusts this file"
    )


def encode_key(key: Any, where: str) -> Any:
    if type(key) is str:
        return key
    if type(key) in (int, float, bool) or key is None:
        return [{int: "int", float: "float", bool: "bool"}.get(type(key), "none"), key]
    raise UnsupportedValueError(f"cannot save '{where}': dict key {key!r} of type {type(key).__name__}; use str or int keys")


def _decode_key(key: Any) -> Any:
    if isinstance(key, str):
        return key
    tag, value = key
    return None if tag == "none" else {"int": int, "float": float, "bool": bool}[tag](value)


def flatten(obj: Any, allow_pickle: bool = False) -> tuple[Any, list[Leaf]]:
    """Split ``obj`` into a JSON-able tree and its leaves, validating every value."""
    leaves: list[Leaf] = []
    by_address: dict[int, list[int]] = {}  # data_ptr -> indices of leaves that start there
    active: set[int] = set()

    def visit(value: Any, key: str, root: bool = False) -> Any:
        tp = type(value)
        if tp in (dict, collections.OrderedDict, list, tuple):
            if id(value) in active:
                raise UnsupportedValueError(f"cannot save key '{key}': the structure contains itself")
            active.add(id(value))
            try:
                return _visit_container(value, "" if root else key + ".", key, visit)
            finally:
                active.discard(id(value))
        kind, payload = _classify(key, value, allow_pickle)
        leaf = Leaf(key, value, kind, payload=payload)
        if kind == "tensor" and value.numel():
            seen = by_address.setdefault(value.data_ptr(), [])
            for i in seen:
                if _same_view(leaves[i].value, value):
                    leaf.kind, leaf.tied_to = "tied", i
                    break
            else:
                seen.append(len(leaves))
        leaves.append(leaf)
        return len(leaves) - 1

    return visit(obj, "", root=True), leaves


def _visit_container(value: Any, prefix: str, key: str, visit) -> Any:
    """The tree node of a container; its children's keys are ``prefix`` + their own key or index."""
    if isinstance(value, dict):
        items = [[encode_key(k, key or "<root>"), visit(v, f"{prefix}{k}")] for k, v in value.items()]
        if type(value) is dict:
            return {"dict": items}
        node: dict[str, Any] = {"odict": items}
        meta = getattr(value, "_metadata", None)
        if isinstance(meta, dict):
            node["meta"] = [[encode_key(k, key), v] for k, v in meta.items()]
        return node
    return {type(value).__name__: [visit(v, f"{prefix}{i}") for i, v in enumerate(value)]}


def unflatten(tree: Any, values: list) -> Any:
    """Rebuild the object from ``tree`` and the loaded leaf values (indexed as in the spec)."""
    if isinstance(tree, int):
        return values[tree]
    if "dict" in tree:
        return {_decode_key(k): unflatten(v, values) for k, v in tree["dict"]}
    if "odict" in tree:
        out = collections.OrderedDict((_decode_key(k), unflatten(v, values)) for k, v in tree["odict"])
        if "meta" in tree:
            out._metadata = {_decode_key(k): v for k, v in tree["meta"]}  # type: ignore[attr-defined]
        return out
    if "list" in tree:
        return [unflatten(v, values) for v in tree["list"]]
    if "tuple" in tree:
        return tuple(unflatten(v, values) for v in tree["tuple"])
    raise CheckpointError(f"unknown node in structure spec: {sorted(tree)}")


def spec_tree(root: Any, parts: Callable[[Any, tuple], tuple[str, list | None, list] | None],
              encode: Callable[[Any], Any]) -> tuple[Any, list[str]]:
    """cs-run's structure tree of another format's structure spec (the vendor's pytree TreeSpec, pickled or
    JSON), and each leaf's flattened key in flatten order.

    ``parts(node, scope)`` is None for a leaf, else the node's kind ("dict", "odict", "list", "tuple"), its
    dict keys (None for a sequence) and its children; it raises on a container cs-run does not store.
    ``encode`` turns a dict key into the spec's encoding (:func:`encode_key`'s form).
    """
    keys: list[str] = []

    def walk(node: Any, scope: tuple) -> Any:
        found = parts(node, scope)
        if found is None:
            keys.append(".".join(scope))
            return len(keys) - 1
        kind, names, children = found
        if names is None:
            return {kind: [walk(c, scope + (str(i),)) for i, c in enumerate(children)]}
        return {kind: [[encode(k), walk(c, scope + (str(k),))] for k, c in zip(names, children)]}

    return walk(root, ()), keys


def leaf_paths(obj: Any) -> dict[tuple, Any]:
    """path -> leaf for a nested dict/list/tuple (the target of ``load_into``; :func:`map_leaves`'
    containers and paths); no validation."""
    out: dict[tuple, Any] = {}
    map_leaves(obj, lambda leaf, path: out.__setitem__(path, leaf))
    return out


def tree_paths(tree: Any) -> dict[int, tuple]:
    """leaf index -> key path (dict keys and list indices) for a structure spec tree."""
    out: dict[int, tuple] = {}

    def visit(node: Any, path: tuple) -> None:
        if isinstance(node, int):
            out[node] = path
            return
        for kind in ("dict", "odict"):
            for k, v in node.get(kind, ()):
                visit(v, path + (_decode_key(k),))
        for kind in ("list", "tuple"):
            for i, v in enumerate(node.get(kind, ())):
                visit(v, path + (i,))

    visit(tree, ())
    return out


_PLAIN = (dict, collections.OrderedDict, list, tuple)


def map_leaves(tree: Any, fn: Callable[[Any, tuple], Any], path: tuple = (), *, plain: bool = False,
               replace: Callable[[Any], Any] | None = None) -> Any:
    """``tree`` with every leaf (anything but a dict, list or tuple) replaced by ``fn(leaf, key_path)``,
    containers rebuilt in the tree's order (dict order is insertion order, the same on every replica:
    collectives inside ``fn`` line up). A namedtuple is a leaf.

    ``plain`` (a torch file's rule): only dict, OrderedDict, list and tuple themselves are containers
    (a subclass is a leaf), an OrderedDict keeps its ``_metadata`` (a state dict's versions), and
    ``replace(node)``, when given, is asked first: a result other than None stands for the whole node.
    """
    if plain:
        if type(tree) not in _PLAIN:
            return fn(tree, path)
        found = replace(tree) if replace is not None else None
        if found is not None:
            return found
    elif not isinstance(tree, dict) and not (isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields")):
        return fn(tree, path)
    if isinstance(tree, dict):
        out = type(tree)((k, map_leaves(v, fn, (*path, k), plain=plain, replace=replace)) for k, v in tree.items())
        if plain and hasattr(tree, "_metadata"):
            out._metadata = tree._metadata  # type: ignore[attr-defined]
        return out
    return type(tree)(map_leaves(v, fn, (*path, i), plain=plain, replace=replace) for i, v in enumerate(tree))


def map_tensors(tree: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``tree`` with every tensor leaf replaced by ``fn(leaf)`` (:func:`map_leaves`' order)."""
    return map_leaves(tree, lambda leaf, _: fn(leaf) if isinstance(leaf, torch.Tensor) else leaf)
