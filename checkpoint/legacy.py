"""Read-only support for the vendor's legacy H5 checkpoint layout (format versions <= 0.4).

Layout (cerebras_pytorch ``PyTorchH5Saver`` / ``H5Saver``): file attributes ``__version__`` (float,
absent means 0.1) and ``__spec__`` (hex of a dill pickle of a ``torch.utils._pytree.TreeSpec``,
whose leaves a writer on torch 2.14 or newer pickles as calls of ``treespec_leaf``); one dataset per
flattened key, named ``urllib.parse.quote(key, safe="")``, with ``__H5_TYPE__`` naming the type:
``TorchTensorH5Type`` / ``NumpyArrayH5Type`` (data; ``is_bfloat16`` marks bf16 stored as 16-bit
integers; version <= 0.3 arrays are torch tensors), ``ScalarH5Type`` (0-d dataset), ``StringH5Type``
(attribute ``string_value``), ``NoneH5Type``, ``ObjectH5Type`` (dill, attribute ``object_value``).
Tied weights are hard links to one dataset.

The spec is never unpickled with pickle's full power: a restricted unpickler accepts only the
pytree classes, builtin containers and dill's type loader, and builds inert stand-ins. If the spec
cannot be read that way, the leaves come back as a flat ``{key: value}`` dict (with a warning).
Dill objects are reported as unsupported, by key, when loaded.

Every dataset goes through :func:`h5_checks.open_dataset` (hard links only, bytes inside the file)
and every attribute through a size check, as for cs-run files.
"""

from __future__ import annotations

import collections
import io
import logging
import os
import pickle
from typing import Any
from urllib.parse import quote, unquote

import numpy as np

from cs_run._torch_compat import PYTREE_PICKLED_LEAVES, PYTREE_PICKLED_NODES
from cs_run.checkpoint import h5_checks
from cs_run.checkpoint.format import TORCH_DTYPES
from cs_run.checkpoint.spec import check_tree
from cs_run.checkpoint.tree import encode_key, spec_tree
from cs_run.errors import CheckpointError

__all__ = ["LEGACY_MAX_VERSION", "describe", "is_legacy"]

logger = logging.getLogger(__name__)

LEGACY_MAX_VERSION = 0.4
_TYPE_KEY = "__H5_TYPE__"
_NP_TO_TORCH = {str(np_dtype): name for name, (_, np_dtype, view) in TORCH_DTYPES.items() if view is None}


class _SpecStub:
    """Inert stand-in for a pickled TreeSpec / LeafSpec: it only keeps the pickled state."""

    is_leaf = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def parts(self) -> tuple[Any, Any, list]:
        """(container type, context, children) from either the dict or the list state form."""
        s = self.state
        if isinstance(s, dict):
            return s.get("type"), s.get("context"), list(s.get("children_specs") or [])
        if isinstance(s, (list, tuple)) and len(s) >= 3:
            return s[0], s[1], list(s[2] or [])
        return None, None, []


class _LeafStub(_SpecStub):
    is_leaf = True


def _load_type(name: str) -> type:
    allowed = {"DictType": dict, "ListType": list, "TupleType": tuple, "NoneType": type(None)}
    allowed.update({"dict": dict, "list": list, "tuple": tuple})
    if name not in allowed:
        raise pickle.UnpicklingError(f"type {name} not allowed in a spec")
    return allowed[name]


def _reconstructor(cls: type, base: type, state: Any) -> Any:
    if not issubclass(cls, _SpecStub):
        raise pickle.UnpicklingError(f"cannot rebuild {cls}")
    return cls()


# The pytree names differ by the writer's torch (a leaf is a LeafSpec, or from 2.14 on a call of
# treespec_leaf()); _torch_compat lists them. Calling either stand-in class makes an inert node.
_ALLOWED: dict[tuple[str, str], Any] = {
    **{name: _SpecStub for name in PYTREE_PICKLED_NODES},
    **{name: _LeafStub for name in PYTREE_PICKLED_LEAVES},
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("dill._dill", "_load_type"): _load_type,
    ("copyreg", "_reconstructor"): _reconstructor,
}
for _mod in ("builtins", "__builtin__"):
    for _name in ("dict", "list", "tuple", "object"):
        _ALLOWED[(_mod, _name)] = {"object": object}.get(_name) or _load_type(_name)


class _SpecUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a checkpoint spec")
        return _ALLOWED[(module, name)]


def is_legacy(path: str, f: Any, links: dict) -> bool:
    """A vendor file has ``__spec__`` / ``__version__`` attributes or ``__H5_TYPE__`` datasets."""
    from h5py import h5a, h5o

    if h5a.exists(f.id, b"__spec__") or h5a.exists(f.id, b"__version__"):
        return True
    first = next((name for name, (kind, _) in links.items() if kind == h5_checks.HARD), None)
    if first is None:
        return False
    try:
        return bool(h5a.exists(h5o.open(f.id, first), _TYPE_KEY.encode()))
    except Exception as err:  # noqa: BLE001 - a damaged object header
        raise CheckpointError(f"checkpoint '{path}' is corrupted: object {first!r} is unreadable") from err


def _spec_parts(node: _SpecStub, scope: tuple) -> tuple[str, list | None, list] | None:
    """:func:`~cs_run.checkpoint.tree.spec_tree`'s view of a TreeSpec stand-in node."""
    if node.is_leaf:
        return None
    tp, context, children = node.parts()
    if tp in (dict, collections.OrderedDict):
        return "dict" if tp is dict else "odict", list(context), children
    if tp in (list, tuple):
        return tp.__name__, None, children
    raise pickle.UnpicklingError(f"unsupported container {tp!r} in spec")


def _read_tree(path: str, f: Any) -> tuple[Any, list[str]]:
    raw = h5_checks.attr_value(path, f, "__spec__", os.path.getsize(path))
    if raw is not None:
        try:
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            root = _SpecUnpickler(io.BytesIO(bytes.fromhex(text))).load()
            return spec_tree(root, _spec_parts, lambda k: encode_key(k, "spec"))
        except Exception as err:  # noqa: BLE001 - fall back to the flat key listing
            logger.warning("checkpoint %s: cannot read its __spec__ (%s); returning a flat dict", path, err)
    keys = [unquote(name) for name in f]
    return {"dict": [[k, i] for i, k in enumerate(keys)]}, keys


def _tensor_spec(path: str, key: str, name: str, ds: Any, as_array: bool, attr: Any) -> dict:
    if ds.dtype.kind not in "biufc" or ds.dtype.fields is not None or ds.dtype.subdtype is not None or ds.shape is None:
        raise CheckpointError(f"checkpoint '{path}': legacy key '{key}' has dtype {ds.dtype}, which has no tensor "
                              "equivalent")
    native = ds.dtype.newbyteorder("=")
    spec: dict[str, Any] = {"key": key, "ds": name, "shape": list(ds.shape), "n": int(ds.size * native.itemsize)}
    if attr("is_bfloat16", False):
        if native not in (np.dtype(np.uint16), np.dtype(np.int16)):
            raise CheckpointError(f"checkpoint '{path}': legacy key '{key}' is flagged bfloat16 but stored as {ds.dtype}")
        spec.update(type="torch.bfloat16", mem=native.str)
    elif as_array:
        spec.update(type="ndarray", dtype=native.str)
    elif str(native) in _NP_TO_TORCH:
        spec.update(type="torch." + _NP_TO_TORCH[str(native)], mem=native.str)
    else:
        raise CheckpointError(f"checkpoint '{path}': legacy key '{key}' has dtype {ds.dtype}, which has no torch "
                              "equivalent")
    return spec


def _leaf_spec(path: str, f: Any, key: str, version: float, links: dict, size: int) -> dict:
    name = quote(key, safe="")
    if name.encode() not in links:
        raise CheckpointError(f"checkpoint '{path}' is corrupted: key '{key}' from __spec__ has no dataset")
    ds = h5_checks.open_dataset(path, f, links, name, key, size)

    def attr(attr_name: str, default: Any = None) -> Any:
        return h5_checks.attr_value(path, ds, attr_name, size, default)

    kind = attr(_TYPE_KEY)
    kind = kind.decode() if isinstance(kind, bytes) else kind
    base = {"key": key, "ds": name}
    if kind in ("TorchTensorH5Type", "NumpyArrayH5Type"):
        return _tensor_spec(path, key, name, ds, kind == "NumpyArrayH5Type" and version > 0.3, attr)
    if kind == "ScalarH5Type" or (kind is None and attr("is_scalar", False)):  # releases <= 1.8: bare values
        if ds.shape != () or ds.dtype.kind not in "biufc":
            raise CheckpointError(f"checkpoint '{path}' is corrupted: scalar key '{key}' is stored as "
                                  f"{ds.dtype}{list(ds.shape or ())}")
        value = ds[()].item()
        return {**base, "type": type(value).__name__, "v": value}
    if kind == "StringH5Type" or (kind is None and attr("is_string", False)):
        value = attr("string_value", attr("string_val", ""))
        return {**base, "type": "str", "v": value.decode() if isinstance(value, bytes) else str(value)}
    if kind == "NoneH5Type" or (kind is None and attr("is_none", False)):
        return {**base, "type": "none", "v": None}
    if kind == "ObjectH5Type":
        return {**base, "type": "dill", "cls": "dill object, ObjectH5Type"}
    if kind is None:
        return _tensor_spec(path, key, name, ds, False, attr)
    raise CheckpointError(f"checkpoint '{path}': key '{key}' has unknown {_TYPE_KEY} {str(kind)[:40]!r}")


def describe(path: str, f: Any, links: dict) -> tuple[Any, list[dict]]:
    """(structure tree, leaf specs) of a vendor legacy file, in the spec format of cs-run files."""
    size = os.path.getsize(path)
    try:
        version = float(h5_checks.attr_value(path, f, "__version__", 8, 0.1))
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint '{path}' is corrupted: its __version__ is not a number") from err
    if version > LEGACY_MAX_VERSION:
        raise CheckpointError(
            f"checkpoint '{path}' has vendor format version {version}; cs-run reads the legacy layout "
            f"up to {LEGACY_MAX_VERSION} (convert it with the vendor tools to an older layout or to torch)"
        )
    try:
        tree, keys = _read_tree(path, f)
        specs = [_leaf_spec(path, f, key, version, links, size) for key in keys]
    except CheckpointError:
        raise
    except Exception as err:
        raise CheckpointError(f"checkpoint '{path}' is corrupted: {err}") from err
    check_tree(path, tree, len(specs))
    _mark_ties(links, specs)
    return tree, specs


def _mark_ties(links: dict, specs: list[dict]) -> None:
    """Hard links to one dataset (the vendor's tied weights) load as one tensor."""
    first: dict[Any, int] = {}
    for i, spec in enumerate(specs):
        if "n" not in spec or spec["n"] == 0:
            continue
        addr = links[spec["ds"].encode()][1]
        if addr in first and specs[first[addr]]["type"] == spec["type"] and specs[first[addr]]["shape"] == spec["shape"]:
            spec["tied"] = first[addr]
        else:
            first.setdefault(addr, i)
