"""Shared parts of the Hugging Face state-dict adapters (``models/<family>/hf.py``): the q/k row
permutation between HF's rotate-half RoPE and the Model Zoo's interleaved RoPE, and loading a
complete mapped state dict into a model with every parameter accounted for.

An adapter maps HF tensor names to this package's (the Model Zoo's) names; :func:`assign` then copies
them into a built :class:`~cs_run.models.common.lm.DecoderLMModel` (names relative to its ``model``),
refusing a missing, unused or misshapen tensor, so a conversion is complete or fails.
"""

from __future__ import annotations

import torch
from torch import nn

from cs_run.errors import CheckpointError

__all__ = ["interleave_rotary", "deinterleave_rotary", "split_qkv_per_head", "fuse_qkv_per_head", "assign", "Taker"]


def interleave_rotary(w: torch.Tensor, heads: int, rotary_dim: int) -> torch.Tensor:
    """HF rotate-half rows -> Model Zoo interleaved rows: per head, row 2j takes row j and row 2j+1 row
    j + rotary_dim/2 of the rotated part (the first ``rotary_dim`` rows); the rest stay. Works on
    weights [heads*head_dim, in] and biases [heads*head_dim]."""
    shape = w.shape
    t = w.reshape(heads, -1, *shape[1:])
    rot = t[:, :rotary_dim].reshape(heads, 2, rotary_dim // 2, *shape[1:]).transpose(1, 2)
    return torch.cat([rot.reshape(heads, rotary_dim, *shape[1:]), t[:, rotary_dim:]], dim=1).reshape(shape)


def deinterleave_rotary(w: torch.Tensor, heads: int, rotary_dim: int) -> torch.Tensor:
    """The inverse of :func:`interleave_rotary`."""
    shape = w.shape
    t = w.reshape(heads, -1, *shape[1:])
    rot = t[:, :rotary_dim].reshape(heads, rotary_dim // 2, 2, *shape[1:]).transpose(1, 2)
    return torch.cat([rot.reshape(heads, rotary_dim, *shape[1:]), t[:, rotary_dim:]], dim=1).reshape(shape)


def split_qkv_per_head(qkv: torch.Tensor, heads: int) -> list[torch.Tensor]:
    """q, k, v of a fused projection whose rows are grouped per head as [q, k, v] (GPT-NeoX, BLOOM)."""
    parts = qkv.reshape(heads, 3, -1, *qkv.shape[1:])
    return [parts[:, j].reshape(-1, *qkv.shape[1:]) for j in range(3)]


def fuse_qkv_per_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of :func:`split_qkv_per_head`."""
    shaped = [p.reshape(heads, -1, *p.shape[1:]) for p in (q, k, v)]
    return torch.stack(shaped, 1).reshape(-1, *q.shape[1:])


class Taker:
    """HF tensors by name; each may be taken once, and :meth:`check_all_used` names any left over."""

    def __init__(self, tensors: dict[str, torch.Tensor], ignore: tuple[str, ...] = ()) -> None:
        self.tensors = {k: v for k, v in tensors.items() if not k.endswith(ignore)}
        self.used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def __call__(self, key: str) -> torch.Tensor:
        if key not in self.tensors:
            raise CheckpointError(f"Hugging Face weights: missing tensor {key!r}")
        self.used.add(key)
        return self.tensors[key].float()

    def check_all_used(self) -> None:
        left = sorted(set(self.tensors) - self.used)
        if left:
            raise CheckpointError(f"Hugging Face weights: {len(left)} tensor(s) have no place in the model, "
                                  f"e.g. {', '.join(left[:3])}")


def assign(model: nn.Module, mapped: dict[str, torch.Tensor]) -> None:
    """Copy ``mapped`` (full parameter names of ``model``) into it: every trainable parameter must be
    given once (tied ones through any of their names), with its shape."""
    params = dict(model.named_parameters(remove_duplicate=False))
    given: set[int] = set()
    with torch.no_grad():
        for name, value in mapped.items():
            if name not in params:
                raise CheckpointError(f"Hugging Face weights: the model has no parameter {name!r}")
            p = params[name]
            if tuple(p.shape) != tuple(value.shape):
                raise CheckpointError(f"Hugging Face weights: {name!r} has shape {list(value.shape)}, the model "
                                      f"{list(p.shape)}")
            p.copy_(value)
            given.add(id(p))
    missing = [n for n, p in params.items() if p.requires_grad and id(p) not in given]
    if missing:
        raise CheckpointError(f"Hugging Face weights: nothing for {', '.join(missing[:3])}")
