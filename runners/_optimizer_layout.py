"""Optimizer state of checkpoints written before the runner grouped every params file's optimizer as the
Model Zoo's trainer does (weight decay splits the parameters in two groups, ``runners/_build.py``): such a
checkpoint holds one group over the trainable parameters in the model's order. It is read in that form into
this run's live state tensors (:func:`one_group_form`), then handed to the optimizer in its own groups
(:func:`regrouped`), so each parameter's state follows the parameter."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["stored_groups", "is_one_group", "one_group_form", "regrouped"]


def _trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _grouped_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def stored_groups(keys: list[str]) -> int:
    """How many optimizer param groups a checkpoint's keys (``optimizer.param_groups.<i>....``) hold."""
    return len({key.split(".")[2] for key in keys if key.startswith("optimizer.param_groups.")})


def is_one_group(groups: int, optimizer: Any, model: torch.nn.Module) -> bool:
    """A saved optimizer state of ``groups`` param groups is the one-group layout where this run's optimizer
    has several over the same trainable parameters."""
    return (optimizer is not None and groups == 1 and len(optimizer.param_groups) > 1
            and {id(p) for p in _grouped_params(optimizer)} == {id(p) for p in _trainable(model)})


def one_group_form(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> dict[str, Any]:
    """``optimizer.state_dict()`` laid out as one group in the model's order (its state tensors are the live
    ones: a load reads into them in place)."""
    live = optimizer.state_dict()
    position = {id(p): i for i, p in enumerate(_trainable(model))}
    flat = _grouped_params(optimizer)
    group = {k: v for k, v in live["param_groups"][0].items() if k != "params"}
    return {"state": {position[id(flat[i])]: s for i, s in live["state"].items()},
            "param_groups": [{**group, "params": list(range(len(position)))}]}


def regrouped(saved: dict[str, Any], optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> dict[str, Any]:
    """A one-group state dict in ``optimizer``'s groups: each parameter's state, and the saved group's
    settings in every group but its weight decay (the grouping's)."""
    position = {id(p): i for i, p in enumerate(_trainable(model))}
    old = saved["param_groups"][0]
    settings = {k: v for k, v in old.items() if k not in ("params", "weight_decay")}
    state = {}
    for i, p in enumerate(_grouped_params(optimizer)):
        if position[id(p)] in saved["state"]:
            state[i] = saved["state"][position[id(p)]]
    return {"state": state, "param_groups": [{**group, **settings} for group in optimizer.state_dict()["param_groups"]]}
