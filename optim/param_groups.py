"""Model Zoo's ``configure_param_groups``: optimizer param groups from a model and its optimizer params.

Groups are split three ways, as Model Zoo 2.10 does: by ``tags`` (glob patterns under the optimizer
params' ``params`` key), by weight decay (biases and normalization layers get 0.0) and by muP
learning-rate scale (``adjust_learning_rate``, read by ScalePerParamLR).
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

import torch

__all__ = ["configure_param_groups"]

_NORM_MODULES: tuple[type, ...] = (
    torch.nn.LayerNorm, torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.InstanceNorm1d,
    torch.nn.InstanceNorm2d, torch.nn.InstanceNorm3d, torch.nn.GroupNorm, torch.nn.SyncBatchNorm,
) + ((torch.nn.RMSNorm,) if hasattr(torch.nn, "RMSNorm") else ())

# Model Zoo's default muP groups when the model defines no ``lr_adjustment_groups``
_DEFAULT_LR_GROUPS: dict[str, list[str]] = {
    "embedding": ["*embedding*weight"],
    "decoder_kernel": ["*decoder*dense*weight", "*decoder*linear*weight"],
}

NamedParams = list[tuple[str, torch.nn.Parameter]]


def _patterns(value: Any) -> list[re.Pattern]:
    globs = value if isinstance(value, (list, tuple)) else [value]
    return [re.compile(fnmatch.translate(str(g))) for g in globs]


def _partition_by_tags(named: NamedParams, filters: Any) -> list[dict[str, Any]]:
    filters = [filters] if isinstance(filters, dict) else list(filters or [])
    tags_of: dict[str, list[str]] = {name: [] for name, _ in named}
    for index, entry in enumerate(filters):
        if not isinstance(entry, dict) or "params" not in entry or "tag" not in entry:
            raise ValueError(f"optimizer params[{index}]: expected a mapping with 'params' (glob patterns) and 'tag', "
                             f"got {entry!r}")
        patterns = _patterns(entry["params"])
        matched = [name for name, _ in named if any(p.match(name) for p in patterns)]
        if not matched:
            raise ValueError(f"optimizer params[{index}]: tag {entry['tag']!r} with patterns {entry['params']!r} "
                             "matches no parameter of the model")
        for name in matched:
            tags_of[name].append(entry["tag"])
    groups: dict[frozenset, NamedParams] = {}
    for name, param in named:
        groups.setdefault(frozenset(tags_of[name]), []).append((name, param))
    return [{"params": params, "tags": set(tags)} if tags else {"params": params} for tags, params in groups.items()]


def _decays(model: torch.nn.Module, name: str) -> bool:
    """Model Zoo's rule: no decay for biases and for parameters of normalization layers."""
    if "bias" in name:
        return False
    return not any(module_name in name and isinstance(module, _NORM_MODULES)
                   for module_name, module in model.named_modules())


def _split_weight_decay(model: torch.nn.Module, groups: list[dict[str, Any]], weight_decay: float) -> list[dict]:
    out = []
    for group in groups:
        decayed = {"params": [(n, p) for n, p in group["params"] if _decays(model, n)], "weight_decay": weight_decay}
        plain = {"params": [(n, p) for n, p in group["params"] if not _decays(model, n)], "weight_decay": 0.0}
        for new in (decayed, plain):
            if "tags" in group:
                new["tags"] = group["tags"]
            out.append(new)
    if any("tags" in g for g in out):
        out = [g for g in out if g["params"]]
    return out


def _lr_groups(model: torch.nn.Module, overrides: dict[str, float]) -> list[tuple[float, list[re.Pattern]]]:
    model_groups = getattr(model, "lr_adjustment_groups", None) or _DEFAULT_LR_GROUPS
    unknown = sorted(set(overrides) - set(model_groups))
    if unknown:
        raise ValueError(f"optimizer adjust_learning_rate: {unknown} match no LR adjustment group of the model "
                         f"(it has {sorted(model_groups)})")
    out = []
    for name, group in model_groups.items():
        globs = getattr(group, "param_filters", group)
        default = float(getattr(group, "scale", 1.0))
        out.append((float(overrides.get(name, default)), _patterns(globs) if not callable(globs) else []))
    return out


def _split_lr_scale(groups: list[dict[str, Any]], scales: list[tuple[float, list[re.Pattern]]]) -> list[dict]:
    out = []
    for group in groups:
        by_scale: dict[float, NamedParams] = {}
        for name, param in group["params"]:
            scale = next((s for s, patterns in scales if any(p.match(name) for p in patterns)), 1.0)
            by_scale.setdefault(scale, []).append((name, param))
        if not by_scale:
            by_scale[1.0] = []
        for scale, params in by_scale.items():
            new = {"params": params, "weight_decay": group["weight_decay"], "adjust_learning_rate": scale}
            if "tags" in group:
                new["tags"] = group["tags"]
            out.append(new)
    return out


def configure_param_groups(model: torch.nn.Module, optimizer_params: dict[str, Any]) -> list[dict[str, Any]]:
    """Param groups for ``model`` from a params file's ``optimizer`` block (Model Zoo 2.10's function).

    * ``params``: a list of ``{params: glob or [globs], tag: name}``; the matched parameters' groups carry
      ``tags`` (for schedulers' ``param_group_tags``). A pattern that matches nothing is an error.
    * ``weight_decay`` (or ``weight_decay_rate``): every group is split in a decayed group and one with
      ``weight_decay: 0.0`` for biases and normalization-layer parameters.
    * ``adjust_learning_rate``: muP scales by LR adjustment group name (the model's
      ``lr_adjustment_groups``, or Model Zoo's defaults ``embedding`` / ``decoder_kernel``); every group
      carries ``adjust_learning_rate`` (1.0 if unscaled), which ScalePerParamLR applies.

    Only parameters with ``requires_grad`` are grouped. Returns dicts whose ``params`` are tensors.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = _partition_by_tags(named, optimizer_params.get("params"))
    weight_decay = float(optimizer_params.get("weight_decay", optimizer_params.get("weight_decay_rate", 0.0)))
    groups = _split_weight_decay(model, groups, weight_decay)
    groups = _split_lr_scale(groups, _lr_groups(model, dict(optimizer_params.get("adjust_learning_rate") or {})))
    for group in groups:
        group["params"] = [param for _, param in group["params"]]
    return groups
