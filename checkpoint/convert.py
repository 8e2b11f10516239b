"""Conversion between the H5 format, torch pickle files and safetensors (``cs-run checkpoint convert``)."""

from __future__ import annotations

import os

from cs_run.checkpoint.foreign import FORMATS, format_for_path, save_safetensors, save_torch
from cs_run.checkpoint.h5 import load, save
from cs_run.errors import ParamsError

__all__ = ["convert"]


def convert(src: str, dst: str, to: str | None = None, *, allow_pickle: bool = False) -> str:
    """Convert ``src`` (any readable format) to ``dst`` in format ``to`` (default: from extension)."""
    to = to or format_for_path(dst)
    if to not in FORMATS:
        raise ParamsError(f"invalid target format {to!r}; expected one of {', '.join(FORMATS)}")
    if os.path.abspath(src) == os.path.abspath(dst):
        raise ParamsError(f"source and destination are the same file: '{src}'")
    obj = load(src, allow_pickle=allow_pickle)  # lazy: tensors stream from the mapping while writing
    if to == "h5":
        save(obj, dst, allow_pickle=allow_pickle)
    elif to == "torch":
        save_torch(obj, dst)
    else:
        save_safetensors(obj, dst)
    return to
