"""Writes the HDF5 subset a checkpoint needs straight to a file descriptor, without libhdf5.

Why: libhdf5 costs ~30 us to create a dataset, ~27 us to write it and ~15 us per attribute on this
machine (C calls measured through ctypes), so 2,000 small tensors took 0.17 s in HDF5 alone, 4x
safetensors' whole save. Encoding the same structures here costs a few microseconds per dataset and
writes tensor bytes straight from the tensor's memory (``os.writev``, no copy).

What is written (HDF5 File Format Specification 3.0; the structures libhdf5 itself writes with
``libver="earliest"``, so every HDF5 reader since 1.8 opens the file):

* superblock version 0 (no checksums) at offset 0;
* one root group stored as a symbol table: a version-1 B-tree of group nodes whose single node points
  at symbol-table nodes (SNOD) of up to ``2 * leaf_k`` entries, names in a local heap. The K values are
  chosen per file so one B-tree level holds every entry; lookups stay O(log n);
* datasets with version-1 object headers: dataspace, datatype, fill value, contiguous layout and
  their attributes; hard links are extra symbol entries pointing at the same object header;
* variable-length UTF-8 strings (string datasets and the large file attributes) in global heap
  collections, so no object header message ever nears its 64 KiB size limit.

h5py/libhdf5 remain the reader; the tests open every written file with h5py and compare.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = ["Attr", "H5Encoder", "datatype_message", "fixed_string_type", "VLEN_UTF8"]

UNDEF = 0xFFFFFFFFFFFFFFFF  # HDF5's "undefined address"
_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_SUPERBLOCK_SIZE = 96
_ENTRY_SIZE = 40  # symbol table entry with 8-byte offsets
_LEAF_K = 64  # up to 128 links per symbol-table node (5 KiB)
_MAX_K = 32767  # the largest K libhdf5 accepts for a B-tree
_GCOL_MIN = 4096  # libhdf5's minimum global heap collection size
_GCOL_MAX_OBJECTS = 65535  # object indices are 16-bit
_ZEROS = bytes(4096)
_QUEUE_BYTES = 1 << 20  # write queued buffers once this much is queued (a copy of a non-contiguous
# tensor waits in the queue, so this bounds the extra memory held)

# Message type ids
_NIL, _DATASPACE, _DATATYPE, _FILL, _LAYOUT, _ATTRIBUTE, _SYMBOL_TABLE = 0x0, 0x1, 0x3, 0x5, 0x8, 0xC, 0x11
_CONSTANT = 0x01  # message flag: the message never changes

# Fill value message v2: allocation time late, fill never written, default fill (size 0): what libhdf5
# writes for a contiguous dataset created with H5D_FILL_TIME_NEVER.
_FILL_BODY = bytes([2, 2, 1, 1, 0, 0, 0, 0])

# Variable-length UTF-8 string of 8-bit characters, 16 bytes in the file (length + global heap id).
VLEN_UTF8 = bytes.fromhex("1901010010000000" "100000000100000000000800")


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _message(kind: int, body: bytes, flags: int = 0) -> bytes:
    """One version-1 object header message: type, padded size, flags, then the body padded to 8."""
    size = _pad8(len(body))
    return struct.pack("<HHB3x", kind, size, flags) + body + _ZEROS[: size - len(body)]


def datatype_message(dtype: np.dtype) -> bytes:
    """The datatype message body libhdf5 writes for a numpy dtype (taken from libhdf5 itself)."""
    from h5py import h5t

    return h5t.py_create(np.dtype(dtype)).encode()[2:]  # H5Tencode: 2-byte header, then the message


def fixed_string_type(length: int) -> bytes:
    """Fixed-length, null-padded ASCII string datatype of ``length`` bytes."""
    return struct.pack("<BBBBI", 0x13, 0x01, 0, 0, length)


_SCALAR_SPACE = bytes([2, 0, 0, 0])  # dataspace v2, scalar
_FILL_MESSAGE = _message(_FILL, _FILL_BODY, _CONSTANT)
_LAYOUT_MESSAGE = struct.Struct("<HHB3xBBQQ6x")  # message header, then layout v3 body padded to 24


class _Prefix:
    """Object header prefix and dataspace message (v2) for one rank (-1: null space), packed in one call."""

    def __init__(self, rank: int) -> None:
        self.rank = max(rank, 0)
        self.space_type = 2 if rank < 0 else (0 if rank == 0 else 1)  # null, scalar, simple
        body = 4 + 8 * self.rank
        self.space_size = _pad8(body)
        self.struct = struct.Struct(f"<BBHII4xHHB3xBBBB{self.rank}Q{self.space_size - body}x")
        self.size = self.struct.size

    def pack(self, n_msgs: int, refcount: int, messages_len: int, dims: Sequence[int]) -> bytes:
        return self.struct.pack(
            1, 0, n_msgs, refcount, messages_len,  # object header v1 prefix
            _DATASPACE, self.space_size, 0,  # message header
            2, self.rank, 0, self.space_type, *dims,  # dataspace v2
        )


class Attr:
    """A pre-encoded attribute message (name, datatype, scalar dataspace, raw value bytes)."""

    __slots__ = ("message",)

    def __init__(self, name: str, datatype: bytes, value: bytes) -> None:
        raw = name.encode() + b"\0"
        body = b"".join((
            struct.pack("<BxHHH", 1, len(raw), len(datatype), len(_SCALAR_SPACE)),
            raw, _ZEROS[: _pad8(len(raw)) - len(raw)],
            datatype, _ZEROS[: _pad8(len(datatype)) - len(datatype)],
            _SCALAR_SPACE, _ZEROS[: _pad8(len(_SCALAR_SPACE)) - len(_SCALAR_SPACE)],
            value,
        ))
        self.message = _message(_ATTRIBUTE, body)


def _object_header(messages: Iterable[bytes], refcount: int) -> bytes:
    """Version-1 object header: 16-byte prefix, then messages (each already padded to 8 bytes)."""
    messages = list(messages)
    size = sum(len(m) for m in messages)
    return struct.pack("<BBHII4x", 1, 0, len(messages), refcount, size) + b"".join(messages)


def _global_heaps(objects: Sequence[bytes], start: int) -> tuple[list[bytes], list[tuple[int, int]]]:
    """Global heap collections ("GCOL") holding ``objects``, laid out from file offset ``start``.

    Returns the pieces to write, in order, and each object's (collection address, index).
    """
    pieces: list[bytes] = []
    ids: list[tuple[int, int]] = []
    addr = start
    for first in range(0, len(objects), _GCOL_MAX_OBJECTS):
        body: list[bytes] = []
        for index, data in enumerate(objects[first:first + _GCOL_MAX_OBJECTS], 1):
            body += [struct.pack("<HH4xQ", index, 0, len(data)), data, _ZEROS[: _pad8(len(data)) - len(data)]]
            ids.append((addr, index))
        used = 16 + sum(map(len, body))
        size = max(_GCOL_MIN, _pad8(used))
        free = size - used
        pieces.append(b"GCOL" + struct.pack("<B3xQ", 1, size))
        pieces += body
        if free >= 16:  # the free-space object (index 0); its size counts its own header
            pieces += [struct.pack("<HH4xQ", 0, 0, free), bytes(free - 16)]
        elif free:
            pieces.append(bytes(free))
        addr += size
    return pieces, ids


def _heap_id(length: int, where: tuple[int, int]) -> bytes:
    """The 16 bytes a variable-length string value holds in the file: length, collection, index."""
    return struct.pack("<IQI", length, *where)


class H5Encoder:
    """Streams a one-group HDF5 file to an open, empty file descriptor.

    Call :meth:`dataset` / :meth:`link` for every entry, then :meth:`finish`. Data is written as it
    comes; the group index, heaps and root object header go at the end and the superblock last.
    """

    def __init__(self, fd: int, alignment: int = 64, texts: Sequence[bytes] = ()) -> None:
        self.fd = fd
        self.alignment = alignment
        self.pos = 0
        self._iov: list[Any] = []
        self._iov_len: list[int] = []
        self._iov_bytes = 0
        self._headers: dict[bytes, int] = {}  # link name -> object header address
        self._middles: dict[tuple, bytes] = {}
        self._prefixes: dict[int, _Prefix] = {}
        self._queue(_ZEROS[:_SUPERBLOCK_SIZE], _SUPERBLOCK_SIZE)  # rewritten by finish()
        # Variable-length strings of datasets come first, so their heap ids are known when written.
        pieces, self._text_ids = _global_heaps(texts, self.pos)
        for piece in pieces:
            self._queue(piece, len(piece))
        self._text_lengths = [len(t) for t in texts]

    # --- low-level output ----------------------------------------------------------------------
    def _queue(self, buf: Any, n: int) -> None:
        """Queue ``n`` bytes (``buf``: bytes or a C-contiguous array) to be written in file order."""
        self._iov.append(buf)
        self._iov_len.append(n)
        self._iov_bytes += n
        self.pos += n
        if len(self._iov) >= 512 or self._iov_bytes >= _QUEUE_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write everything queued (``writev`` of the queued buffers, resumed after a short write)."""
        iov, lengths = self._iov, self._iov_len
        self._iov, self._iov_len, self._iov_bytes = [], [], 0
        start = 0
        while start < len(iov):
            done = os.writev(self.fd, iov[start:start + 1024])
            while start < len(iov) and done >= lengths[start]:
                done -= lengths[start]
                start += 1
            if done:  # a buffer was cut short: continue from the middle of it
                iov[start] = np.frombuffer(iov[start], np.uint8)[done:]
                lengths[start] -= done

    # --- entries --------------------------------------------------------------------------------
    def dataset(
        self,
        name: bytes,
        datatype: bytes,
        shape: Sequence[int] | None,
        data: Any = None,
        attrs: Sequence[Attr] = (),
        refcount: int = 1,
    ) -> int | None:
        """Write a contiguous dataset; returns the file offset of its data (None when it has none).

        ``data`` is a C-contiguous buffer of exactly the dataset's bytes (a numpy array is written
        from its own memory); ``shape`` None makes an empty (null) dataset, ``()`` a scalar.
        """
        nbytes = 0 if data is None else (data.nbytes if hasattr(data, "nbytes") else len(data))
        # Per dataset only the dataspace and the layout change: the datatype, fill value and attribute
        # messages are encoded once per (datatype, attributes) and reused (thousands of small tensors).
        key = (datatype, *attrs)
        middle = self._middles.get(key)
        if middle is None:
            middle = self._middles[key] = b"".join(
                [_message(_DATATYPE, datatype, _CONSTANT), _FILL_MESSAGE, *(a.message for a in attrs)]
            )
        rank = -1 if shape is None else len(shape)
        prefix = self._prefixes.get(rank)
        if prefix is None:
            prefix = self._prefixes[rank] = _Prefix(rank)
        lead = _ZEROS[: -self.pos % 8]
        header_addr = self.pos + len(lead)
        messages_len = prefix.size - 16 + len(middle) + _LAYOUT_MESSAGE.size
        header_end = header_addr + 16 + messages_len
        data_addr = _align(header_end, self.alignment) if nbytes else UNDEF
        dims = () if shape is None else shape
        block = b"".join((
            lead,
            prefix.pack(4 + len(attrs), refcount, messages_len, dims),
            middle,
            _LAYOUT_MESSAGE.pack(_LAYOUT, 24, 0, 3, 1, data_addr, nbytes),  # layout v3, contiguous
            _ZEROS[: data_addr - header_end] if nbytes else b"",
        ))
        self._queue(block, len(block))
        self._add_link(name, header_addr)
        if not nbytes:
            return None
        self._queue(data, nbytes)
        return data_addr

    def string_dataset(self, name: bytes, text_index: int, attrs: Sequence[Attr] = ()) -> None:
        """A scalar variable-length UTF-8 string dataset holding ``texts[text_index]``."""
        value = _heap_id(self._text_lengths[text_index], self._text_ids[text_index])
        self.dataset(name, VLEN_UTF8, (), value, attrs)

    def link(self, name: bytes, target: bytes) -> None:
        """A hard link: another name for an existing dataset (its refcount was given at creation)."""
        self._add_link(name, self._headers[target])

    def _add_link(self, name: bytes, header_addr: int) -> None:
        if name in self._headers or not name or b"/" in name or b"\0" in name:
            raise ValueError(f"invalid or duplicate HDF5 link name {name!r}")
        self._headers[name] = header_addr

    # --- the end of the file ---------------------------------------------------------------------
    def finish(self, string_attrs: dict[str, bytes], attrs: Sequence[Attr], reserve: Attr | None = None) -> int | None:
        """Write the group index, the root group's object header and the superblock.

        ``string_attrs`` become variable-length UTF-8 file attributes (any size), ``attrs`` fixed
        ones. ``reserve`` sizes a NIL message in the root header that :meth:`write_reserved` can later
        turn into that attribute in place (the completion marker); its file offset is returned.
        """
        lead = _ZEROS[: -self.pos % 8]
        self._queue(lead, len(lead))
        pieces, ids = _global_heaps(list(string_attrs.values()), self.pos)
        for piece in pieces:
            self._queue(piece, len(piece))
        root_attrs = [
            Attr(key, VLEN_UTF8, _heap_id(len(value), where))
            for (key, value), where in zip(string_attrs.items(), ids)
        ] + list(attrs)
        btree_addr, heap_addr, internal_k = self._write_group_index()
        messages = [_message(_SYMBOL_TABLE, struct.pack("<QQ", btree_addr, heap_addr))]
        messages += [a.message for a in root_attrs]
        reserved_at = None
        if reserve is not None:
            messages.append(_message(_NIL, bytes(len(reserve.message) - 8)))
        root_addr = self.pos
        header = _object_header(messages, 1)
        if reserve is not None:
            reserved_at = root_addr + len(header) - len(reserve.message)
        self._queue(header, len(header))
        self.flush()
        eof = self.pos
        superblock = b"".join((
            _SIGNATURE,
            struct.pack("<BBBBBBBB", 0, 0, 0, 0, 0, 8, 8, 0),
            struct.pack("<HHI", _LEAF_K, internal_k, 0),  # group node sizes, consistency flags
            struct.pack("<QQQQ", 0, UNDEF, eof, UNDEF),
            struct.pack("<QQI4xQQ", 0, root_addr, 1, btree_addr, heap_addr),  # root symbol table entry
        ))
        assert len(superblock) == _SUPERBLOCK_SIZE
        os.pwrite(self.fd, superblock, 0)
        return reserved_at

    def write_reserved(self, offset: int, attr: Attr) -> None:
        """Replace the NIL message reserved by :meth:`finish` with ``attr`` (same size)."""
        os.pwrite(self.fd, attr.message, offset)

    def _write_group_index(self) -> tuple[int, int, int]:
        """Local heap of names, symbol-table nodes and one B-tree node over them.

        Returns the B-tree and heap addresses and the B-tree's K (half its capacity).
        """
        links = sorted(self._headers.items())  # libhdf5 orders names with strcmp: byte order
        n_nodes = -(-len(links) // (2 * _LEAF_K))
        internal_k = max(16, -(-n_nodes // 2))  # 16: libhdf5's default
        if internal_k > _MAX_K:
            raise ValueError(f"too many entries for one HDF5 group: {len(links)}")
        # Local heap: offset 0 is the empty name (the root's own), then each name, NUL-terminated, padded.
        names, name_offsets, offset = [_ZEROS[:8]], [], 8
        for name, _ in links:
            size = _pad8(len(name) + 1)
            names.append(name + _ZEROS[: size - len(name)])
            name_offsets.append(offset)
            offset += size
        heap_addr = self.pos
        heap = b"".join([b"HEAP", struct.pack("<B3xQQQ", 0, offset, 1, heap_addr + 32), *names])  # free list: none (1)
        self._queue(heap, len(heap))
        # Symbol-table nodes, each of fixed size 8 + 2K entries.
        node_size = 8 + 2 * _LEAF_K * _ENTRY_SIZE
        node_addrs, keys = [], [0]
        for first in range(0, len(links), 2 * _LEAF_K):
            group = range(first, min(first + 2 * _LEAF_K, len(links)))
            node_addrs.append(self.pos)
            entries = b"".join(struct.pack("<QQI4x16x", name_offsets[i], links[i][1], 0) for i in group)
            node = b"SNOD" + struct.pack("<BxH", 1, len(group)) + entries
            self._queue(node + bytes(node_size - len(node)), node_size)
            keys.append(name_offsets[group[-1]])  # the largest name in the node to the key's left
        btree_addr = self.pos
        body = [struct.pack("<Q", keys[0])]
        for child, key in zip(node_addrs, keys[1:]):
            body.append(struct.pack("<QQ", child, key))
        node = b"TREE" + struct.pack("<BBHQQ", 0, 0, len(node_addrs), UNDEF, UNDEF) + b"".join(body)
        node_size = 24 + (2 * internal_k + 1) * 8 + 2 * internal_k * 8
        self._queue(node + bytes(node_size - len(node)), node_size)
        return btree_addr, heap_addr, internal_k
