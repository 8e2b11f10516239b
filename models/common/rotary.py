"""Rotary position embeddings (RoPE) as the Model Zoo computes them (RotaryPositionEmbeddingHelper).

The Model Zoo rotates *interleaved* pairs (dims 2i and 2i+1, GPT-J's ``rotate_every_two``), not the
two halves of a head as Hugging Face's Llama does; its checkpoint converters permute the q/k
projection rows to match, and so do the ``hf.py`` adapters here. Only the first ``rotary_dim`` dims
of each head rotate (partial rotary, GPT-J/NeoX); inverse frequencies are ``theta^(-2i/rotary_dim)``.

``pos_scaling_type`` (with ``pos_scaling_factor`` and ``pos_scaling_extra_args``):
``linear`` (position interpolation: positions / factor), ``yarn``, ``llama3`` (Llama 3.1's
frequency-band rescaling) and ``longrope``, each as the Model Zoo defines it.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from cs_run.errors import DataError

__all__ = ["RotaryEmbedding", "PositionedRotary", "rotate_every_two", "SCALING_TYPES", "check_scaling"]

SCALING_TYPES = ("linear", "yarn", "llama3", "longrope")
_EXTRA_ARGS = {
    "linear": (),
    "yarn": ("original_max_position_embeddings", "extrapolation_factor", "beta_fast", "beta_slow", "mscale_a",
             "mscale_b", "truncate"),
    "llama3": ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "longrope": ("original_max_position_embeddings", "long_factor", "short_factor", "long_mscale", "short_mscale",
                 "attention_factor"),
}


def check_scaling(scaling_type: str, extra_args: Optional[dict]) -> str:
    """The lower-cased scaling type. Raises ValueError naming the key for unknown types or arguments."""
    kind = scaling_type.lower()
    if kind not in SCALING_TYPES:
        raise ValueError(f"pos_scaling_type: {scaling_type!r} is not one of {', '.join(SCALING_TYPES)}")
    for arg in extra_args or {}:
        if arg not in _EXTRA_ARGS[kind]:
            raise ValueError(f"pos_scaling_extra_args.{arg}: not an argument of {kind} scaling "
                             f"({', '.join(_EXTRA_ARGS[kind]) or 'it takes none'})")
    if kind in ("yarn", "longrope") and "original_max_position_embeddings" not in (extra_args or {}):
        raise ValueError(f"pos_scaling_extra_args.original_max_position_embeddings: {kind} scaling needs it")
    return kind


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def _llama3_inv_freq(inv_freq: torch.Tensor, factor: float, low_freq_factor: float = 1.0,
                     high_freq_factor: float = 4.0, original_max_position_embeddings: int = 8192) -> torch.Tensor:
    low_wavelen = original_max_position_embeddings / low_freq_factor
    high_wavelen = original_max_position_embeddings / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mid = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return torch.where(wavelen < high_wavelen, inv_freq, torch.where(wavelen > low_wavelen, inv_freq / factor, mid))


def _yarn(inv_freq: torch.Tensor, pair: torch.Tensor, rotary_dim: int, theta: float, factor: float,
          args: dict) -> tuple[torch.Tensor, float]:
    original = args["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(args.get("beta_fast", 32)), correction_dim(args.get("beta_slow", 1))
    if args.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((pair - low) / (high - low)).clamp(0, 1)
    mask = (1 - ramp) * args.get("extrapolation_factor", 1.0)
    inv = inv_freq / factor * (1 - mask) + inv_freq * mask
    mscale = 1.0 if factor <= 1 else args.get("mscale_a", 0.1) * math.log(factor) + args.get("mscale_b", 1.0)
    return inv, mscale


class RotaryEmbedding:
    """sin/cos tables of one model's RoPE; not a module (it has no parameters, as in the Model Zoo)."""

    def __init__(self, rotary_dim: int, max_position_embeddings: int, theta: float = 10000.0,
                 scaling_type: str = "linear", scaling_factor: float = 1.0,
                 scaling_extra_args: Optional[dict] = None) -> None:
        self.rotary_dim = rotary_dim
        self.max_position_embeddings = max_position_embeddings
        self.theta = float(theta)
        self.scaling_type = check_scaling(scaling_type, scaling_extra_args)
        self.scaling_factor = float(scaling_factor)
        self.extra = dict(scaling_extra_args or {})

    def sin_cos(self, seq_len: int, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """[seq_len, head_dim] tables; dims past rotary_dim get sin 0, cos 1 (left as they are)."""
        return self._tables(torch.arange(seq_len, device=device, dtype=torch.float32), head_dim, device)

    def _tables(self, t: torch.Tensor, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables at positions ``t`` (float32, any shape): [*t.shape, head_dim]."""
        pair = (torch.arange(head_dim, device=device) // 2).to(torch.float32)
        inv_freq = torch.exp(pair * (-math.log(self.theta) * 2 / self.rotary_dim))
        mscale = 1.0
        if self.scaling_type == "linear":
            t = t / self.scaling_factor
        elif self.scaling_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, self.scaling_factor, **self.extra)
        elif self.scaling_type == "yarn":
            inv_freq, mscale = _yarn(inv_freq, pair, self.rotary_dim, self.theta, self.scaling_factor, self.extra)
        else:
            inv_freq, mscale = self._longrope(pair, head_dim, device)
        angles = t[..., None] * inv_freq
        sin, cos = torch.sin(angles) * mscale, torch.cos(angles) * mscale
        if head_dim != self.rotary_dim:
            keep = torch.arange(head_dim, device=device) < self.rotary_dim
            sin, cos = torch.where(keep, sin, 0.0), torch.where(keep, cos, 1.0)
        return sin, cos

    def _longrope(self, pair: torch.Tensor, head_dim: int, device) -> tuple[torch.Tensor, float]:
        original = self.extra["original_max_position_embeddings"]
        factor = self.max_position_embeddings / original
        long = self.max_position_embeddings > original
        which = "long" if long else "short"
        if f"{which}_factor" not in self.extra:
            raise ValueError(f"pos_scaling_extra_args.{which}_factor: longrope with max_position_embeddings "
                             f"{'>' if long else '<='} original_max_position_embeddings needs it")
        factors = [v for v in self.extra[f"{which}_factor"] for _ in (0, 1)]
        factors += [0.0] * (head_dim - self.rotary_dim)
        ext = torch.tensor(factors, dtype=torch.float32, device=device)
        mscale = self.extra.get(f"{which}_mscale")
        if mscale is None:
            mscale = self.extra.get("attention_factor")
        if mscale is None:
            mscale = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        return 1.0 / (ext * self.theta ** (2 * pair / self.rotary_dim)), mscale

    def at(self, positions: torch.Tensor, head_dim: int) -> "PositionedRotary":
        """This RoPE at each sequence's own ``positions`` [batch, seq] (incremental decoding, left padding)."""
        sin, cos = self._tables(positions.to(torch.float32), head_dim, positions.device)
        return PositionedRotary(sin[:, :, None, :], cos[:, :, None, :])

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` of shape [batch, seq, heads, head_dim]."""
        seq_len, head_dim = x.shape[1], x.shape[-1]
        if seq_len > self.max_position_embeddings:
            raise DataError(f"the batch's sequence length {seq_len} exceeds model.max_position_embeddings "
                            f"({self.max_position_embeddings}); raise it, or write shorter sequences (the input's "
                            "max_sequence_length, plus any tokens its data_transforms add)")
        sin, cos = self.sin_cos(seq_len, head_dim, x.device)
        sin, cos = sin[None, :, None, :], cos[None, :, None, :]
        return (x * cos.to(x.dtype) + rotate_every_two(x) * sin.to(x.dtype)).to(x.dtype)


class PositionedRotary:
    """:meth:`RotaryEmbedding.rotate` with tables already taken at given positions ([batch, seq, 1, head_dim])."""

    def __init__(self, sin: torch.Tensor, cos: torch.Tensor) -> None:
        self.sin, self.cos = sin, cos

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.cos.to(x.dtype) + rotate_every_two(x) * self.sin.to(x.dtype)).to(x.dtype)
