"""A decoder LM's checkpoint as the start of a DPO run (``--checkpoint_path sft/checkpoint_20.mdl``).

A DPO model holds ``policy_model.*`` and ``ref_model.*``; a fine-tuned decoder's checkpoint holds the plain
decoder's keys. Both the policy and the reference start from that checkpoint's weights (the vendor's DPO
starts from an SFT model the same way), at step 0 with a fresh optimizer: a model-only start, like a Hugging
Face folder's (:mod:`cs_run.runners._hf_start`). A LoRA run's checkpoint has its adapters folded in first,
with the ``model.lora_params`` of the run that wrote it (its ``params_resolved.yaml`` beside the checkpoint):
the DPO policy is the plain model they describe.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch
import yaml

from cs_run.checkpoint import load
from cs_run.errors import CheckpointError, ParamsError
from cs_run.lora_params import LORA_SUFFIXES, check_lora_params
from cs_run.models.common.lora import apply_lora, folded_state_dict
from cs_run.models.dpo.model import DPOModel

if TYPE_CHECKING:
    from cs_run.runners.base import PyTorchBaseRunner

__all__ = ["is_decoder_start", "decoder_start_state", "dpo_model", "both_roles", "tensor_mismatch"]

logger = logging.getLogger("cs_run.runners")

_ROLES = ("policy_model", "ref_model")


def dpo_model(runner: "PyTorchBaseRunner") -> DPOModel | None:
    """The run's DPO model, or None when the run trains another model."""
    model = getattr(runner.model, "module", runner.model)
    return model if isinstance(model, DPOModel) else None


def both_roles(model: DPOModel, state: dict[str, Any]) -> dict[str, Any]:
    """The DPO model's state of one decoder's ``state``: the same weights under ``policy_model.`` and
    ``ref_model.`` (the reference a copy, not an alias, so training the policy leaves it as it was)."""
    roles = [r for r in _ROLES if getattr(model, r, None) is not None]
    return {f"{role}.{k}": v.detach().clone() for role in roles for k, v in state.items()}


def is_decoder_start(runner: "PyTorchBaseRunner", stored: set[str]) -> bool:
    """The run's model is a DPO model and the checkpoint's model keys ``stored`` are a plain decoder's."""
    model = getattr(runner.model, "module", runner.model)
    return isinstance(model, DPOModel) and bool(stored) and not any(k.startswith(_ROLES) for k in stored)


def _lora_params(head: str, path: Path) -> Any:
    """``model.lora_params`` of the run that wrote ``path`` (its params_resolved.yaml beside it)."""
    params = path.parent / "params_resolved.yaml"
    fix = (f"the LoRA run's params_resolved.yaml, whose model.lora_params fold them, must be beside it (copy it to "
           f"{params}), or export the folded model first with cs-run checkpoint convert {path} DIR --to hf and "
           "start from DIR")
    if not params.is_file():
        raise ParamsError(f"{head}: {path} holds LoRA adapters (lora_A, lora_B); {fix}")
    try:
        raw = yaml.safe_load(params.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ParamsError(f"{head}: {params}: cannot read it ({str(e).splitlines()[0]}); {fix}") from None
    lora = (raw.get("model") or {}).get("lora_params") if isinstance(raw, dict) else None
    if lora is None:
        raise ParamsError(f"{head}: {path} holds LoRA adapters but {params} sets no model.lora_params; {fix}")
    return lora


def _folded(policy: torch.nn.Module, state: dict[str, Any], lora: Any, head: str, path: Path) -> dict[str, Any]:
    """``state``'s adapters folded into its weights, through a copy of the policy with those adapters."""
    adapted = copy.deepcopy(policy)
    apply_lora(adapted, check_lora_params(lora, f"{path.parent / 'params_resolved.yaml'}: model.lora_params"))
    try:
        adapted.load_state_dict(state)
    except RuntimeError as e:
        detail = str(e).splitlines()[-1].strip() if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{head}: {path} is not a LoRA checkpoint of model.policy_model: {detail}") from None
    return folded_state_dict(adapted)


def tensor_mismatch(loaded: dict[str, Any], live: dict[str, Any]) -> Optional[tuple[str, str, str]]:
    """The first key (in sorted order) where ``loaded`` and the model's ``live`` tensors differ in name or shape:
    (key, what ``loaded`` holds, what the model has), in words for an error; None where they match."""
    for key in sorted(set(loaded) | set(live)):
        have, want = loaded.get(key), live.get(key)
        if have is None or want is None or tuple(have.shape) != tuple(want.shape):
            return (key, "nothing" if have is None else f"shape {list(have.shape)}",
                    "has no such tensor" if want is None else str(list(want.shape)))
    return None


def decoder_start_state(runner: "PyTorchBaseRunner", head: str, path: Path) -> dict[str, Any]:
    """``{"model": state}`` of the DPO model from the decoder checkpoint ``path`` (see the module doc): the
    same weights under ``policy_model.`` and ``ref_model.``.

    Raises:
        CheckpointError: the checkpoint is not model.policy_model's (the first key or shape that differs).
        ParamsError: it holds LoRA adapters and no params beside it say how to fold them.
    """
    model: DPOModel = getattr(runner.model, "module", runner.model)
    stored = load(str(path)).get("model")
    if not isinstance(stored, dict):
        raise CheckpointError(f"{head}: {path} holds no model weights (expected a 'model' state dict)")
    state = {k: torch.as_tensor(v) for k, v in stored.items()}
    if any(k.endswith(LORA_SUFFIXES) for k in state):
        state = _folded(model.policy_model, state, _lora_params(head, path), head, path)
    mismatch = tensor_mismatch(state, model.policy_model.state_dict())
    if mismatch is not None:
        key, got, want = mismatch
        raise CheckpointError(f"{head}: {path} is not a checkpoint of model.policy_model: {key}: it holds {got}, "
                              f"the policy {want}; start from a checkpoint of the decoder policy_model describes")
    roles = [r for r in _ROLES if getattr(model, r, None) is not None]
    logger.info("Starting DPO from the decoder checkpoint %s: its weights are the %s's", path, " and the ".join(roles))
    return {"model": both_roles(model, state)}
