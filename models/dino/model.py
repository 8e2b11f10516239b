"""dino: the Model Zoo 2.10 DINOv2 model (``model.name: dino``, DinoModel = the generic image encoders'
BaseSSLArch): trunks, heads and losses run in that order, each model once per ``forward_args`` entry, and the
loss is the weighted sum of the losses' outputs (each also summarized as ``loss/<name>``).

The teacher is a copy of the student (``copy_init_weights``, at build) that is never trained (``freeze``) and
follows the student by ``ema``: at the start of every training forward, before anything is computed,
``teacher = decay * teacher + (1 - decay) * student`` with ``decay`` the linear or cosine schedule of the
model's ``ema_step`` buffer (1, no change, at step 0), as the vendor's EMAWrapper does; ``ema_step`` counts
every forward. Module names are the vendor's: ``image_model_trunks.model.N``, ``heads.model.N``,
``losses.model.N`` (their ``center``/``step`` buffers) and ``ema_step``, so checkpoints load by key.
"""

from __future__ import annotations

import logging
import math
import typing

import torch
from torch import nn

from cs_run.models.common.freeze import freeze_modules
from cs_run.models.dino.config import DinoConfig, EmaConfig, PartConfig, Ref
from cs_run.models.dino.heads import DinoHead, MultiImageViTModel
from cs_run.models.dino.losses import DinoDistillationLoss, KoLeoLoss, iBOTPatchLoss
from cs_run.utils.tensorboard import summarize_scalar

__all__ = ["DinoModel", "ema_decay", "build", "build_model"]

logger = logging.getLogger(__name__)

_BUILDERS = {"MultiImageViTModel": MultiImageViTModel, "DinoHead": DinoHead,
             "DinoDistillationLoss": DinoDistillationLoss, "iBOTPatchLoss": iBOTPatchLoss,
             "KoLeoLoss": lambda cfg: KoLeoLoss()}


def ema_decay(ema: EmaConfig, step: torch.Tensor) -> torch.Tensor:
    """The vendor's momentum schedule at ``step``: linear ``start + step (end - start) / total`` or cosine
    ``end + (start - end) (1 + cos(pi step / total)) / 2``."""
    p = ema.scheduler_params
    start, end, total = p["ema_decay_start"], p["ema_decay_end"], p["total_steps"]
    step = step.to(torch.float32)
    if ema.scheduler_name == "linear":
        return start + step * (end - start) / total
    return end + 0.5 * (start - end) * (1 + torch.cos(math.pi * step / total))


class _Part(nn.Module):
    """The vendor's SSLComponent: ``model`` is the part's ModuleList (its outputs are not module state)."""

    def __init__(self, entries: list[PartConfig]) -> None:
        super().__init__()
        self.model = nn.ModuleList(_BUILDERS[e.name](e.config) for e in entries)


class DinoModel(nn.Module):
    """``forward(batch) -> loss``: the runners' contract; ``batch`` is DinoImageDataProcessor's dict."""

    def __init__(self, cfg: DinoConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.image_model_trunks = _Part(cfg.image_model_trunks)
        self.heads = _Part(cfg.heads)
        self.losses = _Part(cfg.losses)
        for (src_part, src), (tgt_part, tgt) in cfg.copy_init_weights:
            self._model(tgt_part, tgt).load_state_dict(self._model(src_part, src).state_dict())
        if cfg.ema:
            self.register_buffer("ema_step", torch.zeros(1, dtype=torch.int32))
        if cfg.freeze:
            freeze_modules(self, cfg.freeze)

    def _model(self, part: str, index: int) -> nn.Module:
        return getattr(self, part).model[index]

    @torch.no_grad()
    def _apply_ema(self) -> None:
        for ema in self.cfg.ema:
            decay = torch.where(self.ema_step > 0, ema_decay(ema, self.ema_step), 1.0)
            source, target = self._model(*ema.source), self._model(*ema.target)
            for p_src, p_tgt in zip(source.parameters(), target.parameters()):
                p_tgt.mul_(decay.to(p_tgt.dtype)).add_((1.0 - decay).to(p_tgt.dtype) * p_src.detach())

    def forward(self, batch: dict) -> torch.Tensor:
        if self.cfg.ema:
            if self.training:
                self._apply_ema()
            self.ema_step.add_(1)
        outputs: dict[str, list] = {}
        for part in ("image_model_trunks", "heads", "losses"):
            outputs[part] = []
            for model, entry in zip(getattr(self, part).model, getattr(self.cfg, part)):
                passes = []
                for args in entry.forward_args:
                    values = [_resolve(a, batch, outputs) for a in args]
                    if entry.stop_grad:
                        with torch.no_grad():
                            out = model(*values)
                    else:
                        out = model(*values)
                    passes.append(list(out) if isinstance(out, tuple) else [out])
                outputs[part].append(passes)
        total = None
        for entry, passes in zip(self.cfg.losses, outputs["losses"]):
            value = sum(out for outs in passes for out in outs) * entry.loss_weight
            summarize_scalar(f"loss/{entry.name}", value)
            total = value if total is None else total + value
        return total


def _resolve(arg: typing.Any, batch: dict, outputs: dict) -> typing.Any:
    if not isinstance(arg, Ref):
        return arg
    if arg.part == "ssl_transform":
        return batch[arg.batch_key]
    i, j, k = arg.index
    return outputs[arg.part][i][j][k]


def build(config: DinoConfig) -> DinoModel:
    """Builder of ``model.name: dino`` (ModelSpec.builder): the model of one config object."""
    return DinoModel(config)


def build_model(**keys: typing.Any) -> DinoModel:
    """Model function of ``model.name: dino``: the ``model:`` keys (checked against :class:`DinoConfig`) built."""
    return build(DinoConfig(**keys))
