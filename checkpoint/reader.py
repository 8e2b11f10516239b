"""Open and check a checkpoint file, then hand out its leaves (mapped, read, or read into memory).

Every problem with the file becomes a one-line :class:`CheckpointError` naming the file: missing,
directory, empty, not a checkpoint, truncated, corrupted, incomplete, or written by a newer version.
Tensor bytes are taken from the file offsets recorded in the spec (no per-dataset HDF5 calls), after
a sample of them is checked against HDF5 itself; a file rewritten by another tool falls back to
asking HDF5 for every offset, and then every tensor is checked against its CRC32 (a damaged layout
must not point a tensor at another tensor's bytes).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from cs_run.checkpoint import format as fmt
from cs_run.errors import CheckpointError

__all__ = ["H5Source", "check_path", "one_line", "open_h5", "raise_if_damaged", "read_spec", "storage_dtype"]


def one_line(err: BaseException) -> str:
    """The first line of an exception message (h5py messages can span several)."""
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def check_path(path: str) -> str:
    """Refuse a missing path, a folder or an empty file; return the sniffed format."""
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    if os.path.isdir(path):
        raise CheckpointError(f"checkpoint '{path}' is a directory, not a checkpoint file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError as err:
        raise CheckpointError(f"checkpoint '{path}' cannot be read: {one_line(err)}") from err
    if not head:
        raise CheckpointError(f"checkpoint '{path}' is empty (0 bytes); it was never written completely")
    kind = fmt.sniff(head)
    if kind == "unknown":
        import h5py

        if h5py.is_hdf5(path):  # an HDF5 file with a user block
            return "h5"
        raise CheckpointError(
            f"checkpoint '{path}' is not an HDF5 checkpoint, torch pickle or safetensors file "
            f"(it starts with {head[:8]!r})"
        )
    return kind


def open_h5(path: str) -> Any:
    """Open an HDF5 file read-only, turning HDF5's errors into one line about the file."""
    import h5py

    try:
        return h5py.File(path, "r")
    except OSError as err:
        msg = one_line(err)
        if "truncated" in msg.lower():
            raise CheckpointError(
                f"checkpoint '{path}' is truncated ({os.path.getsize(path)} bytes on disk; {msg}); "
                "it was cut short by a crash or an incomplete copy"
            ) from err
        raise CheckpointError(f"checkpoint '{path}' is corrupted or not a readable HDF5 file ({msg})") from err


def read_spec(path: str, f: Any) -> dict:
    """Check marker, version and spec checksum of a cs-run file; return the parsed spec."""
    try:
        attrs = f.attrs
        version = int(attrs.get(fmt.ATTR_VERSION, 0))
        if version > fmt.FORMAT_VERSION:
            raise CheckpointError(
                f"checkpoint '{path}' has format version {version}, newer than this cs-run reads "
                f"(up to {fmt.FORMAT_VERSION}); upgrade cs-run to load it"
            )
        if int(attrs.get(fmt.ATTR_COMPLETE, 0)) != 1:
            raise CheckpointError(
                f"checkpoint '{path}' is incomplete (no completion marker): its save was interrupted"
            )
        doc = attrs[fmt.ATTR_STRUCTURE]
        doc = doc.decode() if isinstance(doc, bytes) else str(doc)
        if zlib.crc32(doc.encode()) != int(attrs[fmt.ATTR_STRUCTURE_CRC]):
            raise CheckpointError(f"checkpoint '{path}' is corrupted: its structure spec fails its checksum")
        return json.loads(doc)
    except CheckpointError:
        raise
    except Exception as err:
        raise CheckpointError(f"checkpoint '{path}' is corrupted: cannot read its spec ({one_line(err)})") from err


def raise_if_damaged(path: str, bad: list[str]) -> None:
    """The one-line error naming the keys whose bytes fail their CRC32 (nothing if none do)."""
    if bad:
        shown = ", ".join(f"'{k}'" for k in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise CheckpointError(f"checkpoint '{path}' is damaged: checksum mismatch in {shown}")


def storage_dtype(spec: dict) -> np.dtype:
    """The numpy dtype a tensor leaf's bytes are stored as (uint16 for bfloat16, ...)."""
    return fmt.TORCH_DTYPES[spec["type"][len("torch.") :]][1]


def _numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


_THREADED_READ = 1 << 20  # reads of at least this many bytes go to the reader threads
_SLICE = 16 << 20  # in slices of this size
_POOL: list = []


def _read_pool():
    """Two reader threads shared by every load (created on first use)."""
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(max_workers=2, thread_name_prefix="cs_run_ckpt_read"))
    return _POOL[0]


class H5Source:
    """Leaves of one open checkpoint. ``specs`` follow the spec's LEAF format (legacy files too)."""

    def __init__(self, path: str, f: Any, specs: list[dict], trust_offsets: bool = True) -> None:
        self.path, self.f, self.specs = path, f, specs
        self.size = os.path.getsize(path)
        self._mm: mmap.mmap | None = None
        self._fh = None
        self._pending: list = []  # deferred reads (futures) not yet waited for
        if trust_offsets:
            self._check_offsets()
        else:
            self._ask_offsets()

    def wait(self) -> None:
        """Finish every deferred read (raising the first error)."""
        pending, self._pending = self._pending, []
        for job in pending:
            job.result()

    def close(self) -> None:
        for job in self._pending:  # never close the file under a reader thread
            job.exception()
        self._pending = []
        if self._fh is not None:
            self._fh.close()
        self.f.close()  # the mmap (if any) stays alive as long as tensors use it

    def _check_offsets(self) -> None:
        """Bounds-check every recorded offset; compare a sample with what HDF5 says."""
        data = [s for s in self.specs if s.get("off") is not None]
        for s in data:
            if s["off"] < 0 or s["off"] + s["n"] > self.size:
                raise CheckpointError(
                    f"checkpoint '{self.path}' is truncated or corrupted: data of key '{s['key']}' "
                    f"ends past the end of the file ({self.size} bytes)"
                )
        sample = {id(s): s for s in (data[:1] + data[-1:] + sorted(data, key=lambda s: -s["n"])[:1])}
        for s in sample.values():
            if self._hdf5_offset(s) != s["off"]:  # rewritten by another tool (h5repack, ...), or damaged
                self._ask_offsets()
                # HDF5 and the spec disagree; only the checksums can tell moved data from a damaged
                # layout that would point a tensor at another tensor's bytes.
                raise_if_damaged(self.path, self.damaged_keys())
                return

    def _hdf5_offset(self, spec: dict) -> int | None:
        try:
            return self.f[spec["ds"]].id.get_offset()
        except Exception as err:
            raise CheckpointError(
                f"checkpoint '{self.path}' is corrupted: dataset of key '{spec['key']}' is unreadable "
                f"({one_line(err)})"
            ) from err

    def _ask_offsets(self) -> None:
        for s in self.specs:
            if "n" in s and "tied" not in s:
                ds = self.f[s["ds"]]
                contiguous = ds.chunks is None and ds.external is None and ds.dtype.isnative
                s["off"] = ds.id.get_offset() if contiguous else None
                if s["off"] is not None and s["off"] + s["n"] > self.size:
                    raise CheckpointError(f"checkpoint '{self.path}' is truncated: key '{s['key']}' ends past EOF")

    # --- raw bytes -----------------------------------------------------------------------------
    def _map(self) -> mmap.mmap:
        if self._mm is None:
            with open(self.path, "rb") as fh:
                # Private copy-on-write mapping: tensors are writable like any tensor, and a write
                # never reaches the file.
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        return self._mm

    def read_into(self, spec: dict, out: np.ndarray, mem_dtype: np.dtype | None = None, defer: bool = False) -> None:
        """Fill ``out`` (C-contiguous, ``spec['n']`` bytes) with the leaf's bytes as ``mem_dtype``.

        ``defer``: a large contiguous read may still be running on return; :meth:`wait` finishes it.
        """
        if spec["n"] == 0:
            return
        buf = out.reshape(-1).view(np.uint8)
        if spec.get("off") is not None:
            self.read_bytes_into(spec, buf, defer)
            return
        from h5py import h5s

        try:
            ds = self.f[spec["ds"]]
            mem = np.dtype(spec.get("mem") or mem_dtype or ds.dtype)
            ds.id.read(h5s.ALL, h5s.ALL, buf.view(mem).reshape(ds.shape))  # HDF5's own read (chunks, legacy)
        except Exception as err:
            raise CheckpointError(
                f"checkpoint '{self.path}': cannot read key '{spec['key']}' ({one_line(err)}); the file is "
                "damaged or uses a compression filter this h5py lacks (try installing hdf5plugin)"
            ) from err

    def read_bytes_into(self, spec: dict, buf: Any, defer: bool = False) -> None:
        """The hot path of resume: ``preadv`` the contiguous data at its offset straight into ``buf``
        (a writable C-contiguous buffer of ``spec['n']`` bytes).

        Reads of 1 MiB and more run as 16 MiB slices on two reader threads (``preadv`` releases the
        GIL), so copying out of the page cache, and first touches of fresh memory, use both cores.
        With ``defer`` they are left running (the caller goes on to the next tensor; :meth:`wait`).
        """
        if self._fh is None:
            self._fh = open(self.path, "rb", buffering=0)  # noqa: SIM115 - closed in close()
        n = spec["n"]
        if n < _THREADED_READ:
            got = os.preadv(self._fh.fileno(), [buf], spec["off"]) if n else 0
            if got < n:  # a short read: finish it (or report the truncation)
                self._pread_all(spec, memoryview(np.frombuffer(buf, np.uint8))[got:], got)
            return
        view = memoryview(np.frombuffer(buf, np.uint8))
        jobs = [_read_pool().submit(self._pread_all, spec, view[i:i + _SLICE], i) for i in range(0, n, _SLICE)]
        self._pending += jobs
        if not defer:
            self.wait()

    def _pread_all(self, spec: dict, view: memoryview, start: int) -> None:
        """Fill ``view``, the bytes of ``spec`` from ``start`` on (one read returns at most ~2 GiB)."""
        fd, offset, pos = self._fh.fileno(), spec["off"] + start, 0
        while pos < len(view):
            got = os.preadv(fd, [view[pos:]], offset + pos)
            if not got:
                raise CheckpointError(f"checkpoint '{self.path}' is truncated inside key '{spec['key']}'")
            pos += got

    def damaged_keys(self) -> list[str]:
        """Keys whose stored bytes no longer match the CRC32 recorded at save (reads every tensor)."""
        return [
            s["key"] for s in self.specs
            if "crc" in s and "tied" not in s and s["n"] > 0 and zlib.crc32(self.stored_bytes(s)) != s["crc"]
        ]

    def stored_bytes(self, spec: dict) -> Any:
        """A buffer with the leaf's bytes (mapped when possible) for checksums."""
        if spec.get("off") is not None:
            return memoryview(self._map())[spec["off"] : spec["off"] + spec["n"]]
        out = np.empty(spec["n"], dtype=np.uint8)
        self.read_into(spec, out)
        return out

    # --- leaves --------------------------------------------------------------------------------
    def tensor(self, spec: dict, lazy: bool, defer: bool = False) -> torch.Tensor:
        dtype = fmt.TORCH_DTYPES[spec["type"][len("torch.") :]][0]
        shape = spec["shape"]
        if lazy and spec.get("off") is not None and spec["n"] > 0:
            flat = torch.frombuffer(self._map(), dtype=dtype, count=_numel(shape), offset=spec["off"])
            return flat.view(shape)
        out = torch.empty(shape, dtype=dtype)
        self.read_into(spec, out.reshape(-1).view(torch.uint8).numpy(), storage_dtype(spec), defer)
        return out

    def ndarray(self, spec: dict, lazy: bool, defer: bool = False) -> np.ndarray:
        dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
        if lazy and spec.get("off") is not None and spec["n"] > 0:
            return np.frombuffer(self._map(), dtype=dtype, count=_numel(list(shape)), offset=spec["off"]).reshape(shape)
        out = np.empty(shape, dtype=dtype)
        self.read_into(spec, out, dtype, defer)
        return out

    def dataset_value(self, spec: dict) -> Any:
        """A small leaf read through h5py (complex, bytes, pickle, or a scalar without cache)."""
        kind = spec["type"]
        if kind in ("bytes", "pickle"):
            out = np.empty(spec["n"], dtype=np.uint8)
            self.read_into(spec, out)
            return out.tobytes()
        if kind == "none":
            return None
        value = self.f[spec["ds"]][()]
        if kind in ("str", "int") and isinstance(value, bytes):
            value = value.decode()
        return {"int": int, "float": float, "bool": bool, "complex": complex, "str": str}[kind](value)
