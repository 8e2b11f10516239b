"""Model Zoo's ``configure_param_groups``: optimizer param groups from a model and its optimizer params.

Groups are split three ways, as Model Zoo 2.10 does (``common/optim_utils.py``): by ``tags`` (glob
patterns under the optimizer params' ``params`` key), by weight decay (biases and normalization layers
get 0.0) and by muP learning-rate scale (``adjust_learning_rate``, applied by ScalePerParamLR).
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

import torch

__all__ = ["configure_param_groups", "lr_adjustment_scales", "register_norm_class"]

_NORM_MODULES: list[type] = [
    torch.nn.LayerNorm, torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.InstanceNorm1d,
    torch.nn.InstanceNorm2d, torch.nn.InstanceNorm3d, torch.nn.GroupNorm, torch.nn.SyncBatchNorm,
] + ([torch.nn.RMSNorm] if hasattr(torch.nn, "RMSNorm") else [])


def register_norm_class(cls: type) -> type:
    """Count ``cls``'s parameters as a normalization layer's (no weight decay), as the Model Zoo counts its own
    RMSNorm; the models' shared layers register theirs (this layer cannot import them)."""
    if cls not in _NORM_MODULES:
        _NORM_MODULES.append(cls)
    return cls

# Model Zoo's default muP groups when the model defines no ``lr_adjustment_groups`` (optim_utils.py)
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
            raise ValueError(f"optimizer.params[{index}]: expected a mapping with 'params' (glob patterns) and 'tag', "
                             f"got {entry!r}")
        patterns = _patterns(entry["params"])
        matched = [name for name, _ in named if any(p.match(name) for p in patterns)]
        if not matched:
            raise ValueError(f"optimizer.params[{index}]: tag {entry['tag']!r} with patterns {entry['params']!r} "
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
    return not any(module_name in name and isinstance(module, tuple(_NORM_MODULES))
                   for module_name, module in model.named_modules())


def _split_weight_decay(model: torch.nn.Module, groups: list[dict[str, Any]], weight_decay: float) -> list[dict]:
    """Every group in two, decayed then not (the Model Zoo keeps an empty half unless tags are used;
    torch accepts it)."""
    out = []
    for group in groups:
        decayed = {"params": [(n, p) for n, p in group["params"] if _decays(model, n)], "weight_decay": weight_decay}
        plain = {"params": [(n, p) for n, p in group["params"] if not _decays(model, n)], "weight_decay": 0.0}
        for new in (decayed, plain):
            if "tags" in group:
                new["tags"] = group["tags"]
            out.append(new)
    return out


def _group_filters(group: Any) -> tuple[Any, float]:
    """(glob patterns, scale) of one of a model's ``lr_adjustment_groups`` entries: an object with
    ``param_filter_patterns`` and ``scale`` (the Model Zoo's LRAdjustmentGroup), such a mapping, a
    ``(globs, scale)`` pair (models/common/mup.py's decoder groups), or globs."""
    if isinstance(group, tuple) and len(group) == 2 and isinstance(group[1], (int, float)):
        return group[0], float(group[1])
    if isinstance(group, dict):
        return group.get("param_filter_patterns", group.get("params")), float(group.get("scale", 1.0))
    if hasattr(group, "param_filter_patterns"):
        return group.param_filter_patterns, float(getattr(group, "scale", 1.0) or 1.0)
    return group, 1.0


def lr_adjustment_scales(model: torch.nn.Module, overrides: dict[str, Any]) -> list[tuple[float, list[re.Pattern]]]:
    """The Model Zoo's ``process_lr_adjustment_params``: the scales other than 1.0, in the order of the
    model's groups, groups of one scale merged, each with its glob patterns (matched whole-name).

    ``overrides`` (the optimizer's ``adjust_learning_rate``) sets a group's scale by name.

    Raises:
        ValueError: an override names no group of the model, or is not a number.
    """
    model_groups = getattr(model, "lr_adjustment_groups", None) or _DEFAULT_LR_GROUPS
    for name, value in overrides.items():
        if name not in model_groups:
            raise ValueError(f"optimizer.adjust_learning_rate.{name}: the model has no LR adjustment group {name!r} "
                             f"(it has {', '.join(sorted(model_groups))})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"optimizer.adjust_learning_rate.{name}: expected a number (the group's learning-rate "
                             f"factor), got {value!r}")
    scales: list[tuple[float, list[re.Pattern]]] = []
    for name, group in model_groups.items():
        globs, scale = _group_filters(group)
        scale = float(overrides.get(name, scale))
        if scale == 1.0:
            continue
        existing = next((entry for entry in scales if entry[0] == scale), None)
        if existing is not None:
            existing[1].extend(_patterns(globs))
        else:
            scales.append((scale, _patterns(globs)))
    return scales


def _split_lr_scale(model: torch.nn.Module, groups: list[dict[str, Any]],
                    scales: list[tuple[float, list[re.Pattern]]]) -> list[dict]:
    """The Model Zoo's ``_partition_params_groups_with_adjusted_lr``: every group split by scale, in the
    order of ``scales`` with the unscaled (1.0) part last, empty parts dropped.

    As in the Model Zoo, a parameter belongs to a scale when the name of a model parameter its patterns
    match is a substring of the parameter's name, and a parameter of several scales is in each.
    """
    if not scales:
        return groups
    layers = [[n for n, _ in model.named_parameters() if any(p.fullmatch(n) for p in patterns)]
              for _, patterns in scales]
    out = []
    for group in groups:
        parts = [{"params": [], "weight_decay": group["weight_decay"], "adjust_learning_rate": scale}
                 for scale in [s for s, _ in scales] + [1.0]]
        for name, param in group["params"]:
            hits = [i for i, names in enumerate(layers) if any(layer in name for layer in names)]
            for i in hits or [len(scales)]:
                parts[i]["params"].append((name, param))
        for part in parts:
            if "tags" in group:
                part["tags"] = group["tags"]
        out.extend(part for part in parts if part["params"])
    return out


def configure_param_groups(model: torch.nn.Module, optimizer_params: dict[str, Any]) -> list[dict[str, Any]]:
    """Param groups for ``model`` from a params file's ``optimizer`` block (Model Zoo 2.10's function).

    * ``params``: a list of ``{params: glob or [globs], tag: name}``; the matched parameters' groups carry
      ``tags`` (for schedulers' ``param_group_tags``). A pattern that matches nothing is an error.
    * ``weight_decay`` (or ``weight_decay_rate``): every group is split in a decayed group and one with
      ``weight_decay: 0.0`` for biases and normalization-layer parameters.
    * ``adjust_learning_rate``: muP scales by LR adjustment group name (the model's
      ``lr_adjustment_groups``, or Model Zoo's defaults ``embedding`` / ``decoder_kernel``). When some
      group's scale is not 1.0, every group carries ``adjust_learning_rate`` (1.0 where unscaled), which
      ScalePerParamLR multiplies into its lr; otherwise no group carries it (the Model Zoo's rule).

    Only parameters with ``requires_grad`` are grouped. Returns dicts whose ``params`` are tensors.

    Raises:
        ValueError: naming the key (``optimizer.adjust_learning_rate.<group>``, ``optimizer.params[i]``).
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    overrides = optimizer_params.get("adjust_learning_rate") or {}
    if not isinstance(overrides, dict):
        raise ValueError("optimizer.adjust_learning_rate: expected a mapping of LR adjustment group names to "
                         f"factors (e.g. decoder_kernel: 0.25), got {overrides!r}")
    groups = _partition_by_tags(named, optimizer_params.get("params"))
    weight_decay = float(optimizer_params.get("weight_decay", optimizer_params.get("weight_decay_rate", 0.0)))
    groups = _split_weight_decay(model, groups, weight_decay)
    if any("tags" in group for group in groups):  # the Model Zoo drops the empty halves when tags are used
        groups = [group for group in groups if group["params"]]
    groups = _split_lr_scale(model, groups, lr_adjustment_scales(model, dict(overrides)))
    for group in groups:
        group["params"] = [param for _, param in group["params"]]
    return groups
