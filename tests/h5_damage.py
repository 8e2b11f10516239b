"""Damaging a checkpoint's H5 file the way a bad disk or a torn copy would, for the damaged-input tables."""

from __future__ import annotations

from pathlib import Path

import h5py


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
