"""Damaging a checkpoint's H5 file the way a bad disk or a torn copy would, for the damaged-input tables."""

from __future__ import annotations

from pathlib import Path

import h5py

from cs_run.checkpoint import h5


def flip_a_data_byte(path: Path) -> None:
    """Inverts one byte of the first stored tensor's data in ``path`` (its CRC32 no longer matches; the
    file's structure stays readable, so only the checksum can tell)."""
    offsets = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: offsets.append(obj.id.get_offset())
                     if isinstance(obj, h5py.Dataset) and obj.nbytes and obj.id.get_offset() else None)
    with open(path, "r+b") as fh:
        fh.seek(offsets[0])
        byte = fh.read(1)
        fh.seek(offsets[0])
        fh.write(bytes([byte[0] ^ 0xFF]))


def flip_a_byte_of(path: Path, key: str, at: int) -> None:
    """Inverts the byte ``at`` bytes into the stored data of key ``key`` of a cs-run file (at the offset its
    spec records), e.g. in the rows only one replica of a sharded run reads."""
    _, src = h5.open_source(str(path), verify=False)
    spec = next(s for s in src.specs if s["key"] == key)
    src.close()
    with open(path, "r+b") as fh:
        fh.seek(spec["off"] + at)
        byte = fh.read(1)
        fh.seek(spec["off"] + at)
        fh.write(bytes([byte[0] ^ 0xFF]))
