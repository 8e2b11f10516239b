"""The runner's checkpoint files: names, discovery, pruning; I/O goes through cs_run.checkpoint."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Optional

__all__ = ["checkpoint_path", "list_checkpoints", "latest_checkpoint", "save_checkpoint", "load_checkpoint",
           "prune_checkpoints"]

logger = logging.getLogger(__name__)
_NAME = re.compile(r"^checkpoint_(\d+)\.mdl$")


def checkpoint_path(model_dir: str | Path, step: int) -> Path:
    return Path(model_dir) / f"checkpoint_{step}.mdl"


def list_checkpoints(model_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``checkpoint_{step}.mdl`` in model_dir, oldest first."""
    folder = Path(model_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name)) and p.is_file()]
    return sorted(found)


def latest_checkpoint(model_dir: str | Path) -> Optional[Path]:
    found = list_checkpoints(model_dir)
    return found[-1][1] if found else None


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Atomic write (temporary file, fsync, rename) in the H5 format of cs_run.checkpoint."""
    from cs_run import checkpoint

    checkpoint.save(state, str(path))


def load_checkpoint(path: Path, target: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Load a checkpoint; tensors present in ``target`` are read straight into its tensors."""
    from cs_run import checkpoint

    if target is not None:
        return checkpoint.load_into(str(path), target)
    return checkpoint.load(str(path), map_location="cpu")


def prune_checkpoints(model_dir: str | Path, keep: Optional[int]) -> None:
    """Delete all but the newest ``keep`` checkpoints."""
    if keep is None:
        return
    for _, path in list_checkpoints(model_dir)[:-keep]:
        logger.info("Removing old checkpoint %s (max_checkpoints=%d)", path.name, keep)
        path.unlink(missing_ok=True)
