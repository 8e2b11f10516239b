"""The reference the LoRA tests fold a checkpoint by: the vendor's rule for a Linear layer's adapter."""

from __future__ import annotations

from pathlib import Path

import torch

from cs_run.checkpoint import load


def folded_by_hand(path: Path, lora: dict) -> dict[str, torch.Tensor]:
    """The LoRA checkpoint's weights with each adapter folded in: W + (B @ A) * alpha / r (``lora``'s r and alpha)."""
    state = load(str(path))["model"]
    out = {k: v for k, v in state.items() if not k.endswith((".lora_A", ".lora_B"))}
    for key in [k for k in state if k.endswith(".lora_A")]:
        stem = key[: -len(".lora_A")]
        out[f"{stem}.weight"] = state[f"{stem}.weight"] + state[f"{stem}.lora_B"] @ state[key] * lora["alpha"] / lora["r"]
    return out
