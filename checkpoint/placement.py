"""Where loaded tensors go: ``map_location`` (as in ``torch.load``) and the saved parameter flags.

Shared by the H5 reader and the foreign formats (torch files, safetensors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Union

import torch

__all__ = ["MapLocation", "finish_tensor", "stays_on_cpu", "target_device"]

MapLocation = Union[None, str, torch.device, dict, Callable[[torch.Tensor, str], torch.Tensor]]  # noqa: UP007


def target_device(saved: str, map_location: MapLocation) -> torch.device:
    if map_location is None:
        return torch.device("cpu")
    if isinstance(map_location, dict):
        return torch.device(map_location.get(saved, saved))
    return torch.device(map_location)


def finish_tensor(t: torch.Tensor, spec: dict, map_location: MapLocation) -> torch.Tensor:
    saved = spec.get("dev", "cpu")
    if callable(map_location) and not isinstance(map_location, (str, torch.device, dict)):
        t = map_location(t, saved)
    else:
        device = target_device(saved, map_location)
        if device.type != "cpu":
            t = t.to(device)
    if spec.get("param"):
        return torch.nn.Parameter(t, requires_grad=bool(spec.get("rg")))
    return t.requires_grad_(True) if spec.get("rg") else t


def stays_on_cpu(map_location: MapLocation) -> bool:
    """True when loaded tensors are returned as read (so their reads may finish later, in parallel)."""
    return map_location is None or (isinstance(map_location, (str, torch.device)) and torch.device(map_location).type == "cpu")
