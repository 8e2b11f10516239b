"""The Model Zoo's GPT ``data_transforms``: functions of a collated batch, run after the collate.

Model Zoo 2.10 ``data/nlp/gpt/data_transforms.py`` defines ``add_sink_tokens``, ``add_memory_tokens`` and
``add_pose_shift``; the first (attention sinks, the params files of sliding-window models use it) is
implemented here with the Model Zoo's meaning and defaults, the other two are refused by name.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.utils.data import default_collate

__all__ = ["add_sink_tokens", "build_collate"]


def add_sink_tokens(batch: dict[str, torch.Tensor], sink_token_id: int = 0, num_sink_tokens: int = 1,
                    sink_token_start_pos: int = 0, truncate_to_original_length: bool = False) -> dict[str, torch.Tensor]:
    """Insert ``num_sink_tokens`` tokens ``sink_token_id`` at ``sink_token_start_pos`` of every sample
    (StreamingLLM's attention sinks): into input_ids and labels, and as zeros into attention_mask, the
    loss mask, so the sinks add no loss. ``truncate_to_original_length`` cuts the result back to the
    batch's sequence length."""
    seq_len = batch["input_ids"].shape[1]
    if sink_token_start_pos > seq_len:
        raise ValueError(f"data_transforms: sink_token_start_pos {sink_token_start_pos} is past the sequence length "
                         f"{seq_len}")
    out = dict(batch)
    for key, fill in (("input_ids", sink_token_id), ("labels", sink_token_id), ("attention_mask", 0)):
        values = batch[key]
        prefix = torch.full((values.shape[0], num_sink_tokens), fill, dtype=values.dtype)
        joined = torch.cat((values[:, :sink_token_start_pos], prefix, values[:, sink_token_start_pos:]), dim=-1)
        out[key] = joined[:, :seq_len] if truncate_to_original_length else joined
    return out


_TRANSFORMS: dict[str, tuple[Callable, dict[str, tuple[type, Any]]]] = {
    "add_sink_tokens": (add_sink_tokens, {"sink_token_id": (int, 0), "num_sink_tokens": (int, 1),
                                          "sink_token_start_pos": (int, 0), "truncate_to_original_length": (bool, False)}),
}
_REFUSED = {
    "add_memory_tokens": "memory tokens (Activation Beacon) need the model's memory-token support",
    "add_pose_shift": "PoSE position shifting needs position_ids in the model's inputs",
}
_MINIMA = {"sink_token_id": 0, "num_sink_tokens": 1, "sink_token_start_pos": 0}


def _checked(index: int, entry: Any) -> tuple[Callable, dict[str, Any]]:
    where = f"data_transforms[{index}]"
    if not isinstance(entry, dict) or "name" not in entry:
        raise ValueError(f"{where}: expected a mapping with 'name' (e.g. add_sink_tokens), got {entry!r}")
    name = entry["name"]
    if name in _REFUSED:
        raise ValueError(f"{where}.name: {name!r} is not supported here ({_REFUSED[name]})")
    if name not in _TRANSFORMS:
        raise ValueError(f"{where}.name: unknown transform {name!r}; the Model Zoo's are "
                         f"{', '.join([*_TRANSFORMS, *_REFUSED])}")
    fn, schema = _TRANSFORMS[name]
    kwargs = {}
    for key, value in entry.items():
        if key in ("name", "use_vsl"):
            continue
        if key not in schema:
            raise ValueError(f"{where}.{key}: unknown key of {name}; it takes {', '.join(schema)}")
        kind, _ = schema[key]
        if isinstance(value, bool) is not (kind is bool) or not isinstance(value, kind) \
                or (key in _MINIMA and value < _MINIMA[key]):
            raise ValueError(f"{where}.{key}: expected {'a boolean' if kind is bool else 'an integer'}"
                             f"{f' >= {_MINIMA[key]}' if key in _MINIMA else ''}, got {value!r}")
        kwargs[key] = value
    return fn, kwargs


def build_collate(data_transforms: Optional[list]) -> Callable:
    """torch's default collate followed by ``data_transforms`` in order (the Model Zoo's
    ``wrap_collate_fn``); checked here, so a bad entry fails before the first batch."""
    if data_transforms is None:
        return default_collate
    if not isinstance(data_transforms, list) or not data_transforms:
        raise ValueError(f"data_transforms: expected a non-empty list of transforms, got {data_transforms!r}")
    return _Collate([_checked(i, entry) for i, entry in enumerate(data_transforms)])


class _Collate:
    """A picklable collate (DataLoader workers may be spawned) running the checked transforms."""

    def __init__(self, steps: list[tuple[Callable, dict[str, Any]]]) -> None:
        self.steps = steps

    def __call__(self, samples: list) -> Any:
        batch = default_collate(samples)
        for fn, kwargs in self.steps:
            batch = fn(batch, **kwargs)
        return batch
