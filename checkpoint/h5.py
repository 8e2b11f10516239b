"""The verbs of one checkpoint file: ``save``, ``load``, ``load_into``, ``check_target``, ``info`` (the
public ones, for a file or a sharded folder, are :mod:`cs_run.checkpoint.files`'s).

h5py is imported inside the functions that need it, so ``import cs_run`` stays cheap.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
from typing import Any, Callable, Optional, Union

import numpy as np
import torch

from cs_run.checkpoint import foreign, legacy, vendor_format
from cs_run.checkpoint import format as fmt
from cs_run.checkpoint.atomic import atomic_path
from cs_run.checkpoint.crc import Piece, join
from cs_run.checkpoint.h5_checks import attr_value, root_links
from cs_run.checkpoint.placement import MapLocation, finish_tensor, stays_on_cpu
from cs_run.checkpoint.reader import (
    H5Source,
    NotACheckpointError,
    check_path,
    has_data,
    one_line,
    open_h5,
    raise_if_damaged,
    read_spec,
    storage_dtype,
)
from cs_run.checkpoint.shard_index import is_sharded
from cs_run.checkpoint.tree import flatten, leaf_paths, map_leaves, tree_paths, unflatten
from cs_run.checkpoint.writer import COMPRESSIONS, write_file
from cs_run.errors import CheckpointError, ParamsError

__all__ = ["MapLocation", "TargetMismatchError", "check_checkpoint_file", "check_pieces", "check_target", "info", "load",
           "load_into", "load_rows_into", "open_source", "save"]

logger = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]


def save(state_dict: Any, ckpt_path: PathLike, *, compression: str | None = None, allow_pickle: bool = False,
         write: bool = True) -> None:
    """Save ``obj`` (nested dict/list/tuple of tensors, arrays, scalars, str, None) atomically.

    Used exactly like ``torch.save(obj, path)``. The whole object is validated before any file is
    created; then tensors stream to a temporary file in the same folder, which is fsynced, marked
    complete and renamed over ``path``. A crash at any moment leaves the previous file intact.

    Args:
        state_dict: the object; tied tensors (same view of the same storage) are stored once.
        ckpt_path: destination file; its folder is created if needed.
        compression: None (contiguous, memory-mappable; the default), "gzip" or "lzf".
        allow_pickle: also store other Python objects with pickle. Loading them then needs
            ``load(..., allow_pickle=True)`` too. Off by default: a pickle runs code when loaded.
        write: False validates only: another process writes the file (the caller decides who writes;
            ``cstorch.save`` passes ``replicas.is_master()``, so of several replicas ordinal 0 writes).

    Raises:
        CheckpointError: a value cannot be stored (names the key, the type and the fix), or the
            file cannot be written.
    """
    obj, path = state_dict, os.fspath(ckpt_path)
    if compression not in COMPRESSIONS:
        raise ParamsError(f"invalid compression {compression!r}; expected one of {list(COMPRESSIONS)}")
    tree, leaves = flatten(obj, allow_pickle=allow_pickle)  # validates before touching the disk
    if not write:
        logger.debug("checkpoint %s is written by another process", path)
        return
    if os.path.isdir(path) and not is_sharded(path):
        raise CheckpointError(f"cannot save checkpoint to '{path}': it is a directory (and not a sharded checkpoint "
                              "this save would replace); give a file path")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        with atomic_path(path, folder_ok=True) as tmp:  # a sharded checkpoint of the same name is replaced
            write_file(tmp, tree, leaves, compression)
    except OSError as err:
        raise CheckpointError(f"cannot save checkpoint to '{path}': {err}") from err
    logger.debug("saved checkpoint %s (%d leaves)", path, len(leaves))


def _describe(path: str, f: Any, links: dict) -> tuple[Any, list[dict], bool]:
    """(tree, leaf specs, offsets-trusted) for a cs-run file or a vendor legacy file."""
    fmt_name = attr_value(path, f, fmt.ATTR_FORMAT, 256)
    if isinstance(fmt_name, bytes):
        fmt_name = fmt_name.decode()
    if fmt_name == fmt.FORMAT_NAME:
        spec = read_spec(path, f)
        return spec["tree"], spec["leaves"], True
    if vendor_format.is_vendor_format(f):  # the vendor's current layout (format 0.5, releases 2.6+)
        tree, specs = vendor_format.describe(path, f)
        return tree, specs, False
    if legacy.is_legacy(path, f, links):
        tree, specs = legacy.describe(path, f, links)
        return tree, specs, False
    raise NotACheckpointError(
        f"checkpoint '{path}' is an HDF5 file but not a checkpoint (no {fmt.ATTR_FORMAT} or __spec__ attribute)"
    )


def open_source(path: str, verify: bool = True) -> tuple[Any, H5Source]:
    """An H5 checkpoint file opened for a partial read: its structure tree (:func:`tree_paths` names the
    leaves of ``H5Source.specs``) and the source; the caller closes it (``src.close()``)."""
    check_path(path)
    return _open_source(path, verify)


def _open_source(path: str, verify: bool = True) -> tuple[Any, H5Source]:
    f = open_h5(path)
    try:
        links = root_links(f)
        tree, specs, trusted = _describe(path, f, links)
        return tree, H5Source(path, f, specs, trust_offsets=trusted, verify=verify, links=links)
    except CheckpointError:
        f.close()
        raise
    except Exception as err:
        f.close()
        raise CheckpointError(f"checkpoint '{path}' is corrupted ({one_line(err)})") from err


def _value(src: H5Source, spec: dict, values: list, lazy: bool, map_location: MapLocation, allow_pickle: bool) -> Any:
    """One leaf's value. Large tensor and array reads may still be running: ``src.wait()`` before use."""
    kind = spec["type"]
    if "tied" in spec:
        return values[spec["tied"]]
    if kind.startswith("torch."):
        return finish_tensor(src.tensor(spec, lazy, defer=stays_on_cpu(map_location)), spec, map_location)
    if kind == "ndarray":
        return src.ndarray(spec, lazy, defer=True)
    if kind == "npscalar":
        return src.ndarray(spec, lazy=False)[()]
    if kind in ("pickle", "dill"):
        if kind == "dill" or not allow_pickle:
            why = "cs-run cannot read dill objects" if kind == "dill" else "pass allow_pickle=True only if you trust it"
            raise CheckpointError(
                f"checkpoint '{src.path}': key '{spec['key']}' holds a pickled Python object "
                f"({spec.get('cls', 'unknown class')}); refusing to unpickle it ({why})"
            )
        return pickle.loads(src.dataset_value(spec))
    if "v" in spec:
        return spec["v"]
    return src.dataset_value(spec)


def load(
    ckpt_path: PathLike,
    map_location: MapLocation = None,
    *,
    lazy: bool = True,
    verify: bool = True,
    allow_pickle: bool = False,
) -> Any:
    """Load a checkpoint written by :func:`save` (or a vendor H5, torch pickle or safetensors file).

    Returns the saved structure with the same container and leaf types; tied tensors come back as
    one tensor object. Used like ``torch.load(path, map_location)``.

    Args:
        ckpt_path: the file.
        map_location: where tensors go: None (CPU; unlike torch.load, saved devices are not
            restored by default), a device or string, a dict mapping saved device strings to
            devices, or a callable ``fn(cpu_tensor, saved_device) -> tensor``.
        lazy: True (default): uncompressed tensors are memory-mapped (private, copy-on-write) from
            the file, so loading is near-instant and only bytes that are used are read. They are
            ordinary, writable ``torch.Tensor`` objects; writes never reach the file, and the file
            may be deleted or replaced (cs-run replaces by rename) while they live. Use
            ``lazy=False`` for plain in-memory tensors, e.g. if another program rewrites the file
            in place.
        verify: check every leaf's bytes against the CRC32 recorded at save before returning (the
            default; the check rides on the read, see :mod:`cs_run.checkpoint.reader`). With lazy
            loading it reads the file once through a small buffer, so ``lazy=True`` is no longer
            near-instant; ``verify=False`` skips the check (trusted files, speed) and gives back
            the instant memory-mapped load. Vendor, torch and safetensors files record no CRC32s.
        allow_pickle: unpickle objects saved with ``save(..., allow_pickle=True)``. Also lets a
            torch pickle file be read with ``weights_only=False``. Only for trusted files.

    Raises:
        CheckpointError: the file is missing, a directory, empty, truncated, corrupted,
            incomplete, from a newer format version, damaged (a checksum mismatch, naming the keys),
            forged (a spec the format does not allow, data outside the file: external storage,
            virtual datasets, soft or external links), or holds a pickled object without
            ``allow_pickle``.
    """
    path = os.fspath(ckpt_path)
    kind = check_path(path)
    if kind != "h5":
        return foreign.load_foreign(path, kind, map_location=map_location, allow_pickle=allow_pickle)
    tree, src = _open_source(path, verify)
    try:
        values: list = []
        for spec in src.specs:
            values.append(_value(src, spec, values, lazy, map_location, allow_pickle))
        src.wait()
        return unflatten(tree, values)
    finally:
        src.close()


class TargetMismatchError(CheckpointError):
    """``load_into``: the file is readable but does not fit the target (a key missing, another dtype or
    shape); raised before any byte is read. Unlike damage, an older checkpoint will not fit either."""


def _key(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _check_target(path: str, src: H5Source, paths: dict, want: dict) -> dict[tuple, dict]:
    """Match every target tensor to a stored tensor of the same dtype and shape, or raise."""
    by_path = {p: i for i, p in paths.items()}
    matched = {}
    for p, t in want.items():
        if p not in by_path:
            raise TargetMismatchError(f"checkpoint '{path}' has no key '{_key(p)}' (the target has a tensor there)")
        spec = src.specs[by_path[p]]
        spec = src.specs[spec["tied"]] if "tied" in spec else spec
        if not spec["type"].startswith("torch."):
            raise TargetMismatchError(f"checkpoint '{path}': key '{_key(p)}' holds a {spec['type']}, the target a tensor")
        _check_same_kind(path, p, spec["type"][len("torch.") :], spec["shape"], t)
        matched[p] = spec
    return matched


def _check_same_kind(path: str, p: tuple, dtype_name: str, shape: Any, t: torch.Tensor) -> None:
    """A stored tensor restores a target tensor of its own dtype and shape only (never cast or broadcast)."""
    if (dtype_name, tuple(shape)) != (fmt.torch_dtype_name(t.dtype), tuple(t.shape)):
        raise TargetMismatchError(
            f"checkpoint '{path}': key '{_key(p)}' is {dtype_name}{list(shape)} in the file but "
            f"{fmt.torch_dtype_name(t.dtype)}{list(t.shape)} in the target"
        )


def _check_loaded_target(path: str, have: dict, want: dict) -> None:
    """A torch / safetensors file, loaded: the rule of :func:`_check_target` on its tensors."""
    for p, t in want.items():
        if p not in have or not isinstance(have[p], torch.Tensor):
            raise TargetMismatchError(f"checkpoint '{path}' has no tensor '{_key(p)}' (the target has one there)")
        _check_same_kind(path, p, fmt.torch_dtype_name(have[p].dtype), have[p].shape, t)


def _target_tensors(target: Any) -> dict[tuple, torch.Tensor]:
    return {p: t for p, t in leaf_paths(target).items() if isinstance(t, torch.Tensor)}


def check_target(path: PathLike, target: Any) -> None:
    """Raise unless :func:`load_into` can restore ``path`` into ``target`` (its rule: every target
    tensor has a stored tensor under its key path, in an H5 file of the same dtype and shape). Reads no
    tensor data of an H5 file (a torch or safetensors file is loaded memory-mapped). A run checks the
    checkpoint it starts from with it before it writes anything.

    Raises:
        TargetMismatchError: naming the first key that does not fit.
        CheckpointError: the file cannot be read (as :func:`load` raises).
    """
    path = os.fspath(path)
    want = _target_tensors(target)
    if check_path(path) != "h5":
        _check_loaded_target(path, leaf_paths(load(path, map_location="cpu")), want)
        return
    tree, src = _open_source(path, verify=False)
    try:
        _check_target(path, src, tree_paths(tree), want)
    finally:
        src.close()


def _read_into_tensor(src: H5Source, spec: dict, t: torch.Tensor) -> None:
    """Read the stored bytes straight into ``t``'s memory (staged through a mapping if on GPU)."""
    if t.is_cpu and t.is_contiguous() and not (t.is_conj() or t.is_neg()):
        if spec.get("off") is not None:  # resume hot path: a few microseconds per tensor
            src.read_bytes_into(spec, _writable_buffer(t.detach() if t.requires_grad else t), defer=True)
        elif t.numel():
            src.read_into(spec, t.detach().reshape(-1).view(torch.uint8).numpy(), storage_dtype(spec))
        return
    with torch.no_grad():
        t.copy_(src.tensor(spec, lazy=True))


def _writable_buffer(t: torch.Tensor) -> np.ndarray:
    """A numpy array over a contiguous CPU tensor's memory, for ``preadv`` to fill (numpy's buffer
    export measured 2x faster than a ctypes array over ``data_ptr()`` for thousands of small tensors)."""
    try:
        return t.numpy()
    except TypeError:  # dtypes numpy lacks (bfloat16, float8, ...)
        return t.reshape(-1).view(torch.uint8).numpy()


def load_into(
    path: PathLike, target: Any, *, map_location: MapLocation = None, verify: bool = True, allow_pickle: bool = False,
    skip: Optional[Callable[[tuple], bool]] = None,
) -> Any:
    """Restore a checkpoint into existing tensors (the resume path) and return the full structure.

    ``target`` is a nested dict/list whose tensor leaves are existing tensors, e.g.
    ``{"model": model.state_dict(), "optimizer": optimizer.state_dict()}``. Each stored tensor with
    the same key path is read straight into that tensor's memory (no intermediate copy, no extra
    memory beyond the target). Everything is checked before the first byte is read.

    Returns:
        The loaded structure: matched leaves are the target's own tensors, other tensors are loaded
        into memory (``lazy=False``), non-tensor leaves (global_step, ...) as saved.

    ``verify`` (default True) checks every stored byte against its CRC32 as it is read, as in
    :func:`load`. A damaged tensor is found only once its bytes are in the target: after the error
    the target holds them, so restore it from another checkpoint before using it.

    ``skip``: leaves of an H5 file whose key path it is true for are not read (None in the structure; a
    sharded checkpoint's shard 0 read for its state, not its rows).

    Raises:
        CheckpointError: a target tensor's key is missing from the file, or its dtype or shape
            differs (names the key); or any :func:`load` error.
    """
    return _load_into(os.fspath(path), target, {}, map_location, verify, allow_pickle, skip)[0]


Rows = dict[tuple, tuple[int, torch.Tensor]]  # key path -> (first row, the tensor the rows go into)


def load_rows_into(path: PathLike, target: Any, rows: Rows, *, verify: bool = True) -> tuple[Any, list[Piece]]:
    """:func:`load_into` for one replica of a sharded run: the tensor at each key path of ``rows``,
    ``(first, part)``, gets only rows ``[first, first + len(part))`` (dim 0) of the stored tensor, and only
    those bytes are read; ``target`` has a tensor of the whole dtype and shape there (``meta`` will do: it
    is only checked). Every other leaf is read as :func:`load_into` reads it (CRC32s checked).

    Returns the structure (with the ``part`` tensors) and the CRC32 :class:`~cs_run.checkpoint.crc.Piece`
    of each row range read: one replica's rows are not what a CRC32 was recorded of, so the replicas
    check their pieces joined (:func:`check_pieces`). A torch or safetensors file has neither rows to
    read alone nor CRC32s: it is loaded whole and the rows copied out (no pieces)."""
    path = os.fspath(path)
    want = _target_tensors(target)
    for p, (first, part) in rows.items():
        whole = want.get(p)
        if (whole is None or not whole.dim() or part.shape[1:] != whole.shape[1:] or part.dtype != whole.dtype
                or not (part.is_cpu and part.is_contiguous()) or not 0 <= first <= whole.shape[0] - part.shape[0]):
            shape = list(whole.shape) if whole is not None else "no tensor"
            raise CheckpointError(f"cannot read key '{_key(p)}' of '{path}' into rows {first}+{len(part)} of {shape}: "
                                  "not a contiguous CPU dim-0 part of the target's tensor")
    return _load_into(path, target, rows, None, verify, False, None)


def _load_into(path: str, target: Any, rows: Rows, map_location: MapLocation, verify: bool, allow_pickle: bool,
               skip: Optional[Callable[[tuple], bool]]) -> tuple[Any, list[Piece]]:
    want = _target_tensors(target)
    if check_path(path) != "h5":  # torch / safetensors: load, then copy in
        obj = load(path, map_location, verify=verify, allow_pickle=allow_pickle)
        have = leaf_paths(obj)
        _check_loaded_target(path, have, want)
        with torch.no_grad():
            for p, t in want.items():
                if p in rows:
                    first, part = rows[p]
                    part.copy_(have[p][first:first + len(part)])
                else:
                    t.copy_(have[p])
        return map_leaves(obj, lambda leaf, p: rows[p][1] if p in rows else leaf), []
    tree, src = _open_source(path, verify)
    try:
        paths = tree_paths(tree)
        matched = _check_target(path, src, paths, want)
        values: list = []
        pieces: list[Piece] = []
        done: set[tuple[int, str]] = set()  # (destination, stored key): tied keys' rows are read once
        for i, spec in enumerate(src.specs):
            p = paths[i]
            if p in rows:
                first, part = rows[p]
                if (id(part), matched[p]["key"]) not in done:
                    done.add((id(part), matched[p]["key"]))
                    pieces += _read_rows(src, matched[p], first, part)
                values.append(part)
            elif p in matched:
                _read_into_tensor(src, matched[p], want[p])
                values.append(want[p])
            elif skip is not None and skip(p):
                values.append(None)
            else:
                values.append(_value(src, spec, values, False, map_location, allow_pickle))
        src.wait()
        return unflatten(tree, values), pieces
    finally:
        src.close()


def _read_rows(src: H5Source, spec: dict, first: int, part: torch.Tensor) -> list[Piece]:
    """Rows ``[first, first + len(part))`` of a stored tensor into ``part``; their CRC32 piece (none to
    check: verify off, no CRC32 recorded, no bytes)."""
    crc = src.read_rows_into(spec, first, len(part), part.detach().reshape(-1).view(torch.uint8).numpy())
    row_bytes = spec["n"] // spec["shape"][0] if spec["n"] else 0
    if not (src.verify and spec.get("crc") is not None and len(part) and row_bytes):
        return []
    return [Piece(0, spec["key"], first * row_bytes, len(part) * row_bytes, crc, spec["crc"], spec["n"])]


def check_pieces(path: PathLike, pieces: list[Piece]) -> int:
    """Join the replicas' row pieces (:func:`load_rows_into`, every replica's) per key and raise naming the
    file and the keys whose joined CRC32 is not the recorded one; also for keys the pieces do not cover
    whole (a split of the rows that leaves some unread: nothing would vouch for them). Returns how many
    keys were checked."""
    path = os.fspath(path)
    joined = join(pieces)
    raise_if_damaged(path, sorted(str(leaf) for (_, leaf), sound in joined.items() if sound is False))
    uncovered = sorted(str(leaf) for (_, leaf), sound in joined.items() if sound is None)
    if uncovered:
        raise CheckpointError(f"checkpoint '{path}': the replicas read rows of '{uncovered[0]}' that do not cover it "
                              f"({len(uncovered)} key(s)), so its CRC32 cannot be checked; its rows were split other "
                              "than by torch.chunk over the replicas")
    return len(joined)


def _entry(spec: dict, specs: list[dict], src: H5Source) -> dict:
    kind = spec["type"]
    base = specs[spec["tied"]] if "tied" in spec else spec
    entry: dict[str, Any] = {"key": spec["key"], "type": "tensor" if kind.startswith("torch.") else kind}
    if kind.startswith("torch."):
        entry["dtype"] = kind[len("torch.") :]
    elif "dtype" in base:
        entry["dtype"] = str(np.dtype(base["dtype"]))
    if "shape" in base:
        entry["shape"] = list(base["shape"])
    entry["nbytes"] = 0 if "tied" in spec else int(base.get("n", 0))
    if "tied" in spec:
        entry["tied_to"] = specs[spec["tied"]]["key"]
    elif kind in SCALAR_TYPES or (entry.get("shape") == [] and kind in ("ndarray", "npscalar") + TENSOR_TYPES):
        try:
            entry["value"] = _scalar_value(src, spec)
        except CheckpointError as err:  # a damaged leaf: info still describes the rest (--verify names it)
            logger.debug("info: no value for %s: %s", spec["key"], err)
    return entry


TENSOR_TYPES = tuple(f"torch.{name}" for name in fmt.TORCH_DTYPES)
SCALAR_TYPES = ("int", "float", "bool", "str", "none", "complex")


def _scalar_value(src: H5Source, spec: dict) -> Any:
    """A scalar leaf's value (or a 0-d tensor's / array's), JSON-safe: complex as its str()."""
    kind = spec["type"]
    if kind.startswith("torch."):
        value = src.tensor(spec, lazy=False).item()
    elif kind in ("ndarray", "npscalar"):
        value = src.ndarray(spec, lazy=False)[()].item()
    else:
        value = spec["v"] if "v" in spec else src.dataset_value(spec)
    src.wait()
    return str(value) if isinstance(value, complex) else value


def summarize(keys: list[dict]) -> dict:
    """The header of ``info``: ``global_step`` (the value of the ``global_step`` key, else None),
    ``num_parameters`` (elements of the tensors under ``model.``, of every tensor when no key is under
    it; tied copies once, buffers included: a state dict does not tell them apart) and
    ``parameter_tensors`` (how many tensors that counts)."""
    step = next((k.get("value") for k in keys if k["key"] == "global_step"), None)
    tensors = [k for k in keys if k["type"] in ("tensor", "ndarray") and "shape" in k and "tied_to" not in k]
    model = [k for k in tensors if k["key"].startswith("model.")] or tensors
    return {
        "global_step": step if isinstance(step, int) and not isinstance(step, bool) else None,
        "num_parameters": sum(math.prod(k["shape"]) for k in model),
        "parameter_tensors": len(model),
    }


def info(path: PathLike, verify: bool = False) -> dict:
    """Describe a checkpoint without loading its tensors: keys, types, dtypes, shapes, sizes, version,
    and the values of scalars (and of 0-d tensors).

    Returns:
        ``{"path", "format", "version", "keys": [{"key", "type", "dtype", "shape", "nbytes",
        "tied_to", "value"}], "num_tensors", "total_bytes", "global_step", "num_parameters",
        "parameter_tensors"}`` (see :func:`summarize`; ``version`` is None for torch and safetensors
        files, whose formats record none) plus, with ``verify``, ``"damaged"``: the keys
        whose bytes fail their CRC32, ``"unverified"``: the keys holding data with no CRC32 to check
        (vendor, torch and safetensors files record none), and ``"verified"``: how many passed.
    """
    path = os.fspath(path)
    kind = check_path(path)
    if kind != "h5":
        out = foreign.info_foreign(path, kind, verify)
        return {**out, **summarize(out["keys"])}
    _, src = _open_source(path, verify=False)
    try:
        legacy = fmt.ATTR_FORMAT not in src.f.attrs
        version = float(attr_value(path, src.f, "__version__", 8, 0.1)) if legacy else fmt.FORMAT_VERSION
        keys = [_entry(s, src.specs, src) for s in src.specs]
        out = {
            "path": path,
            "format": ("cerebras-h5" if version >= 0.5 else "cerebras-legacy-h5") if legacy else fmt.FORMAT_NAME,
            "version": version,
            "keys": keys,
            "num_tensors": sum(1 for k in keys if k["type"] in ("tensor", "ndarray") and "tied_to" not in k),
            "total_bytes": sum(k["nbytes"] for k in keys),
            **summarize(keys),
        }
        if verify:
            out["damaged"] = src.damaged_keys()
            out["unverified"] = src.unverified_keys()
            out["verified"] = sum(1 for s in src.specs if has_data(s) and s.get("crc") is not None) - len(out["damaged"])
        return out
    finally:
        src.close()


def check_checkpoint_file(path: PathLike) -> None:
    """Raise unless ``path`` is a complete, readable checkpoint (cs-run or vendor H5, torch, safetensors).

    Cheap: reads the header and, for H5, the attributes; never the tensor data. A run checks the file it
    starts from with it before it creates or writes anything.

    Raises:
        NotACheckpointError: the path names no checkpoint (missing, a folder, unreadable, another kind of file).
        CheckpointError: a damaged one (empty, truncated, corrupted, incomplete, written by a newer version).
        Each is one line naming the file and what is wrong.
    """
    path = os.fspath(path)
    try:
        if check_path(path) != "h5":
            return
        _, src = _open_source(path, verify=False)
    except OSError as err:
        raise NotACheckpointError(f"checkpoint '{path}' cannot be read: {one_line(err)}") from err
    src.close()
