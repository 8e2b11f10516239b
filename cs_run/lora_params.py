"""``model.lora_params``: the Model Zoo's LoRA settings, checked once at load (torch-free).

The vendor's ``Lora`` callback (trainer form: ``trainer.init.callbacks: [{Lora: {lora_params: ...}}]``,
legacy form: ``model.lora_params``) takes one mapping or a list of them. Each mapping is one adapter
config; a layer gets the first config whose ``target_modules`` are all among the class names of the layer
and its ancestors (``["MultiheadAttention"]``: every Linear inside attention; none: every Linear and
Embedding). ``cs_run.models.common.lora`` builds the adapters from what :func:`check_lora_params` returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from cs_run._checks import unknown_key_message
from cs_run.errors import ParamsError

__all__ = ["LoraConfig", "check_lora_params", "LORA_SUFFIXES"]

LORA_SUFFIXES = (".lora_A", ".lora_B")
"""The adapters' state-dict name endings (the vendor's); every other parameter of a LoRA model is frozen."""


@dataclass(frozen=True)
class LoraConfig:
    """One adapter config, with the vendor's key names and defaults (``LoraConfig`` of the Model Zoo)."""

    r: int = 0
    """Rank of the adapter matrices A (r x in) and B (out x r)."""
    alpha: float = 1
    """The update is scaled by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapter's input (Linear layers only, as the vendor's)."""
    fan_in_fan_out: bool = False
    """Refused when set: the vendor's layer stores its weight transposed and cannot load a non-square one."""
    merge_weights: bool = False
    """The vendor folds the adapters into the weights in eval mode; here they are folded on export
    (``checkpoint convert --to hf``) and never in place, so a checkpoint always holds the unfolded weights."""
    target_modules: Optional[tuple[str, ...]] = None
    """Class names that must all be among a layer's own class and its ancestors' (None: every layer)."""

    @property
    def scaling(self) -> float:
        return self.alpha / self.r


_KEYS = [name for name in LoraConfig.__dataclass_fields__]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_lora_params(value: Any, key: str = "model.lora_params",
                      locate: Callable[[str], str] = lambda key: "") -> list[LoraConfig]:
    """Every config of the section, in order; a key or value the vendor's LoRA could not mean is one
    ``params:`` error naming it (an empty list when the section is null)."""
    if value is None:
        return []
    entries = value if isinstance(value, list) else [value]
    if not entries:
        raise ParamsError(f"params: {key}: an empty list converts no layer; give one mapping of r, alpha, "
                          f"dropout, target_modules{locate(key)}")
    return [_config(entry, f"{key}[{i}]" if isinstance(value, list) else key, locate)
            for i, entry in enumerate(entries)]


def _config(entry: Any, key: str, locate: Callable[[str], str]) -> LoraConfig:
    if not isinstance(entry, dict):
        raise ParamsError(f"params: {key}: expected a mapping of {', '.join(_KEYS)}, got "
                          f"{type(entry).__name__}{locate(key)}")
    for name in entry:
        if name not in _KEYS:
            raise ParamsError(unknown_key_message(f"{key}.{name}", str(name), _KEYS, where=locate(f"{key}.{name}")))
    r, alpha, dropout = entry.get("r", 0), entry.get("alpha", 1), entry.get("dropout", 0.0)

    def bad(name: str, why: str) -> ParamsError:
        return ParamsError(f"params: {key}.{name}: {why}{locate(f'{key}.{name}')}")

    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise bad("r", f"the adapter rank must be a whole number >= 1, got {r!r} (r: 0, the vendor's default, "
                       "freezes every weight and trains nothing)")
    if not _number(alpha) or alpha <= 0:
        raise bad("alpha", f"must be a number > 0 (the update is scaled by alpha / r), got {alpha!r}")
    if not _number(dropout) or not 0 <= dropout < 1:
        raise bad("dropout", f"must be a probability in [0, 1), got {dropout!r}")
    for flag in ("fan_in_fan_out", "merge_weights"):
        if not isinstance(entry.get(flag, False), bool):
            raise bad(flag, f"must be true or false, got {entry[flag]!r}")
    if entry.get("fan_in_fan_out"):
        raise bad("fan_in_fan_out", "true is not supported: it stores a layer's weight transposed (the vendor's "
                                    "layer then cannot load a non-square weight); cs-run's layers are (out, in)")
    targets = entry.get("target_modules")
    if targets is not None and (not isinstance(targets, list) or not targets
                                or not all(isinstance(t, str) and t for t in targets)):
        raise bad("target_modules", f"expected a non-empty list of module class names (e.g. [MultiheadAttention] "
                                    f"or [TransformerDecoderLayer, Linear]), got {targets!r}")
    return LoraConfig(r=r, alpha=alpha, dropout=float(dropout), fan_in_fan_out=False,
                      merge_weights=entry.get("merge_weights", False),
                      target_modules=tuple(targets) if targets is not None else None)
