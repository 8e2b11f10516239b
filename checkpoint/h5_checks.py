"""What a checkpoint may make HDF5 touch: hard-linked datasets whose bytes lie inside the file itself.

HDF5 can store a dataset's bytes in another file (external storage), assemble it from other files
(virtual datasets), or name another file or path instead of an object (external and soft links). A
crafted checkpoint could use any of these to load a local file into a tensor. Every dataset name the
reader uses goes through :func:`open_dataset` (or, on the hot path, :func:`header_extent`), which
refuses them with a one-line error naming the key, and checks the dataset's size and filters before
HDF5 reads or anyone allocates.
"""

from __future__ import annotations

import contextlib
import math
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from cs_run.errors import CheckpointError

__all__ = ["HARD", "attr_value", "dataset_nbytes", "header_extent", "open_dataset", "root_links"]

HARD = 0  # h5py.h5l.TYPE_HARD
_LINK_KINDS = {1: "a soft link", 64: "an external link (to another file)"}
_ALLOWED_FILTERS = {1: "deflate", 2: "shuffle", 3: "fletcher32", 32000: "lzf",
                    32004: "lz4"}  # lz4: the vendor's default for every tensor (needs hdf5plugin)
_MAX_EXPANSION = 1100  # deflate expands at most 1032:1, lzf less


def _refuse(path: str, key: str, what: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint '{path}': key '{key}' is {what}; cs-run reads only data stored inside the checkpoint "
        "file, so it refuses this file (re-save the checkpoint from a trusted copy)"
    )


@contextlib.contextmanager
def _unreadable(path: str, what: str) -> Iterator[None]:
    """Any error inside but a CheckpointError becomes "``what`` is unreadable" with the first line of its
    message (h5py's span several): a damaged object header or attribute fails deep in HDF5."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as err:
        msg = str(err).strip().splitlines()
        raise CheckpointError(
            f"checkpoint '{path}' is corrupted: {what} is unreadable ({msg[0] if msg else err!r})"
        ) from err


def root_links(f: Any) -> dict[bytes, tuple[int, int]]:
    """name -> (link type, object address for hard links) of every link in the root group, read
    without following any of them."""
    links: dict[bytes, tuple[int, int]] = {}

    def visit(name: bytes, info: Any) -> None:
        links[name] = (info.type, info.u if info.type == HARD else -1)

    f.id.links.iterate(visit, info=True)
    return links


def _link(path: str, links: dict, name: str, key: str) -> bytes:
    raw = name.encode("utf-8", "surrogatepass")
    kind = links.get(raw)
    if kind is None:
        raise CheckpointError(f"checkpoint '{path}' is corrupted: key '{key}' has no dataset '{name}'")
    if kind[0] != HARD:
        raise _refuse(path, key, _LINK_KINDS.get(kind[0], f"a link of type {kind[0]}"))
    return raw


def dataset_nbytes(ds: Any) -> int:
    return math.prod(ds.shape or ()) * ds.dtype.itemsize if ds.shape is not None else 0


def open_dataset(path: str, f: Any, links: dict, name: str, key: str, file_size: int) -> Any:
    """The h5py dataset of a hard link, after checking that every byte HDF5 would read for it lies
    inside this file: not external, not virtual, a contiguous extent inside the file, or chunks with
    known filters whose stored bytes are in the file and could hold the data."""
    import h5py
    from h5py import h5d, h5o

    raw = _link(path, links, name, key)
    with _unreadable(path, f"dataset of key '{key}'"):
        oid = h5o.open(f.id, raw)
        if not isinstance(oid, h5d.DatasetID):
            raise CheckpointError(f"checkpoint '{path}' is corrupted: key '{key}' names a group, not a dataset")
        dcpl = oid.get_create_plist()
        layout = dcpl.get_layout()
        if layout == h5d.VIRTUAL:
            raise _refuse(path, key, "a virtual dataset (its bytes come from other files)")
        if dcpl.get_external_count():
            raise _refuse(path, key, "stored in an external file (HDF5 external storage)")
        ds = h5py.Dataset(oid)
        nbytes = dataset_nbytes(ds)
        stored = oid.get_storage_size()
        if layout == h5d.CONTIGUOUS:
            offset = oid.get_offset()
            if nbytes and (offset is None or offset + nbytes > file_size or stored < nbytes):
                raise CheckpointError(
                    f"checkpoint '{path}' is truncated or corrupted: data of key '{key}' ({nbytes} bytes at "
                    f"offset {offset}) does not lie inside the file ({file_size} bytes)"
                )
        elif layout == h5d.CHUNKED:
            for i in range(dcpl.get_nfilters()):
                code = dcpl.get_filter(i)[0]
                if code not in _ALLOWED_FILTERS:
                    raise _refuse(path, key, f"compressed with HDF5 filter {code}, which cs-run does not read "
                                             f"(it reads {', '.join(_ALLOWED_FILTERS.values())})")
            if stored > file_size or nbytes > stored * _MAX_EXPANSION + (1 << 20):
                raise CheckpointError(
                    f"checkpoint '{path}' is corrupted: key '{key}' claims {nbytes} bytes from {stored} stored "
                    f"bytes in a {file_size}-byte file"
                )
        elif layout != h5d.COMPACT:
            raise _refuse(path, key, f"stored with HDF5 layout {layout}")
        return ds


def attr_value(path: str, obj: Any, name: str, limit: int, default: Any = None) -> Any:
    """An attribute's value, read only after its declared size is checked against ``limit`` bytes (a
    forged dataspace must not make h5py allocate an absurd array)."""
    from h5py import h5a

    raw = name.encode()
    with _unreadable(path, f"attribute {name}"):
        if not h5a.exists(obj.id, raw):
            return default
        attr = h5a.open(obj.id, raw)
        shape = attr.shape or ()
        if math.prod(shape) * attr.dtype.itemsize > limit:
            raise CheckpointError(f"checkpoint '{path}' is corrupted: attribute {name} claims {shape} items")
        return obj.attrs[name]


_PREFIX = struct.Struct("<BBHI I")
_MSG = struct.Struct("<HHB")
_LAYOUT = struct.Struct("<BBQQ")
_NEVER_IN_OURS = (0x07, 0x10)  # external file list, continuation: our writer emits neither


def header_extent(buf: Any, addr: int, file_size: int) -> tuple[int, int] | None:
    """``(offset, size)`` of the contiguous data of the dataset whose version-1 object header is at
    ``addr``, as libhdf5 would find it, or None when the header is anything else (another layout,
    external storage, several blocks, another header version): the caller then asks libhdf5.

    The hot path: a Python walk over one header costs ~2 us, opening the dataset in libhdf5 ~30 us.
    """
    if addr < 0 or addr + 16 > file_size:
        return None
    version, _, count, _, size = _PREFIX.unpack_from(buf, addr)
    pos, stop = addr + 16, addr + 16 + size
    if version != 1 or stop > file_size:
        return None
    found, seen = None, 0
    while pos + 8 <= stop:
        kind, msize, flags = _MSG.unpack_from(buf, pos)
        body, seen = pos + 8, seen + 1
        if body + msize > stop or kind in _NEVER_IN_OURS or flags & 0x02:  # 0x02: shared message
            return None
        if kind == 0x08:
            if found is not None or msize < _LAYOUT.size:
                return None
            lv, cls, offset, nbytes = _LAYOUT.unpack_from(buf, body)
            if lv != 3 or cls != 1:
                return None
            found = (offset, nbytes)
        pos = body + msize
    return found if seen == count and pos == stop else None


def check_numeric(path: str, key: str, ds: Any, want: np.dtype, shape: list) -> None:
    """A dataset HDF5 will read into a buffer of ``shape`` x ``want``: same shape, same item size."""
    if ds.dtype.kind not in "biufc" or ds.dtype.itemsize != want.itemsize or list(ds.shape or ()) != list(shape):
        raise CheckpointError(
            f"checkpoint '{path}' is corrupted or forged: key '{key}' is stored as {ds.dtype}{list(ds.shape or ())} "
            f"but its spec says {want}{list(shape)}"
        )
