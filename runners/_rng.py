"""Capture and restore every RNG a training run draws from, as checkpointable tensors and arrays."""

from __future__ import annotations

import contextlib
import random
from typing import Any, Optional

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state", "preserved_rng"]


def capture_rng_state(generator: Optional[torch.Generator] = None) -> dict[str, Any]:
    """torch CPU / CUDA, numpy and random states; plus ``generator``'s (a DataLoader's) when given.

    Python's and numpy's states are stored as integer arrays so no checkpoint format needs pickle.
    """
    version, mt, gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": np.asarray(np_keys, dtype=np.uint32), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "cached_gaussian": float(np_gauss)},
        "random": {"version": int(version), "state": np.asarray(mt, dtype=np.int64),
                   "gauss": gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


def restore_rng_state(state: dict[str, Any], generator: Optional[torch.Generator] = None) -> None:
    """Inverse of :func:`capture_rng_state`."""
    torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8).cpu())
    n = state["numpy"]
    np.random.set_state(("MT19937", np.asarray(n["keys"], dtype=np.uint32), int(n["pos"]),
                         int(n["has_gauss"]), float(n["cached_gaussian"])))
    r = state["random"]
    random.setstate((int(r["version"]), tuple(int(x) for x in np.asarray(r["state"])), r["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(torch.as_tensor(state["cuda"]).cpu()))
    if generator is not None and "generator" in state:
        generator.set_state(torch.as_tensor(state["generator"], dtype=torch.uint8).cpu())


@contextlib.contextmanager
def preserved_rng(generator: Optional[torch.Generator] = None):
    """Run a block (a nested eval) without shifting the training run's random streams."""
    state = capture_rng_state(generator)
    try:
        yield
    finally:
        restore_rng_state(state, generator)
