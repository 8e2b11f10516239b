"""Conversion between the H5 format, torch files, safetensors (when installed), the vendor's format 0.5
(``--to vendor``, see :mod:`cs_run.checkpoint.vendor_format`) and sharded checkpoint folders (from one:
each tensor whole; ``--to sharded``: N shards, see :mod:`cs_run.checkpoint.sharded`): ``cs-run checkpoint
convert``.

The foreign formats' readers and writers are in :mod:`cs_run.checkpoint.foreign`.
"""

from __future__ import annotations

import os

from cs_run.checkpoint import sharded, vendor_format
from cs_run.checkpoint.files import load
from cs_run.checkpoint.foreign import FORMATS, format_for_path, save_safetensors, save_torch
from cs_run.checkpoint.h5 import save
from cs_run.errors import ParamsError

__all__ = ["convert"]


def convert(src: str, dst: str, to: str | None = None, *, allow_pickle: bool = False, verify: bool = True,
            shards: int | None = None) -> str:
    """Convert ``src`` (any readable format, or a sharded folder) to ``dst`` in format ``to`` (default: from
    extension; ``sharded``: a folder of ``shards`` shards).

    ``verify`` (default): every tensor of an H5 source is checked against its CRC32 first, so a
    damaged tensor is never copied under a fresh, valid checksum. A failed write leaves nothing at ``dst``.
    """
    to = to or format_for_path(dst)
    if to not in (*FORMATS, "sharded"):
        raise ParamsError(f"invalid target format {to!r}; expected one of {', '.join(FORMATS)}, sharded")
    if (to == "sharded") != (shards is not None):
        raise ParamsError("--to sharded needs --shards N (the number of replicas it is for); --shards goes with "
                          "--to sharded only")
    if os.path.abspath(src) == os.path.abspath(dst):
        raise ParamsError(f"source and destination are the same file: '{src}'")
    if os.path.isdir(dst) and to != "sharded":
        raise ParamsError(f"destination '{dst}' is a directory; give a file name")
    obj = load(src, allow_pickle=allow_pickle, verify=verify)  # lazy: tensors stream from the mapping while writing
    if to == "h5":
        save(obj, dst, allow_pickle=allow_pickle)
    elif to == "sharded":
        sharded.save_unsharded_as(obj, dst, shards)
    elif to == "torch":
        save_torch(obj, dst)
    elif to == "vendor":  # the vendor's format 0.5, read by its cstorch.load
        vendor_format.save(obj, dst)
    else:
        save_safetensors(obj, dst)
    return to
