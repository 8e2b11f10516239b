"""CRC32 (zlib's polynomial) for checkpoint data: the fastest implementation installed, and combine.

Why: every load checks every tensor's CRC32 (the format records ``zlib.crc32`` of each tensor's
bytes). The standard library's zlib computes it at ~2.5 GB/s here, which would add ~70 % to a
materialized load; zlib-ng (``pip install cs-run[fast-crc]``) and ISA-L compute the same value with
carry-less multiplication at ~15-20 GB/s. Whichever is installed is used; the values are identical.

``crc32_combine`` joins the CRCs of consecutive pieces (the reader checksums 16 MiB slices of a large
tensor on two threads), using the polynomial arithmetic of zlib's own ``crc32_combine``. :func:`join`
does it for the :class:`Piece` CRCs that several replicas computed of the rows each read of one leaf.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["CRC32_IMPL", "Piece", "crc32", "crc32_combine", "join"]

_POLY = 0xEDB88320  # CRC-32 polynomial, bit-reflected (bit 31 is x^0)
_CHECK = 0xCBF43926  # crc32(b"123456789"), the standard check value


def _pick() -> tuple[Callable[..., int], str]:
    for module, label in (("zlib_ng.zlib_ng", "zlib-ng"), ("isal.isal_zlib", "isal")):
        try:
            fn = importlib.import_module(module).crc32
            if fn(b"123456789") == _CHECK and fn(b"56789", fn(b"1234")) == _CHECK:
                return fn, label
        except Exception:  # noqa: BLE001 - absent or broken: use the next one
            continue
    return zlib.crc32, "zlib"


crc32: Callable[[Any, int], int]
crc32, CRC32_IMPL = _pick()


def _multmodp(a: int, b: int) -> int:
    """a(x) * b(x) modulo the CRC polynomial, both bit-reflected."""
    product, m = 0, 1 << 31
    while a:
        if a & m:
            product ^= b
            a ^= m
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


_X2N = [1 << 30]  # x^(2^k) mod p for k = 0, 1, ...; x^1 is bit 30 when reflected
_SHIFTS: dict[int, int] = {}  # byte length -> x^(8 * length) mod p


def _shift(nbytes: int) -> int:
    """x^(8 * nbytes) mod p: what a CRC is multiplied by when ``nbytes`` follow it."""
    op = _SHIFTS.get(nbytes)
    if op is None:
        op, n, k = 1 << 31, nbytes, 3  # x^0; 8 * nbytes = nbytes * 2^3
        while n:
            while len(_X2N) <= k:
                _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))
            if n & 1:
                op = _multmodp(_X2N[k], op)
            n >>= 1
            k += 1
        if len(_SHIFTS) < 4096:
            _SHIFTS[nbytes] = op
    return op


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC32 of A + B from crc32(A), crc32(B) and len(B)."""
    return _multmodp(_shift(len2), crc1) ^ crc2 if len2 else crc1


@dataclass(frozen=True)
class Piece:
    """The CRC32 of ``nbytes`` bytes from ``start`` of the stored leaf ``leaf`` (``total`` bytes, recorded
    CRC32 ``recorded``) of file ``shard`` (0 for a one-file checkpoint) as one replica read them; the
    replicas' pieces of a leaf, joined (:func:`join`), give its CRC32."""

    shard: int
    leaf: Any  # what names the leaf in its file: its index among a shard's leaves, or its key
    start: int
    nbytes: int
    crc: int
    recorded: Optional[int]
    total: int


def join(pieces: Iterable[Piece]) -> dict[tuple[int, Any], Optional[bool]]:
    """Per ``(shard, leaf)`` of ``pieces``: True when they cover the leaf's bytes end to end and their
    joined CRC32 is the recorded one, False when they cover it and it is not, None when they do not
    cover it (bytes no piece holds: nothing can be said). The same piece twice counts once."""
    by_leaf: dict[tuple[int, Any], set[Piece]] = {}
    for piece in pieces:
        by_leaf.setdefault((piece.shard, piece.leaf), set()).add(piece)
    out: dict[tuple[int, Any], Optional[bool]] = {}
    for leaf, parts in by_leaf.items():
        crc, end = 0, 0
        for part in sorted(parts, key=lambda x: (x.start, x.nbytes)):
            if part.start != end:
                break
            crc, end = crc32_combine(crc, part.crc, part.nbytes) if end else part.crc, end + part.nbytes
        total = next(iter(parts)).total
        out[leaf] = (crc == next(iter(parts)).recorded) if end == total else None
    return out
