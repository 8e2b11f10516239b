"""The process's mixed-precision settings (``cstorch.amp.set_half_dtype`` & co., the vendor's 2.x API).

Model code asks here which floating point type to build in: :func:`get_floating_point_dtype` is the half
type when mixed precision is on, else float32. ``cbfloat16`` (a CSX-only format) is bfloat16 here.
"""

from __future__ import annotations

from typing import Union

import torch

from cs_run.errors import ParamsError

__all__ = ["enable_mixed_precision", "get_floating_point_dtype", "get_floating_point_dtype_str", "get_half_dtype",
           "get_half_dtype_str", "mixed_precision", "set_half_dtype"]

_TYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "cbfloat16": torch.bfloat16}
_state = {"half": "float16", "enabled": False}


def set_half_dtype(value: Union[str, torch.dtype]) -> torch.dtype:
    """Set the 16-bit type ("float16", "bfloat16", "cbfloat16" or a torch dtype); turns mixed precision on."""
    if value == torch.float16:
        name = "float16"
    elif value == torch.bfloat16:
        name = "bfloat16"
    elif isinstance(value, str) and value in _TYPES:
        name = value
    else:
        raise ParamsError(f"Invalid half dtype: {value}. Accepted values are: \"float16\", \"bfloat16\", "
                          f"\"cbfloat16\", {torch.float16}, {torch.bfloat16}.")
    _state.update(half=name, enabled=True)
    return _TYPES[name]


def get_half_dtype() -> torch.dtype:
    """The 16-bit type set by :func:`set_half_dtype` (float16 by default)."""
    return _TYPES[_state["half"]]


def get_half_dtype_str() -> str:
    return str(_state["half"])


def mixed_precision() -> bool:
    """Whether mixed precision is on."""
    return bool(_state["enabled"])


def enable_mixed_precision(enable: bool = True) -> bool:
    if not isinstance(enable, bool):
        raise ParamsError(f"Expected a boolean value, got: {type(enable)}")
    _state["enabled"] = enable
    return enable


def get_floating_point_dtype(default: torch.dtype = torch.float32) -> torch.dtype:
    """The half type when mixed precision is on, else ``default``."""
    return get_half_dtype() if mixed_precision() else default


def get_floating_point_dtype_str(default: str = "float32") -> str:
    return get_half_dtype_str() if mixed_precision() else default
