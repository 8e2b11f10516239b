"""Write one checkpoint file in the format of :mod:`cs_run.checkpoint.format` (no atomicity here).

Tensors stream one at a time: a contiguous CPU tensor is written straight from its own memory (a
numpy view, no copy); only a non-contiguous, conjugated or non-CPU tensor is copied, so extra memory
stays near the largest single tensor. The CRC32 of a large tensor runs on a worker thread while
HDF5 writes the same bytes (zlib releases the GIL).
"""

from __future__ import annotations

import json
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from cs_run.checkpoint import format as fmt
from cs_run.checkpoint.atomic import fsync_path
from cs_run.checkpoint.tree import Leaf

__all__ = ["COMPRESSIONS", "tensor_array", "write_file"]

COMPRESSIONS = (None, "gzip", "lzf")
_CRC_ON_THREAD_BYTES = 1 << 20  # below this, the thread hand-off costs more than it saves
_FLUSH_EVERY_BYTES = 64 << 20  # start write-back of the file every this many bytes


def tensor_array(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous CPU numpy array holding the tensor's bytes in its on-disk storage dtype."""
    _, np_dtype, view = fmt.TORCH_DTYPES[fmt.torch_dtype_name(t.dtype)]
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()  # one copy of this tensor only
    t = t.resolve_conj().resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    if view is not None:
        return t.view(view).numpy().view(np_dtype)
    return t.numpy()


class _Writer:
    """Writes leaves into an open h5py File and returns each leaf's spec entry."""

    def __init__(self, f: Any, compression: str | None) -> None:
        from h5py import h5d, h5p

        self.f = f
        self.compression = compression
        self.names: set[str] = set()
        self.dcpl = h5p.create(h5p.DATASET_CREATE)
        self.dcpl.set_fill_time(h5d.FILL_TIME_NEVER)  # every byte is written by us; skip the fill pass
        self.dcpl.set_obj_track_times(False)  # no timestamps: ~10 us less per dataset, reproducible files
        self.pool = ThreadPoolExecutor(max_workers=1)
        # Early write-back: flush what is written so far on a thread while the next tensors are written,
        # so the fsync that makes the file durable finds little left to do.
        self._flusher = ThreadPoolExecutor(max_workers=1)
        self._flush_fd = os.open(f.filename, os.O_RDONLY)
        self._flush_job: Any = None
        self._unflushed = 0
        from h5py import h5s, h5t

        self._h5t, self._scalar = h5t, h5s.create(h5s.SCALAR)
        self._types: dict[str, tuple] = {}
        self._dtypes: dict[np.dtype, Any] = {}

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self._flusher.shutdown(wait=True)
        os.close(self._flush_fd)

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

    def _set_type(self, dsid: Any, type_name: str) -> None:
        from h5py import h5a

        if type_name not in self._types:  # HDF5 type objects are reused: thousands of small tensors
            data = np.array(type_name.encode(), dtype=f"S{max(1, len(type_name))}")
            self._types[type_name] = (data, self._h5t.py_create(data.dtype))
        data, h5type = self._types[type_name]
        h5a.create(dsid, fmt.ATTR_TYPE.encode(), h5type, self._scalar).write(data)

    def _file_type(self, dtype: np.dtype) -> Any:
        if dtype not in self._dtypes:
            self._dtypes[dtype] = self._h5t.py_create(dtype)
        return self._dtypes[dtype]

    def _array(self, name: str, arr: np.ndarray, type_name: str) -> dict[str, Any]:
        """Write a numeric array; returns its file offset (None if compressed/empty), size and CRC32."""
        from h5py import h5d, h5s

        crc_job = self.pool.submit(zlib.crc32, arr) if arr.nbytes >= _CRC_ON_THREAD_BYTES else None
        offset = None
        if self.compression is not None and arr.ndim > 0 and arr.size > 0:
            dsid = self.f.create_dataset(name, data=arr, compression=self.compression, chunks=True).id
        else:
            space = self._scalar if arr.ndim == 0 else h5s.create_simple(arr.shape)
            dsid = h5d.create(self.f.id, name.encode(), self._file_type(arr.dtype), space, dcpl=self.dcpl)
            if arr.size > 0:
                dsid.write(h5s.ALL, h5s.ALL, arr)
                offset = dsid.get_offset()
                self._written(arr.nbytes)
        crc = crc_job.result() if crc_job is not None else zlib.crc32(arr)
        self._set_type(dsid, type_name)
        return {"off": offset, "n": int(arr.nbytes), "crc": crc}

    def _text(self, name: str, text: str, type_name: str) -> None:
        """A readable mirror of the value (load reads the spec); HDF5 strings cannot hold NUL, so such text
        is mirrored as its UTF-8 bytes."""
        import h5py

        if "\x00" in text:
            ds = self.f.create_dataset(name, data=np.frombuffer(text.encode("utf-8", "surrogatepass"), np.uint8))
        else:
            ds = self.f.create_dataset(name, data=text, dtype=h5py.string_dtype("utf-8"))
        self._set_type(ds.id, type_name)

    def write(self, leaf: Leaf, specs: list[dict]) -> dict[str, Any]:
        name = self._name(leaf.key)
        spec: dict[str, Any] = {"key": leaf.key, "ds": name}
        kind, value = leaf.kind, leaf.value
        if kind == "tied":
            spec.update(type=specs[leaf.tied_to]["type"], tied=leaf.tied_to)
            self.f[name] = self.f[specs[leaf.tied_to]["ds"]]  # hard link, as the vendor layout does
        elif kind == "tensor":
            spec.update(type="torch." + fmt.torch_dtype_name(value.dtype), shape=list(value.shape))
            spec.update(self._array(name, tensor_array(value), spec["type"]))
            if isinstance(value, torch.nn.Parameter):
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
            self._none(name)
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
        return spec

    def _none(self, name: str) -> None:
        import h5py

        ds = self.f.create_dataset(name, data=h5py.Empty("i1"))
        self._set_type(ds.id, "none")


def write_file(tmp: str, tree: Any, leaves: list[Leaf], compression: str | None) -> None:
    """Write the whole checkpoint to ``tmp``: datasets, then spec, fsync, then the completion marker."""
    import h5py

    with h5py.File(
        tmp, "x", libver=("v110", "latest"), alignment_threshold=1, alignment_interval=fmt.ALIGNMENT
    ) as f:
        writer = _Writer(f, compression)
        try:
            specs: list[dict] = []
            for leaf in leaves:
                specs.append(writer.write(leaf, specs))
        finally:
            writer.close()
        doc = json.dumps({"tree": tree, "leaves": specs}, separators=(",", ":"))
        f.attrs[fmt.ATTR_FORMAT] = fmt.FORMAT_NAME
        f.attrs[fmt.ATTR_VERSION] = fmt.FORMAT_VERSION
        f.attrs[fmt.ATTR_STRUCTURE] = doc
        f.attrs[fmt.ATTR_STRUCTURE_CRC] = zlib.crc32(doc.encode())
        f.flush()
        fsync_path(tmp)  # all data and the spec are durable before the marker exists
        f.attrs[fmt.ATTR_COMPLETE] = 1
