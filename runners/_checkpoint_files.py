"""The runner's checkpoint files: names, discovery, pruning; I/O goes through cs_run.checkpoint."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from cs_run import checkpoint
from cs_run.checkpoint import sharded
from cs_run.checkpoint.atomic import aside_of, resolve
from cs_run.checkpoint.hf_folder import is_hf_folder
from cs_run.errors import CheckpointError, CsRunError, ParamsError
from cs_run.params import Params
from cs_run.runners._hf_start import check_hf_folder

__all__ = ["check_start_checkpoint", "given_as", "not_this_models", "stored_step", "stored_states", "checkpoint_path",
           "list_checkpoints", "latest_checkpoint", "load_checkpoint", "prune_checkpoints",
           "nonfinite_keys", "newest_finite_checkpoint"]

logger = logging.getLogger(__name__)
_NAME = re.compile(r"^checkpoint_(\d+)\.mdl$")


def check_start_checkpoint(params: Params, path: Optional[Path]) -> None:
    """The checkpoint a run starts from (``path``: runconfig.checkpoint_path), when one is named, is a
    readable checkpoint file. Called before anything is created or written, so a wrong path costs nothing.

    Each error is one line naming where the path was given (``--resume``, ``--checkpoint_path``, the
    Trainer's ``ckpt_path``, else the params key), the path and what is wrong with it.

    Raises:
        ParamsError: the path names no checkpoint (missing, a folder, unreadable, another kind of file).
        CheckpointError: the checkpoint is damaged (a failed run's exit code, as when it is read).
    """
    if path is None:
        return
    head, where = _given(params, "runconfig.checkpoint_path")
    if is_hf_folder(path):  # converted in memory once the model is built, when it is the params' model
        check_hf_folder(head, path)
        return
    try:
        checkpoint.check_checkpoint_file(path)
    except checkpoint.NotACheckpointError as e:
        fix = "give a checkpoint file, auto (the newest in model_dir) or none" if head == "--resume" else \
            "give a checkpoint file (a model_dir's checkpoint_<step>.mdl)"
        raise ParamsError(f"{head}: {e}; {fix}") from None
    except CheckpointError as e:
        raise CheckpointError(f"{head}: {e}{where}") from None


def given_as(params: Params) -> str:
    """How the user named the start checkpoint: ``--checkpoint_path``, ``--resume``, or the params key."""
    return _given(params, "runconfig.checkpoint_path")[0]


def _given(params: Params, key: str) -> tuple[str, str]:
    """Where the user gave ``key``, for a message's head and tail: a flag or argument (``--resume``, the
    Trainer's ``ckpt_path``; no file line), else the params key and its `` (file:line)``."""
    given = params.given_by.get(key)
    return (given, "") if given else (f"params: {key}", params.where(key))


def not_this_models(params: Params, err: CheckpointError, autoloaded: bool, training: bool = True,
                    every: Optional[Path] = None) -> ParamsError:
    """The one line for a start checkpoint that does not fit the model (``err`` names the file and the
    first key): a wrong ``--resume`` / ``--checkpoint_path`` / ``ckpt_path`` / params key, or a model_dir
    of another model (autoload; ``every``: the checkpoint of eval_all's model_dir that does not fit). A
    config error: nothing was loaded."""
    if autoloaded:
        given = params.given_by.get("runconfig.model_dir")
        head = given or ("params: runconfig.model_dir" if params.source else "model_dir")
        where = "" if given else params.where("runconfig.model_dir")
        if every is not None:
            return ParamsError(f"{head} {params.runconfig.model_dir}: eval_all evaluates every checkpoint in it and "
                               f"{every.name} is not one of this model's: {err}; give the model_dir of a run of this "
                               f"model, or move {every.name} out of it{where}")
        trainer = str(params.given_by.get("runconfig.checkpoint_path", "")).startswith("Trainer.")
        fresh = "checkpoint={'autoload': False}" if trainer else "--resume none (runconfig.autoload_checkpoint: false)"
        fix = f", or start fresh in a new model_dir or with {fresh}" if training else \
            " or a checkpoint of this model (--checkpoint_path)"
        return ParamsError(f"{head} {params.runconfig.model_dir}: its newest checkpoint is not one of this model's: "
                           f"{err}; give the model_dir of a run of this model{fix}{where}")
    head, where = _given(params, "runconfig.checkpoint_path")
    fix = "give a checkpoint this model saved" + (", or start fresh with --resume none" if head == "--resume" else "")
    return ParamsError(f"{head}: {err}: not a checkpoint of this model; {fix}{where}")


def stored_step(path: Path) -> int:
    """The global step a checkpoint was saved at (0 when it records none, as a load reads it; a Hugging
    Face folder records none)."""
    if is_hf_folder(path):
        return 0
    return checkpoint.info(str(path))["global_step"] or 0


def stored_states(path: Path) -> set[str]:
    """The top-level states a checkpoint holds (``model``, ``optimizer``, ``global_step``, ...), from its
    header alone: a model-only checkpoint (a converted Hugging Face model, or its folder) holds ``model`` only."""
    if is_hf_folder(path):
        return {"model"}
    return {k["key"].split(".", 1)[0] for k in checkpoint.info(str(path))["keys"]}


def stored_model_keys(path: Path) -> set[str]:
    """The ``model`` tensor names a checkpoint file or sharded folder holds, from its header alone."""
    return {k["key"][len("model."):] for k in checkpoint.info(str(path))["keys"] if k["key"].startswith("model.")}


def checkpoint_path(model_dir: str | Path, step: int) -> Path:
    return Path(model_dir) / f"checkpoint_{step}.mdl"


def list_checkpoints(model_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``checkpoint_{step}.mdl`` in model_dir, oldest first: files, and the
    committed folders of sharded runs (a folder without its index is no checkpoint). A checkpoint whose
    replacement was stopped between its two renames is listed under its own name: the reads find it under
    its aside name (:func:`cs_run.checkpoint.atomic.resolve`)."""
    folder = Path(model_dir)
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        name = aside_of(p.name) or p.name  # an aside counts under its checkpoint's name when that is empty
        m = _NAME.match(name)
        if m and (p.is_file() or sharded.is_sharded(p)) and (p.name == name or not os.path.lexists(folder / name)):
            found.append((int(m.group(1)), folder / name))
    return sorted(found)


def latest_checkpoint(model_dir: str | Path) -> Optional[Path]:
    found = list_checkpoints(model_dir)
    return found[-1][1] if found else None


def load_checkpoint(path: Path, target: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Load a checkpoint; tensors present in ``target`` are read straight into its tensors."""

    if target is not None:
        return checkpoint.load_into(str(path), target)
    return checkpoint.load(str(path), map_location="cpu")


def prune_checkpoints(model_dir: str | Path, keep: Optional[int]) -> None:
    """Delete all but the newest ``keep`` checkpoints."""
    if keep is None:
        return
    for _, path in list_checkpoints(model_dir)[:-keep]:
        logger.info("Removing old checkpoint %s (max_checkpoints=%d)", path.name, keep)
        sharded.discard(resolve(path))  # a file, or a sharded checkpoint's folder (under its aside name)


def _float_tensors(tree: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(tree, sharded.LocalShard):  # a sharded run's checkpoint form: this replica's rows
        tree = tree.tensor
    if isinstance(tree, torch.Tensor):
        if tree.is_floating_point() or tree.is_complex():
            yield prefix, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _float_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from _float_tensors(value, f"{prefix}.{i}" if prefix else str(i))


def nonfinite_keys(state: Any) -> list[str]:
    """Keys of the floating-point tensors in ``state`` holding a nan or inf (model and optimizer state alike).

    The check is one reduction per device, where the tensors live, and one host read: a checkpoint step
    (which reads the weights anyway) pays it, no other step does.
    """
    found = list(_float_tensors(state))
    if not found:
        return []
    by_device: dict[torch.device, list[int]] = {}
    for i, (_, tensor) in enumerate(found):
        by_device.setdefault(tensor.device, []).append(i)
    bad: list[int] = []
    for indices in by_device.values():
        with torch.no_grad():
            flags = torch.stack([torch.isfinite(found[i][1].detach()).all() for i in indices]).cpu()
        bad += [i for i, ok in zip(indices, flags.tolist()) if not ok]
    return [found[i][0] for i in sorted(bad)]


def newest_finite_checkpoint(model_dir: str | Path) -> Optional[Path]:
    """The newest checkpoint in model_dir that reads back whole with finite weights (error path only)."""

    for _, path in reversed(list_checkpoints(model_dir)):
        try:
            state = load_checkpoint(path)
        except (CsRunError, OSError, ValueError) as e:
            logger.warning("Checkpoint %s cannot be read (%s); looking at an older one", path.name, e)
            continue
        if not nonfinite_keys(state):
            return path
        logger.warning("Checkpoint %s holds non-finite weights; looking at an older one", path.name)
    return None
