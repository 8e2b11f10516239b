"""Write one checkpoint file in the format of :mod:`cs_run.checkpoint.format` (no atomicity here).

Tensors stream one at a time: a contiguous CPU tensor is written straight from its own memory (a
numpy view, no copy); only a non-contiguous, conjugated or non-CPU tensor is copied, so extra memory
stays near the largest single tensor. The CRC32 of a large tensor runs on a worker thread while the
same bytes are written (the CRC releases the GIL).

The default (uncompressed) file is encoded by :mod:`cs_run.checkpoint.h5_encoder`, ~20x faster per
dataset than libhdf5; compressed files need chunked storage and filters, so they go through h5py.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from cs_run.checkpoint import format as fmt
from cs_run.checkpoint.atomic import fsync_path
from cs_run.checkpoint.crc import crc32
from cs_run.checkpoint.h5_encoder import Attr, H5Encoder, datatype_message, fixed_string_type
from cs_run.checkpoint.tree import Leaf

__all__ = ["COMPRESSIONS", "tensor_array", "write_file"]

COMPRESSIONS = (None, "gzip", "lzf")
_CRC_ON_THREAD_BYTES = 1 << 20  # below this, the thread hand-off costs more than it saves
_FLUSH_EVERY_BYTES = 64 << 20  # start write-back of the file every this many bytes


def tensor_array(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous CPU numpy array holding the tensor's bytes in its on-disk storage dtype."""
    _, np_dtype, view = fmt.TORCH_DTYPES[fmt.torch_dtype_name(t.dtype)]
    if t.requires_grad:
        t = t.detach()
    if not t.is_cpu:
        t = t.cpu()  # one copy of this tensor only
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    if view is not None:
        return t.view(view).numpy().view(np_dtype)
    return t.numpy()


class _LeafWriter:
    """Turns leaves into datasets and spec entries; subclasses put the datasets into the file.

    Shared by both: dataset names, the CRC32 of each array (on a worker thread for large ones, so it
    overlaps the write) and early write-back (every 64 MiB written, an ``fdatasync`` starts on a thread,
    so the fsync that makes the file durable finds little left to do).
    """

    def __init__(self, flush_fd: int, leaves: list[Leaf]) -> None:
        self.names: set[str] = set()
        # Hard links to each leaf, known up front (HDF5 object headers carry their link count).
        self.links_to: dict[int, int] = {}
        for leaf in leaves:
            if leaf.kind == "tied":
                self.links_to[leaf.tied_to] = self.links_to.get(leaf.tied_to, 0) + 1
        self._tie_targets: dict[int, tuple[str, str]] = {}  # leaf index -> (type, dataset name)
        self.pool = ThreadPoolExecutor(max_workers=1)
        self._flusher = ThreadPoolExecutor(max_workers=1)
        self._flush_fd = flush_fd
        self._flush_job: Any = None
        self._unflushed = 0
        self.index = 0  # position of the leaf being written

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self._flusher.shutdown(wait=True)

    def _written(self, nbytes: int) -> None:
        self._unflushed += nbytes
        if self._unflushed >= _FLUSH_EVERY_BYTES and (self._flush_job is None or self._flush_job.done()):
            self._flush_job = self._flusher.submit(os.fdatasync, self._flush_fd)
            self._unflushed = 0

    def _name(self, key: str) -> str:
        name, n = fmt.dataset_name(key), 0
        while (name if n == 0 else f"{name}%~{n}") in self.names:
            n += 1
        name = name if n == 0 else f"{name}%~{n}"
        self.names.add(name)
        return name

    def _array(self, name: str, arr: np.ndarray, type_name: str) -> dict[str, Any]:
        """Write a numeric array; returns its file offset (None if compressed/empty), size and CRC32."""
        crc_job = self.pool.submit(crc32, arr) if arr.nbytes >= _CRC_ON_THREAD_BYTES else None
        offset = self._put_array(name, arr, type_name)
        if offset is not None:
            self._written(arr.nbytes)
        crc = crc_job.result() if crc_job is not None else crc32(arr)
        return {"off": offset, "n": int(arr.nbytes), "crc": crc}

    def _text(self, name: str, text: str, type_name: str) -> None:
        """A readable mirror of the value (load reads the spec); HDF5 strings cannot hold NUL, so such text
        is mirrored as its UTF-8 bytes."""
        if "\x00" in text:
            self._put_array(name, np.frombuffer(text.encode("utf-8", "surrogatepass"), np.uint8), type_name)
        else:
            self._put_text(name, text, type_name)

    # --- what a subclass provides -----------------------------------------------------------------
    def _put_array(self, name: str, arr: np.ndarray, type_name: str) -> int | None:
        raise NotImplementedError

    def _put_text(self, name: str, text: str, type_name: str) -> None:
        raise NotImplementedError

    def _put_none(self, name: str) -> None:
        raise NotImplementedError

    def _put_link(self, name: str, target: str) -> None:
        raise NotImplementedError

    def write(self, index: int, leaf: Leaf) -> dict[str, Any]:
        """Write leaf number ``index``; returns its spec entry."""
        self.index = index
        name = self._name(leaf.key)
        spec: dict[str, Any] = {"key": leaf.key, "ds": name}
        kind, value = leaf.kind, leaf.value
        if kind == "tied":
            type_name, target = self._tie_targets[leaf.tied_to]
            spec.update(type=type_name, tied=leaf.tied_to)
            self._put_link(name, target)  # a hard link, as the vendor layout does
        elif kind == "tensor":
            spec.update(type="torch." + fmt.torch_dtype_name(value.dtype), shape=list(value.shape))
            spec.update(self._array(name, tensor_array(value), spec["type"]))
            if type(value) is torch.nn.Parameter:  # flatten() admits only Tensor and Parameter
                spec["param"] = True
            if value.requires_grad:
                spec["rg"] = True
            if value.device.type != "cpu":
                spec["dev"] = str(value.device)
        elif kind in ("ndarray", "npscalar"):
            arr = np.ascontiguousarray(value) if np.ndim(value) else np.asarray(value)  # keeps 0-d
            spec.update(type=kind, shape=list(arr.shape), dtype=arr.dtype.str)
            spec.update(self._array(name, arr, kind))
        elif kind == "none":
            self._put_none(name)
            spec["type"] = "none"
        elif kind == "str" or (kind == "int" and leaf.payload is not None):  # big ints as decimal text
            self._text(name, leaf.payload or value, kind)
            spec.update(type=kind, v=value)
        elif kind in ("bytes", "pickle"):
            raw = leaf.payload if kind == "pickle" else value
            spec.update(type=kind, **self._array(name, np.frombuffer(raw, dtype=np.uint8), kind))
            if kind == "pickle":
                spec["cls"] = f"{type(value).__module__}.{type(value).__qualname__}"
        else:  # int (int64 range), float, bool, complex
            np_type = {"int": np.int64, "float": np.float64, "bool": np.bool_, "complex": np.complex128}[kind]
            self._array(name, np.array(value, dtype=np_type), kind)
            spec["type"] = kind
            if kind != "complex":
                spec["v"] = value
        if index in self.links_to:
            self._tie_targets[index] = (spec["type"], name)
        return spec


def _text_of(leaf: Leaf) -> str | None:
    """The text a leaf is mirrored as in a string dataset, or None."""
    if leaf.kind == "str" or (leaf.kind == "int" and leaf.payload is not None):
        text = leaf.payload or leaf.value
        return None if "\x00" in text else text
    return None


class _EncodedWriter(_LeafWriter):
    """The default writer: contiguous datasets encoded by :mod:`cs_run.checkpoint.h5_encoder`."""

    def __init__(self, fd: int, leaves: list[Leaf]) -> None:
        super().__init__(fd, leaves)
        texts = [t.encode("utf-8", "surrogatepass") for t in map(_text_of, leaves) if t is not None]
        self.encoder = H5Encoder(fd, fmt.ALIGNMENT, texts)
        self._next_text = 0
        self._type_attrs: dict[str, Attr] = {}
        self._datatypes: dict[np.dtype, bytes] = {}

    def _type_attr(self, type_name: str) -> list[Attr]:
        attr = self._type_attrs.get(type_name)
        if attr is None:
            raw = type_name.encode()
            attr = self._type_attrs[type_name] = Attr(fmt.ATTR_TYPE, fixed_string_type(len(raw)), raw)
        return [attr]

    def _datatype(self, dtype: np.dtype) -> bytes:
        if dtype not in self._datatypes:
            self._datatypes[dtype] = datatype_message(dtype)
        return self._datatypes[dtype]

    def _put_array(self, name: str, arr: np.ndarray, type_name: str) -> int | None:
        return self.encoder.dataset(
            _h5_name(name), self._datatype(arr.dtype), arr.shape, arr if arr.size else None, self._type_attr(type_name),
            1 + self.links_to.get(self.index, 0),
        )

    def _put_text(self, name: str, text: str, type_name: str) -> None:
        self.encoder.string_dataset(_h5_name(name), self._next_text, self._type_attr(type_name))
        self._next_text += 1

    def _put_none(self, name: str) -> None:
        self.encoder.dataset(_h5_name(name), self._datatype(np.dtype("i1")), None, attrs=self._type_attr("none"))

    def _put_link(self, name: str, target: str) -> None:
        self.encoder.link(_h5_name(name), _h5_name(target))


def _h5_name(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


class _H5pyWriter(_LeafWriter):
    """Writes through h5py: used for compressed (chunked) checkpoints."""

    def __init__(self, f: Any, compression: str, leaves: list[Leaf]) -> None:
        super().__init__(os.open(f.filename, os.O_RDONLY), leaves)
        self.f = f
        self.compression = compression

    def close(self) -> None:
        super().close()
        os.close(self._flush_fd)

    def _set_type(self, ds: Any, type_name: str) -> None:
        ds.attrs[fmt.ATTR_TYPE] = np.bytes_(type_name.encode())

    def _put_array(self, name: str, arr: np.ndarray, type_name: str) -> int | None:
        if arr.ndim > 0 and arr.size > 0:
            ds = self.f.create_dataset(name, data=arr, compression=self.compression, chunks=True, track_times=False)
        else:
            ds = self.f.create_dataset(name, data=arr, track_times=False)
        self._set_type(ds, type_name)
        return None

    def _put_text(self, name: str, text: str, type_name: str) -> None:
        import h5py

        ds = self.f.create_dataset(name, data=text, dtype=h5py.string_dtype("utf-8"), track_times=False)
        self._set_type(ds, type_name)

    def _put_none(self, name: str) -> None:
        import h5py

        self._set_type(self.f.create_dataset(name, data=h5py.Empty("i1"), track_times=False), "none")

    def _put_link(self, name: str, target: str) -> None:
        self.f[name] = self.f[target]


_to_json = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def _write_leaves(writer: _LeafWriter, leaves: list[Leaf], tree: Any) -> bytes:
    """Write every leaf; returns the structure spec (UTF-8 JSON).

    Each leaf's spec entry becomes JSON as soon as it is written: thousands of small dicts, and the
    chunk list ``json.dumps`` builds over them, took ~4 MiB for 2,000 tensors.
    """
    entries: list[str] = []
    try:
        for index, leaf in enumerate(leaves):
            entries.append(_to_json(writer.write(index, leaf)))
    finally:
        writer.close()
    return "".join(('{"tree":', _to_json(tree), ',"leaves":[', ",".join(entries), "]}")).encode()


def write_file(tmp: str, tree: Any, leaves: list[Leaf], compression: str | None,
               attrs: Mapping[str, str | int] | None = None) -> int:
    """Write the whole checkpoint to ``tmp``: datasets, then spec (and ``attrs``, extra file attributes: a
    shard's identity), fsync, then the completion marker. Returns the spec's CRC32 (``__structure_crc32__``)."""
    extra = dict(attrs or {})
    if compression is not None:
        return _write_with_h5py(tmp, tree, leaves, compression, extra)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        writer = _EncodedWriter(fd, leaves)
        doc = _write_leaves(writer, leaves, tree)
        int64 = datatype_message(np.dtype("<i8"))
        marker = Attr(fmt.ATTR_COMPLETE, int64, struct.pack("<q", 1))
        slot = writer.encoder.finish(
            {fmt.ATTR_FORMAT: fmt.FORMAT_NAME.encode(), fmt.ATTR_STRUCTURE: doc,
             **{k: v.encode() for k, v in extra.items() if isinstance(v, str)}},
            [Attr(fmt.ATTR_VERSION, int64, struct.pack("<q", fmt.FORMAT_VERSION)),
             Attr(fmt.ATTR_STRUCTURE_CRC, int64, struct.pack("<q", zlib.crc32(doc))),
             *(Attr(k, int64, struct.pack("<q", v)) for k, v in extra.items() if not isinstance(v, str))],
            reserve=marker,
        )
        os.fsync(fd)  # all data and the spec are durable before the marker exists
        writer.encoder.write_reserved(slot, marker)
    finally:
        os.close(fd)
    return zlib.crc32(doc)


def _write_with_h5py(tmp: str, tree: Any, leaves: list[Leaf], compression: str, attrs: dict[str, str | int]) -> int:
    import h5py

    with h5py.File(tmp, "x", libver=("v110", "latest")) as f:
        doc = _write_leaves(_H5pyWriter(f, compression, leaves), leaves, tree)
        f.attrs[fmt.ATTR_FORMAT] = fmt.FORMAT_NAME
        f.attrs[fmt.ATTR_VERSION] = fmt.FORMAT_VERSION
        f.attrs[fmt.ATTR_STRUCTURE] = doc.decode()
        f.attrs[fmt.ATTR_STRUCTURE_CRC] = zlib.crc32(doc)
        for key, value in attrs.items():
            f.attrs[key] = value if isinstance(value, str) else np.int64(value)
        f.flush()
        fsync_path(tmp)
        f.attrs[fmt.ATTR_COMPLETE] = 1
    return zlib.crc32(doc)
