"""Open and check a checkpoint file, then hand out its leaves (mapped, read, or read into memory).

Every problem with the file becomes a one-line :class:`CheckpointError` naming the file: missing,
directory, empty, not a checkpoint, truncated, corrupted, incomplete, or written by a newer version.
Tensor bytes are taken from the file offsets recorded in the spec (no per-dataset libhdf5 calls),
after every dataset's object header is checked to say the same (:func:`h5_checks.header_extent`); a
file rewritten by another tool falls back to asking libhdf5 for every offset, and then every tensor
is checked against its CRC32 (a damaged layout must not point a tensor at another tensor's bytes).

Integrity: with ``verify`` (the default) every leaf's bytes are checked against the CRC32 recorded
at save before the load returns. The check rides on the read: each 1 MiB piece is checksummed right
after it lands, while still in the CPU cache, on the reader thread that read it; the slices' CRCs
are joined with :func:`crc.crc32_combine`. Lazy (memory-mapped) tensors are checked the same way,
reading through a small buffer, so the mapping is not touched until the caller uses the tensor.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import stat
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import torch

from cs_run.checkpoint import format as fmt
from cs_run.checkpoint import h5_checks
from cs_run.checkpoint.crc import crc32, crc32_combine
from cs_run.checkpoint.spec import check_spec
from cs_run.errors import CheckpointError

__all__ = ["H5Source", "NotACheckpointError", "check_path",
           "has_data", "not_regular", "one_line", "open_h5", "raise_if_damaged", "read_spec", "storage_dtype"]


def one_line(err: BaseException) -> str:
    """The first line of an exception message (h5py messages can span several)."""
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


class NotACheckpointError(CheckpointError):
    """The path names no checkpoint at all: missing, a folder, unreadable, or another kind of file. Unlike
    damage (truncated, corrupted, incomplete), the path itself is what is wrong."""


_NOT_REGULAR = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_regular(path: str) -> str | None:
    """What ``path`` (its symlinks followed) is when it exists but is no regular file or folder, else None:
    opening a FIFO blocks until a writer comes, and a device such as /dev/zero never ends, so neither
    may be opened as a checkpoint."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((what for test, what in _NOT_REGULAR if test(mode)), "not a regular file")


def check_path(path: str) -> str:
    """Refuse a missing path, a folder, anything but a regular file (checked before it is opened) or an
    empty file; return the sniffed format."""
    if not os.path.exists(path):
        raise NotACheckpointError(f"checkpoint '{path}' does not exist")
    if os.path.isdir(path):
        raise NotACheckpointError(f"checkpoint '{path}' is a directory, not a checkpoint file")
    what = not_regular(path)
    if what is not None:
        raise NotACheckpointError(f"checkpoint '{path}' is {what}, not a regular file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError as err:
        raise NotACheckpointError(f"checkpoint '{path}' cannot be read: {one_line(err)}") from err
    if not head:
        raise CheckpointError(f"checkpoint '{path}' is empty (0 bytes); it was never written completely")
    kind = fmt.sniff(head)
    if kind == "unknown":
        import h5py

        if h5py.is_hdf5(path):  # an HDF5 file with a user block
            return "h5"
        raise NotACheckpointError(
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
    """Check marker, version and spec checksum of a cs-run file; return the spec, checked in full
    against the format (:func:`spec.check_spec`)."""
    size = os.path.getsize(path)
    try:
        version = int(h5_checks.attr_value(path, f, fmt.ATTR_VERSION, 8, 0))
        if version > fmt.FORMAT_VERSION:
            raise CheckpointError(
                f"checkpoint '{path}' has format version {version}, newer than this cs-run reads "
                f"(up to {fmt.FORMAT_VERSION}); upgrade cs-run to load it"
            )
        if int(h5_checks.attr_value(path, f, fmt.ATTR_COMPLETE, 8, 0)) != 1:
            raise CheckpointError(
                f"checkpoint '{path}' is incomplete (no completion marker): its save was interrupted"
            )
        doc = h5_checks.attr_value(path, f, fmt.ATTR_STRUCTURE, size)
        doc = doc.decode() if isinstance(doc, bytes) else str(doc)
        if zlib.crc32(doc.encode()) != int(h5_checks.attr_value(path, f, fmt.ATTR_STRUCTURE_CRC, 8, -1)):
            raise CheckpointError(f"checkpoint '{path}' is corrupted: its structure spec fails its checksum")
        parsed = json.loads(doc)
    except CheckpointError:
        raise
    except Exception as err:
        raise CheckpointError(f"checkpoint '{path}' is corrupted: cannot read its spec ({one_line(err)})") from err
    return check_spec(path, parsed, size)


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
_PIECE = 1 << 20  # checksummed in pieces of this size, right after each is read (still in cache)
_POOL: list = []
_SCRATCH = threading.local()  # per reader thread: a buffer to checksum mapped data through


def _read_pool():
    """Two reader threads shared by every load (created on first use)."""
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(max_workers=2, thread_name_prefix="cs_run_ckpt_read"))
    return _POOL[0]


def _scratch() -> memoryview:
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None:
        buf = _SCRATCH.buf = memoryview(bytearray(_PIECE))
    return buf


def has_data(spec: dict) -> bool:
    """True for a leaf whose bytes are stored in its own dataset (not tied, not empty, not cached)."""
    return "n" in spec and "tied" not in spec and spec["n"] > 0


class H5Source:
    """Leaves of one open checkpoint. ``specs`` follow the spec's LEAF format (legacy files too).

    ``verify``: check each leaf's bytes against its recorded CRC32 as they are read; a mismatch is
    raised by :meth:`wait` (large reads) or at once (small ones), naming the keys.
    """

    def __init__(self, path: str, f: Any, specs: list[dict], trust_offsets: bool = True, verify: bool = True,
                 links: dict | None = None) -> None:
        self.path, self.f, self.specs, self.verify = path, f, specs, verify
        self.size = os.path.getsize(path)
        self.links = h5_checks.root_links(f) if links is None else links
        self._mm: mmap.mmap | None = None
        self._fh = None
        self._datasets: dict[str, Any] = {}
        self._pending: list = []  # (spec, futures) of deferred reads not yet waited for
        self._bad: list[str] = []  # keys whose bytes failed their checksum
        if trust_offsets:
            self._check_offsets()
        else:
            self._ask_offsets()

    def wait(self) -> None:
        """Finish every deferred read and check (raising the first error, or naming damaged keys)."""
        pending, self._pending = self._pending, []
        error = None
        for spec, jobs, sizes in pending:
            crcs = []
            for job in jobs:
                try:
                    crcs.append(job.result())
                except BaseException as err:  # noqa: BLE001 - wait for the others before raising
                    error = error or err
            if error is None and sizes is not None:
                crc = crcs[0]
                for part, size in zip(crcs[1:], sizes[1:]):
                    crc = crc32_combine(crc, part, size)
                self._check(spec, crc)
        if error is not None:
            raise error
        bad, self._bad = self._bad, []
        raise_if_damaged(self.path, bad)

    def close(self) -> None:
        for _, jobs, _ in self._pending:  # never close the file under a reader thread
            for job in jobs:
                job.exception()
        self._pending = []
        if self._fh is not None:
            self._fh.close()
        self.f.close()  # the mmap (if any) stays alive as long as tensors use it

    # --- what the file may point at (see h5_checks) -------------------------------------------
    def dataset(self, spec: dict) -> Any:
        """The leaf's h5py dataset, after :func:`h5_checks.open_dataset` found it contained in the file."""
        ds = self._datasets.get(spec["ds"])
        if ds is None:
            ds = h5_checks.open_dataset(self.path, self.f, self.links, spec["ds"], spec["key"], self.size)
            self._datasets[spec["ds"]] = ds
        return ds

    def _check_offsets(self) -> None:
        """Every dataset is a hard link whose object header says its data is where the spec says; a
        header that says anything else is asked of libhdf5 (checked); disagreement means the file was
        rewritten (h5repack, ...) or damaged, and only the checksums can tell which."""
        mm = self._map()
        moved = False
        for s in self.specs:
            addr = self.links.get(s["ds"].encode("utf-8", "surrogatepass"), (None, -1))
            if addr[0] != h5_checks.HARD:
                self.dataset(s)  # raises: missing, soft or external link
            if "tied" in s:
                continue
            extent = h5_checks.header_extent(mm, addr[1], self.size)
            if extent is not None and (extent[1] == 0 or extent[0] + extent[1] <= self.size):
                if s.get("off") is None or extent == (s["off"], s["n"]):
                    continue
            offset = self._hdf5_offset(s)
            moved = moved or (s.get("off") is not None and offset != s["off"])
        if moved:
            self._ask_offsets()
            raise_if_damaged(self.path, self.damaged_keys())

    def _hdf5_offset(self, spec: dict) -> int | None:
        ds = self.dataset(spec)
        return ds.id.get_offset() if ds.chunks is None else None

    def _ask_offsets(self) -> None:
        for s in self.specs:
            if "n" in s and "tied" not in s:
                ds = self.dataset(s)
                contiguous = ds.chunks is None and ds.dtype.isnative and s["n"] > 0
                s["off"] = ds.id.get_offset() if contiguous else None
                if s["off"] is not None and (s["off"] + s["n"] > self.size or h5_checks.dataset_nbytes(ds) != s["n"]):
                    raise CheckpointError(f"checkpoint '{self.path}' is truncated: key '{s['key']}' ends past EOF")

    # --- checksums ------------------------------------------------------------------------------
    def _wants_crc(self, spec: dict) -> bool:
        return self.verify and spec.get("crc") is not None

    def _check(self, spec: dict, crc: int) -> None:
        if crc != spec["crc"]:
            self._bad.append(spec["key"])

    def _defer(self, spec: dict, fn: Any, defer: bool) -> None:
        """Run ``fn(start, stop)`` over the leaf's bytes in slices on the reader threads."""
        n = spec["n"]
        self._fd()  # opened here, not by two reader threads at once
        starts = range(0, n, _SLICE)
        jobs = [_read_pool().submit(fn, i, min(i + _SLICE, n)) for i in starts]
        sizes = [min(_SLICE, n - i) for i in starts] if self._wants_crc(spec) else None
        self._pending.append((spec, jobs, sizes))
        if not defer:
            self.wait()

    def check_mapped(self, spec: dict, defer: bool = True) -> None:
        """Checksum a leaf's stored bytes without touching the mapping (a lazy tensor's)."""
        if not self._wants_crc(spec) or spec["n"] == 0:
            return
        if spec["n"] < _THREADED_READ:
            self._check(spec, self._crc_range(spec, 0, spec["n"]))
            return
        self._defer(spec, lambda a, b: self._crc_range(spec, a, b), defer)

    def _crc_range(self, spec: dict, start: int, stop: int) -> int:
        buf, crc = _scratch(), 0
        for a in range(start, stop, _PIECE):
            piece = buf[: min(_PIECE, stop - a)]
            self._pread_all(spec, piece, a, False)
            crc = crc32(piece, crc)
        return crc

    # --- raw bytes -----------------------------------------------------------------------------
    def _map(self) -> mmap.mmap:
        if self._mm is None:
            with open(self.path, "rb") as fh:
                # Private copy-on-write mapping: tensors are writable like any tensor, and a write
                # never reaches the file.
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        return self._mm

    def _fd(self) -> int:
        if self._fh is None:
            self._fh = open(self.path, "rb", buffering=0)  # noqa: SIM115 - closed in close()
        return self._fh.fileno()

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

        ds = self.dataset(spec)
        mem = np.dtype(spec.get("mem") or mem_dtype or ds.dtype)
        self._hdf5_read(spec, ds, mem, spec.get("shape", [spec["n"] // mem.itemsize]),
                        lambda: ds.id.read(h5s.ALL, h5s.ALL, buf.view(mem).reshape(ds.shape)))
        if self._wants_crc(spec):
            self._check(spec, crc32(buf))

    def read_bytes_into(self, spec: dict, buf: Any, defer: bool = False) -> None:
        """The hot path of resume: ``preadv`` the contiguous data at its offset straight into ``buf``
        (a writable C-contiguous buffer of ``spec['n']`` bytes), checksumming as it lands.

        Reads of 1 MiB and more run as 16 MiB slices on two reader threads (``preadv`` and the CRC
        release the GIL), so copying out of the page cache, first touches of fresh memory and the
        checksum use both cores. With ``defer`` they are left running (the caller goes on to the next
        tensor; :meth:`wait`).
        """
        n = spec["n"]
        if n < _THREADED_READ:
            got = os.preadv(self._fd(), [buf], spec["off"]) if n else 0
            if got < n:  # a short read: finish it (or report the truncation)
                self._pread_all(spec, memoryview(np.frombuffer(buf, np.uint8))[got:], got, False)
            if self.verify and spec.get("crc") is not None and crc32(buf) != spec["crc"]:
                self._bad.append(spec["key"])
            return
        view = memoryview(np.frombuffer(buf, np.uint8))
        want = self._wants_crc(spec)
        self._defer(spec, lambda a, b: self._pread_all(spec, view[a:b], a, want), defer)

    def read_rows_into(self, spec: dict, row: int, rows: int, buf: Any) -> int:
        """Fill ``buf`` (a writable C-contiguous buffer of ``rows`` rows' bytes) with rows ``[row, row +
        rows)`` (dim 0) of a tensor leaf, reading those bytes only; returns their CRC32, which the caller
        joins with the other rows' (:func:`crc.crc32_combine`) to check the leaf's (a sharded load)."""
        shape = spec["shape"]
        row_bytes = spec["n"] // shape[0] if shape and shape[0] else 0
        view = memoryview(np.frombuffer(buf, np.uint8))
        if len(view) != rows * row_bytes or row < 0 or row + rows > (shape[0] if shape else 0):
            raise CheckpointError(f"checkpoint '{self.path}': key '{spec['key']}' has no rows {row}..{row + rows}")
        if not rows or not row_bytes:
            return 0
        if spec.get("off") is not None:
            return self._pread_all(spec, view, row * row_bytes, True)
        # Rewritten by another tool (chunked, filtered), or a vendor file's: HDF5's own read of the slice,
        # straight into ``buf`` as the memory dtype (HDF5 converts a stored byte order other than the host's).
        ds = self.dataset(spec)
        mem = np.dtype(spec.get("mem") or storage_dtype(spec))
        out = np.frombuffer(view, np.uint8).view(mem).reshape(rows, *shape[1:])
        self._hdf5_read(spec, ds, mem, shape, lambda: ds.read_direct(out, np.s_[row:row + rows]))
        return crc32(view)

    def _hdf5_read(self, spec: dict, ds: Any, mem: np.dtype, shape: list, read: Callable[[], Any]) -> Any:
        """``read()``, HDF5's own read of a leaf stored other than as one contiguous run (chunks, filters,
        legacy layouts), after its numeric check; a failure is one error naming the key."""
        h5_checks.check_numeric(self.path, spec["key"], ds, mem, shape)
        try:
            return read()
        except Exception as err:
            raise CheckpointError(
                f"checkpoint '{self.path}': cannot read key '{spec['key']}' ({one_line(err)}); the file is "
                "damaged or uses a compression filter this h5py lacks (try installing hdf5plugin)"
            ) from err

    def _pread_all(self, spec: dict, view: memoryview, start: int, crc: bool) -> int:
        """Fill ``view``, the bytes of ``spec`` from ``start`` on (one read returns at most ~2 GiB);
        with ``crc``, return their CRC32, computed piece by piece as they arrive."""
        fd, offset, pos, value = self._fd(), spec["off"] + start, 0, 0
        step = _PIECE if crc else max(len(view), 1)
        while pos < len(view):
            end = min(pos + step, len(view))
            at = pos
            while at < end:
                got = os.preadv(fd, [view[at:end]], offset + at)
                if not got:
                    raise CheckpointError(f"checkpoint '{self.path}' is truncated inside key '{spec['key']}'")
                at += got
            if crc:
                value = crc32(view[pos:end], value)
            pos = end
        return value

    def damaged_keys(self) -> list[str]:
        """Keys whose stored bytes no longer match the CRC32 recorded at save (reads every tensor)."""
        return [
            s["key"] for s in self.specs
            if "crc" in s and has_data(s) and crc32(self.stored_bytes(s)) != s["crc"]
        ]

    def unverified_keys(self) -> list[str]:
        """Keys with stored bytes but no recorded CRC32 (vendor files): nothing can vouch for them."""
        return [s["key"] for s in self.specs if has_data(s) and s.get("crc") is None]

    def stored_bytes(self, spec: dict) -> Any:
        """A buffer with the leaf's bytes (mapped when possible) for checksums."""
        if spec.get("off") is not None:
            return memoryview(self._map())[spec["off"] : spec["off"] + spec["n"]]
        out = np.empty(spec["n"], dtype=np.uint8)
        verify, self.verify = self.verify, False
        try:
            self.read_into(spec, out)
        finally:
            self.verify = verify
        return out

    # --- leaves --------------------------------------------------------------------------------
    def tensor(self, spec: dict, lazy: bool, defer: bool = False) -> torch.Tensor:
        dtype = fmt.TORCH_DTYPES[spec["type"][len("torch.") :]][0]
        shape = spec["shape"]
        if lazy and spec.get("off") is not None and spec["n"] > 0:
            self.check_mapped(spec, defer)
            flat = torch.frombuffer(self._map(), dtype=dtype, count=_numel(shape), offset=spec["off"])
            return flat.view(shape)
        out = torch.empty(shape, dtype=dtype)
        self.read_into(spec, out.reshape(-1).view(torch.uint8).numpy(), storage_dtype(spec), defer)
        return out

    def ndarray(self, spec: dict, lazy: bool, defer: bool = False) -> np.ndarray:
        dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
        if lazy and spec.get("off") is not None and spec["n"] > 0:
            self.check_mapped(spec, defer)
            return np.frombuffer(self._map(), dtype=dtype, count=_numel(list(shape)), offset=spec["off"]).reshape(shape)
        out = np.empty(shape, dtype=dtype)
        self.read_into(spec, out, dtype, defer)
        return out

    def dataset_value(self, spec: dict) -> Any:
        """A small leaf read through h5py (complex, bytes, pickle, or a scalar without cache); checked
        before it is returned (a pickle is unpickled right after)."""
        kind = spec["type"]
        if kind in ("bytes", "pickle"):
            out = np.empty(spec["n"], dtype=np.uint8)
            self.read_into(spec, out)
            self.wait()
            return out.tobytes()
        if kind == "none":
            return None
        ds = self.dataset(spec)
        if ds.shape != ():
            raise CheckpointError(f"checkpoint '{self.path}' is corrupted: key '{spec['key']}' is a {kind} "
                                  f"stored with shape {ds.shape}")
        value = ds[()]
        if kind in ("str", "int") and isinstance(value, bytes):
            value = value.decode()
        try:
            return {"int": int, "float": float, "bool": bool, "complex": complex, "str": str}[kind](value)
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"checkpoint '{self.path}' is corrupted: key '{spec['key']}' holds "
                                  f"{str(value)[:40]!r}, not a {kind}") from err
