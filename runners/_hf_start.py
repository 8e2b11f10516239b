"""A Hugging Face model folder as a run's start checkpoint (``--checkpoint_path tiny_llama/``).

When the folder's ``config.json`` builds the model the params describe (every computed key the same), its
weights are converted in memory, as ``cs-run checkpoint convert --from hf`` would convert them, and the run
starts from them at step 0 with a fresh optimizer, schedule and scaler: a model-only checkpoint. A DPO run's
folder is its ``model.policy_model``'s, and its weights start both the policy and the reference (as the
Model Zoo's dpo converter writes a Hugging Face model's checkpoint, policy_model.* and ref_model.*). Otherwise
the run stops with one line giving the ``convert --from hf`` command, whose params file describes the
folder's model. Nothing is written either way.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cs_run.checkpoint.hf_folder import is_hf_folder, read_config
from cs_run.errors import CheckpointError, ParamsError
from cs_run.parallel import Sharding
from cs_run.registry import hf_converter
from cs_run.runners import _decoder_start

if TYPE_CHECKING:
    from cs_run.runners.base import PyTorchBaseRunner

__all__ = ["is_hf_folder", "convert_command", "check_hf_folder", "hf_start_state"]

logger = logging.getLogger("cs_run.runners")


def convert_command(path: Path) -> str:
    """The command that converts the HF folder ``path`` to a checkpoint and its params file."""
    name = Path(path).absolute().name or "model"
    return f"cs-run checkpoint convert --from hf {path} {name}.mdl"


def check_hf_folder(head: str, path: Path) -> None:
    """Before anything is built: the folder's config.json is readable and names a model cs-run converts.

    Raises:
        CheckpointError: config.json is unreadable (one line naming it).
        ParamsError: its model_type has no converter, naming ``head`` (where the path was given).
    """
    try:
        model_type = read_config(Path(path) / "config.json").get("model_type")
    except CheckpointError as e:
        raise CheckpointError(f"{head}: {e}") from None
    try:
        hf_converter(model_type, f"{head}: {path} is a Hugging Face folder of model_type")
    except ParamsError as e:
        raise ParamsError(f"{e}; it cannot start a run") from None


def hf_start_state(runner: "PyTorchBaseRunner", head: str, path: Path) -> dict[str, Any]:
    """``{"model": state dict}`` of the HF folder ``path`` when it holds the run's model (see the module doc).

    Raises:
        ParamsError: the folder's model is not the params' model, or the run's model is sharded (fsdp),
            naming ``head`` and giving the convert command.
    """
    model = getattr(runner.model, "module", runner.model)
    params = runner.params
    keys = {"name": params.model.name, **params.model.extra}
    dpo = _decoder_start.dpo_model(runner)
    if dpo is not None:  # the folder holds the decoder the policy (and the reference) start from
        model, keys = dpo.policy_model, dict(keys["policy_model"])
    cfg = read_config(Path(path) / "config.json")
    adapter = hf_converter(cfg.get("model_type"), f"{head}: {path}: config.json: model_type").ADAPTER
    command = convert_command(path)
    if runner.strategy.sharding is not Sharding.NONE:
        raise ParamsError(f"{head}: {path} is a Hugging Face folder, which a sharded run ({runner.strategy.sharding}) "
                          f"cannot start from; convert it first: {command}, then --checkpoint_path "
                          f"{Path(command.split()[-1])}")
    differs = adapter.first_difference(model, keys, path) if hasattr(model, "config") else "the model is no decoder LM"
    if differs:
        stem = command.split()[-1].removesuffix(".mdl")
        if dpo is not None:
            raise ParamsError(f"{head}: {path} is a Hugging Face folder of another model than model.policy_model "
                              f"({differs.replace('model.', 'model.policy_model.', 1)}); convert it with {command}, "
                              f"set model.policy_model to {stem}.yaml's model section and run with --checkpoint_path "
                              f"{stem}.mdl")
        raise ParamsError(f"{head}: {path} is a Hugging Face folder of another model than the params' ({differs}); "
                          f"convert it with {command} and run with --params {stem}.yaml --checkpoint_path {stem}.mdl")
    _, hf_model = adapter.read(path)
    state = hf_model.state_dict()
    logger.info("Converted the Hugging Face folder %s in memory (model_type %s, the params' %s): the run "
                "starts from its weights", path, cfg.get("model_type"),
                "model" if dpo is None else "model.policy_model, for the policy and the reference")
    return {"model": state if dpo is None else _decoder_start.both_roles(dpo, state)}
