"""The dino ``model:`` keys (Model Zoo 2.10 ``models/vision/dino``: DinoModelConfig, which is the generic image
encoders' GenericImageEncodersModelConfig under its own name), declared once and checked at load.

A dino model is lists of parts wired by ``forward_args``: ``image_model_trunks`` (MultiImageViTModel, the ViT
trunk over ``[batch, views, c, h, w]``), ``heads`` (DinoHead), ``losses`` (DinoDistillationLoss, iBOTPatchLoss,
KoLeoLoss), plus ``copy_init_weights``, ``ema`` and ``freeze``. Each ``forward_args`` entry is one forward pass
of its part; each argument is ``ssl_transform.output('<batch key>')``, ``<part>.output(i, j, k)`` (output ``k``
of forward pass ``j`` of model ``i`` of an earlier part) or a literal such as null. The vendor evaluates these
strings with ``eval``; here they are parsed once into :class:`Ref` values and every index is checked against the
lists it points into, so a bad one is a params error naming its key path instead of an IndexError mid-step.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Optional

from cs_run.models.common.config import key
from cs_run.models.common.initializers import initializer_spec, truncated_normal
from cs_run.models.vision_transformer.config import ViTModelConfig

__all__ = ["BATCH_KEYS", "Ref", "DinoHeadConfig", "TempLossConfig", "PartConfig", "EmaConfig", "DinoConfig"]

BATCH_KEYS = ("local_view", "global_view", "labels", "collated_masks")
"""The keys of a DinoImageDataProcessor batch (Dinov2Transform's output_keys)."""
PARTS = ("image_model_trunks", "heads", "losses")
MODEL_KEY = {"image_model_trunks": "image_model", "heads": "head_model", "losses": "loss"}
OUTPUTS = {"MultiImageViTModel": 2, "DinoHead": 1, "DinoDistillationLoss": 1, "iBOTPatchLoss": 1, "KoLeoLoss": 1}
"""Each model's outputs per forward pass (the trunk: hidden states and pooled states)."""
ARITY = {"MultiImageViTModel": 3, "DinoHead": 1, "DinoDistillationLoss": 3, "iBOTPatchLoss": 3, "KoLeoLoss": 1}
"""Each model's forward arguments: a forward_args entry gives exactly these (the vendor's rule)."""
NAMES = {"image_model_trunks": ("MultiImageViTModel",), "heads": ("DinoHead",),
         "losses": ("DinoDistillationLoss", "iBOTPatchLoss", "KoLeoLoss")}

_OUTPUT = re.compile(r"^(\w+)\.output\((.*)\)$")
_MODEL = re.compile(r"^(image_model_trunks|heads|losses)\.model\((\d+)\)$")


@dataclass(frozen=True)
class Ref:
    """A parsed forward argument: a batch key (``part`` is ``ssl_transform``) or output ``k`` of pass ``j``
    of model ``i`` of ``part``."""

    part: str
    batch_key: Optional[str] = None
    index: tuple = ()


@dataclass
class DinoHeadConfig:
    """DinoHead: an MLP to a bottleneck, L2-normalised, then a weight-normalised linear layer."""

    input_size: int
    output_size: int
    num_layers: int = 3
    hidden_size: int = 2048
    bottleneck_size: int = 256
    use_bias_in_mlp: bool = True
    norm_last_layer: bool = False
    initializer: Any = None
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        self.initializer = initializer_spec(truncated_normal(self.initializer_range) if self.initializer is None
                                            else self.initializer, "initializer")


@dataclass
class TempLossConfig:
    """DinoDistillationLoss and iBOTPatchLoss: student temperature, a scheduled teacher temperature, a center."""

    input_size: int
    warmup_teacher_temp: float
    teacher_temp: float
    warmup_teacher_temp_steps: int
    total_steps: int
    student_temp: float = 0.1
    center_momentum: float = 0.9
    teacher_temp_scheduler: str = "linear_constant"
    no_slice: bool = False

    def __post_init__(self) -> None:
        if self.teacher_temp_scheduler not in ("linear_constant", "linear_cosine"):
            raise ValueError(f"teacher_temp_scheduler: {self.teacher_temp_scheduler!r} is not one of "
                             "linear_constant, linear_cosine")
        if self.total_steps <= self.warmup_teacher_temp_steps and self.teacher_temp_scheduler == "linear_cosine":
            raise ValueError(f"total_steps: {self.total_steps} must exceed warmup_teacher_temp_steps "
                             f"{self.warmup_teacher_temp_steps} (the cosine part divides by their difference)")


@dataclass
class PartConfig:
    """One model of a part: its name, its config, its forward passes' arguments, stop_grad, loss_weight."""

    name: str
    config: Any
    forward_args: list
    stop_grad: bool = False
    loss_weight: float = 1.0


@dataclass
class EmaConfig:
    """``target = decay * target + (1 - decay) * source`` before every training forward."""

    source: tuple
    target: tuple
    scheduler_name: str = "linear"
    scheduler_params: dict = dataclasses.field(default_factory=dict)


_LOSS_DEFAULTS = {"DinoDistillationLoss": "linear_constant", "iBOTPatchLoss": "linear_cosine"}


def _fields(cls: type, values: dict, where: str) -> dict:
    """``values`` checked against ``cls``'s fields: no unknown key, every key without a default present."""
    names = {f.name: f for f in dataclasses.fields(cls)}
    for k in values:
        if k not in names:
            raise ValueError(f"{where}.{k}: unknown key; expected one of {', '.join(names)}")
    for name, f in names.items():
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and name not in values:
            raise ValueError(f"{where}.{name}: missing; the vendor's config requires it")
    return values


def _build_model_config(part: str, spec: Any, where: str) -> tuple[str, Any]:
    if not isinstance(spec, dict) or spec.get("name") not in NAMES[part]:
        got = spec.get("name") if isinstance(spec, dict) else spec
        raise ValueError(f"{where}.name: {got!r} is not one of {', '.join(NAMES[part])}")
    name, values = spec["name"], {k: v for k, v in spec.items() if k != "name"}
    try:
        if name == "MultiImageViTModel":
            return name, ViTModelConfig(**_fields(ViTModelConfig, values, where))
        if name == "DinoHead":
            return name, DinoHeadConfig(**_fields(DinoHeadConfig, values, where))
        if name == "KoLeoLoss":
            if values:
                raise ValueError(f"{where}.{next(iter(values))}: unknown key; KoLeoLoss takes none")
            return name, None
        values = {"teacher_temp_scheduler": _LOSS_DEFAULTS[name], **values}
        if name == "DinoDistillationLoss" and "no_slice" in values:
            raise ValueError(f"{where}.no_slice: unknown key; DinoDistillationLoss has no no_slice")
        return name, TempLossConfig(**_fields(TempLossConfig, values, where))
    except ValueError as e:
        text = str(e)
        raise ValueError(text if text.startswith(where) else f"{where}.{text}") from None
    except TypeError as e:  # a key of the wrong type reaching a computation
        raise ValueError(f"{where}: {e}") from None


def _parse_arg(value: Any, where: str) -> Any:
    """A forward argument: a :class:`Ref` for the vendor's ``x.output(...)`` strings, else the literal."""
    if not isinstance(value, str) or ".output" not in value:
        return value
    m = _OUTPUT.match(value.strip())
    if not m:
        raise ValueError(f"{where}: {value!r} is not <part>.output(...)")
    part, inside = m.group(1), m.group(2).strip()
    if part == "ssl_transform":
        batch_key = inside.strip("'\"")
        if batch_key not in BATCH_KEYS:
            raise ValueError(f"{where}: {value!r}: the batch has {', '.join(BATCH_KEYS)}")
        return Ref(part, batch_key=batch_key)
    if part not in PARTS:
        raise ValueError(f"{where}: {value!r}: {part!r} is not one of ssl_transform, {', '.join(PARTS)}")
    try:
        index = tuple(int(x) for x in inside.split(","))
    except ValueError:
        index = ()
    if len(index) != 3 or min(index) < 0:
        raise ValueError(f"{where}: {value!r}: expected three indices (model, forward pass, output)")
    return Ref(part, index=index)


def _parse_parts(part: str, entries: Any) -> list[PartConfig]:
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{part}: expected a non-empty list of {{{MODEL_KEY[part]}: ..., forward_args: ...}}")
    out = []
    for i, entry in enumerate(entries):
        where = f"{part}[{i}]"
        allowed = {MODEL_KEY[part], "forward_args", "stop_grad"} | ({"loss_weight"} if part == "losses" else set())
        if not isinstance(entry, dict) or MODEL_KEY[part] not in entry:
            raise ValueError(f"{where}: expected a mapping with {MODEL_KEY[part]}")
        for k in entry:
            if k not in allowed:
                raise ValueError(f"{where}.{k}: unknown key; expected one of {', '.join(sorted(allowed))}")
        name, config = _build_model_config(part, entry[MODEL_KEY[part]], f"{where}.{MODEL_KEY[part]}")
        passes = entry.get("forward_args") or []
        if not isinstance(passes, list) or not all(isinstance(p, list) for p in passes):
            raise ValueError(f"{where}.forward_args: expected a list of argument lists")
        parsed = []
        for j, args in enumerate(passes):
            if len(args) != ARITY[name]:
                raise ValueError(f"{where}.forward_args[{j}]: {name} takes {ARITY[name]} arguments, got {len(args)}")
            parsed.append([_parse_arg(a, f"{where}.forward_args[{j}][{k}]") for k, a in enumerate(args)])
        out.append(PartConfig(name, config, parsed, bool(entry.get("stop_grad", False)),
                              float(entry.get("loss_weight", 1.0))))
    return out


def _model_ref(value: Any, where: str, sizes: dict) -> tuple:
    m = _MODEL.match(value) if isinstance(value, str) else None
    if not m:
        raise ValueError(f"{where}: {value!r} is not <image_model_trunks|heads|losses>.model(<index>)")
    part, i = m.group(1), int(m.group(2))
    if i >= sizes[part]:
        raise ValueError(f"{where}: {value!r}: {part} has {sizes[part]} models")
    return part, i


@dataclass
class DinoConfig:
    """``model.name: dino``: the SSL architecture's parts and how they are wired (see the module doc)."""

    image_model_trunks: list = key(None, "2.4.0", "MultiImageViTModel trunks (the ViT keys), forward_args, stop_grad")
    heads: list = key(None, "2.4.0", "DinoHeads (input_size, output_size, hidden_size, bottleneck_size, ...)")
    losses: list = key(None, "2.4.0", "DinoDistillationLoss, iBOTPatchLoss or KoLeoLoss, each with loss_weight")
    copy_init_weights: Optional[list] = key(None, "2.4.0", "[{source, target}]: target starts as a copy of source")
    ema: Optional[list] = key(None, "2.4.0", "[{source, target, scheduler_name, scheduler_params}]: the teacher's EMA")
    freeze: Optional[list] = key(None, "2.4.0", "regular expressions of modules and parameters not trained")

    def __post_init__(self) -> None:
        for part in PARTS:
            setattr(self, part, _parse_parts(part, getattr(self, part)))
        sizes = {part: len(getattr(self, part)) for part in PARTS}
        for p, part in enumerate(PARTS):
            for i, entry in enumerate(getattr(self, part)):
                for j, args in enumerate(entry.forward_args):
                    for k, ref in enumerate(args):
                        if isinstance(ref, Ref) and ref.part != "ssl_transform":
                            self._check_ref(ref, (p, i), f"{part}[{i}].forward_args[{j}][{k}]")
        self.copy_init_weights = [
            (_model_ref(c.get("source"), f"copy_init_weights[{n}].source", sizes),
             _model_ref(c.get("target"), f"copy_init_weights[{n}].target", sizes))
            for n, c in enumerate(self._mappings("copy_init_weights", {"source", "target"}))]
        emas = []
        for n, e in enumerate(self._mappings("ema", {"source", "target", "scheduler_name", "scheduler_params"})):
            where = f"ema[{n}]"
            ema = EmaConfig(_model_ref(e.get("source"), f"{where}.source", sizes),
                            _model_ref(e.get("target"), f"{where}.target", sizes),
                            e.get("scheduler_name", "linear"), dict(e.get("scheduler_params") or {}))
            if ema.scheduler_name not in ("linear", "cosine"):
                raise ValueError(f"{where}.scheduler_name: {ema.scheduler_name!r} is not one of linear, cosine")
            need = {"ema_decay_start", "ema_decay_end", "total_steps"}
            if set(ema.scheduler_params) != need:
                raise ValueError(f"{where}.scheduler_params: expected exactly {', '.join(sorted(need))}, got "
                                 f"{', '.join(sorted(ema.scheduler_params)) or 'none'}")
            emas.append(ema)
        self.ema = emas
        if self.freeze is not None:
            for n, pattern in enumerate(self.freeze):
                try:
                    re.compile(pattern)
                except (re.error, TypeError) as e:
                    raise ValueError(f"freeze[{n}]: {pattern!r} is not a regular expression ({e})") from None

    def _mappings(self, name: str, allowed: set) -> list:
        values = getattr(self, name) or []
        for n, value in enumerate(values):
            if not isinstance(value, dict):
                raise ValueError(f"{name}[{n}]: expected a mapping of {', '.join(sorted(allowed))}")
            for k in value:
                if k not in allowed:
                    raise ValueError(f"{name}[{n}].{k}: unknown key; expected one of {', '.join(sorted(allowed))}")
        return values

    def _check_ref(self, ref: Ref, at: tuple, where: str) -> None:
        """``ref`` points at an output computed before the pass that reads it (an earlier part, or an
        earlier model of the same part) that exists."""
        part_no = PARTS.index(ref.part)
        i, j, k = ref.index
        models = getattr(self, ref.part)
        if (part_no, i) >= at:
            raise ValueError(f"{where}: {ref.part}.output({i},{j},{k}) is not computed before this pass")
        if i >= len(models):
            raise ValueError(f"{where}: {ref.part}.output({i},{j},{k}): {ref.part} has {len(models)} models")
        if j >= len(models[i].forward_args):
            raise ValueError(f"{where}: {ref.part}.output({i},{j},{k}): {ref.part}[{i}] has "
                             f"{len(models[i].forward_args)} forward passes")
        if k >= OUTPUTS[models[i].name]:
            raise ValueError(f"{where}: {ref.part}.output({i},{j},{k}): {models[i].name} has "
                             f"{OUTPUTS[models[i].name]} outputs")

