"""Check a structure spec against what the format allows, before anything is read or allocated.

A spec comes from the file, so it is input like any other: a forged one could name a dtype or leaf
type that does not exist, claim an absurd shape, point a tree node at a leaf that is not there, or
describe more bytes than the file holds. Each of these is a one-line :class:`CheckpointError` naming
the key; after :func:`check_spec`, every data leaf's ``n`` equals its shape times its item size and
its bytes lie inside the file, so no load allocates more than the file's size.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from cs_run.checkpoint import format as fmt
from cs_run.errors import CheckpointError

__all__ = ["MAX_DEPTH", "MAX_RANK", "check_spec", "check_tree", "numpy_dtype"]

MAX_RANK = 32  # HDF5's limit on dataset rank
MAX_DEPTH = 200  # nesting of dicts/lists (saving deeper structures fails on Python's recursion limit)
_KEY_TAGS = {"int": int, "float": (float, int), "bool": bool, "none": type(None)}
_SCALAR_V = {"int": int, "float": float, "bool": bool, "str": str, "none": type(None)}
_DATA_KINDS = ("ndarray", "npscalar", "bytes", "pickle")


def _bad(path: str, where: str, what: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint '{path}' is corrupted or forged: {where} {what}; it was not written by cs-run as is "
        "(re-save it from a trusted copy)"
    )


def _is_int(x: Any) -> bool:
    return type(x) is int


def numpy_dtype(text: Any) -> np.dtype | None:
    """The numpy dtype a spec names, if it is a plain numeric one HDF5 stores natively (else None)."""
    if not isinstance(text, str) or len(text) > 16:
        return None
    try:
        dt = np.dtype(text)
    except (TypeError, ValueError):
        return None
    ok = dt.kind in "biufc" and dt.fields is None and dt.subdtype is None and 0 < dt.itemsize <= 16
    return dt if ok else None


def _check_shape(path: str, key: str, shape: Any, itemsize: int, n: Any) -> None:
    where = f"key '{key}'"
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(_is_int(d) and d >= 0 for d in shape):
        raise _bad(path, where, f"has shape {str(shape)[:80]}, not a list of at most {MAX_RANK} sizes >= 0")
    if not _is_int(n) or n != math.prod(shape) * itemsize:
        raise _bad(path, where, f"has shape {shape} of {itemsize}-byte items but records {str(n)[:40]} bytes")


def _check_extent(path: str, key: str, spec: dict, file_size: int) -> None:
    n, off = spec.get("n"), spec.get("off")
    if not _is_int(n) or n < 0:
        raise _bad(path, f"key '{key}'", f"records {str(n)[:40]} bytes")
    if off is not None and (not _is_int(off) or off < 0 or off + n > file_size):
        raise CheckpointError(
            f"checkpoint '{path}' is truncated or corrupted: data of key '{key}' ({n} bytes at offset "
            f"{str(off)[:40]}) does not lie inside the file ({file_size} bytes)"
        )
    if off is None and n > file_size * 1100 + (1 << 20):  # compressed: deflate expands at most 1032:1
        raise _bad(path, f"key '{key}'", f"claims {n} bytes, more than a {file_size}-byte file can hold")
    crc = spec.get("crc")
    if crc is not None and not (_is_int(crc) and 0 <= crc < 1 << 32):
        raise _bad(path, f"key '{key}'", "has an invalid checksum field")


def _check_leaf(path: str, i: int, spec: Any, specs: list, file_size: int) -> None:
    if not isinstance(spec, dict):
        raise _bad(path, f"leaf {i}", "is not an object")
    key = spec.get("key")
    if not isinstance(key, str) or not isinstance(spec.get("ds"), str) or not spec["ds"]:
        raise _bad(path, f"leaf {i}", "has no key or dataset name")
    kind = spec.get("type")
    where = f"key '{key}'"
    if "tied" in spec:
        j = spec["tied"]
        if not _is_int(j) or not 0 <= j < i or "tied" in specs[j] or specs[j].get("type") != kind:
            raise _bad(path, where, f"is tied to leaf {str(j)[:20]}, which is not an earlier leaf of its type")
        if not str(kind).startswith("torch."):
            raise _bad(path, where, f"is a tied {str(kind)[:40]}; only tensors can be tied")
        return
    if isinstance(kind, str) and kind.startswith("torch.") and kind[len("torch."):] in fmt.TORCH_DTYPES:
        _check_shape(path, key, spec.get("shape"), fmt.TORCH_DTYPES[kind[len("torch."):]][1].itemsize, spec.get("n"))
        _check_extent(path, key, spec, file_size)
        if "dev" in spec:
            try:
                torch.device(spec["dev"])
            except (TypeError, RuntimeError, ValueError):
                raise _bad(path, where, f"names device {str(spec['dev'])[:40]!r}") from None
        return
    if kind not in fmt.LEAF_TYPES:
        raise _bad(path, where, f"has leaf type {str(kind)[:40]!r}, which the format does not define "
                                f"(torch.<dtype> or one of {', '.join(fmt.LEAF_TYPES)})")
    if kind in ("ndarray", "npscalar"):
        dt = numpy_dtype(spec.get("dtype"))
        if dt is None:
            raise _bad(path, where, f"has dtype {str(spec.get('dtype'))[:40]!r}, not a numeric numpy dtype")
        _check_shape(path, key, spec.get("shape"), dt.itemsize, spec.get("n"))
        if kind == "npscalar" and spec["shape"]:
            raise _bad(path, where, "is a numpy scalar with a non-empty shape")
    if kind in _DATA_KINDS:
        _check_extent(path, key, spec, file_size)
    elif "v" in spec and type(spec["v"]) is not _SCALAR_V.get(kind):
        raise _bad(path, where, f"is a {kind} whose cached value is a {type(spec['v']).__name__}")


def _check_key(path: str, key: Any) -> None:
    if isinstance(key, str):
        return
    if not (isinstance(key, list) and len(key) == 2 and key[0] in _KEY_TAGS and isinstance(key[1], _KEY_TAGS[key[0]])
            and (key[0] == "bool" or type(key[1]) is not bool)):
        raise _bad(path, "the structure tree", f"has a dict key {str(key)[:60]} of no known kind")


def check_tree(path: str, tree: Any, n_leaves: int) -> None:
    """Every node is a known container, every key a known kind, and every leaf index in range and used once."""
    used = bytearray(n_leaves)
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _bad(path, "the structure tree", f"is nested more than {MAX_DEPTH} levels deep")
        if _is_int(node):
            if not 0 <= node < n_leaves or used[node]:
                raise _bad(path, "the structure tree", f"refers to leaf {node}, which is out of range or used twice")
            used[node] = 1
            continue
        kinds = [k for k in ("dict", "odict", "list", "tuple") if isinstance(node, dict) and k in node]
        if len(kinds) != 1 or not isinstance(node[kinds[0]], list) or set(node) - {kinds[0], "meta"}:
            raise _bad(path, "the structure tree", f"has a node {str(node)[:60]} of no known kind")
        items = node[kinds[0]]
        if kinds[0] in ("dict", "odict"):
            meta = node.get("meta", [])
            for pair in items + (meta if isinstance(meta, list) else [None]):
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise _bad(path, "the structure tree", f"has a dict entry {str(pair)[:60]} that is not [key, node]")
                _check_key(path, pair[0])
            stack.extend((child, depth + 1) for _, child in items)
        else:
            stack.extend((child, depth + 1) for child in items)
    if not all(used):
        raise _bad(path, "the structure tree", f"does not use leaf {used.index(0)}")


def check_spec(path: str, doc: Any, file_size: int) -> dict:
    """The parsed ``__structure__`` of a cs-run file, checked in full (see the module doc)."""
    if not isinstance(doc, dict) or "tree" not in doc:
        raise _bad(path, "the spec", "is not an object with a tree and leaves")
    leaves = doc.get("leaves")
    if not isinstance(leaves, list):
        raise _bad(path, "the spec", "has no leaf list")
    for i, spec in enumerate(leaves):
        _check_leaf(path, i, spec, leaves, file_size)
    check_tree(path, doc["tree"], len(leaves))
    return doc
