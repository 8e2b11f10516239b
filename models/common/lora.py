"""LoRA adapters as the Model Zoo defines them (``model.lora_params``; configs checked by
:mod:`cs_run.lora_params`): a targeted ``nn.Linear`` or ``nn.Embedding`` gets a frozen weight plus a
trainable low-rank update ``B @ A * alpha / r``, and every other parameter of the model is frozen.

The adapters keep the vendor's checkpoint names (``<layer>.lora_A``, ``<layer>.lora_B``) and shapes
(A: r x in, B: out x r), its initialisation (A Kaiming-uniform and B zeros for a Linear layer; A zeros and
B normal for an Embedding) and its random draws (a layer's own weight and bias are drawn again before A,
as the vendor's layer resets itself when made), so a seeded run consumes the stream as the vendor's does.
The original weight Parameter is kept, not copied, so weights tied to it (a shared LM head) stay tied.
"""

from __future__ import annotations

import logging
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from cs_run.errors import ParamsError
from cs_run.lora_params import LORA_SUFFIXES, LoraConfig

__all__ = ["LoRALinear", "LoRAEmbedding", "apply_lora", "folded_state_dict", "LORA_SUFFIXES"]

logger = logging.getLogger(__name__)


class LoRALinear(nn.Linear):
    """``y = x W^T + b + dropout(x) A^T B^T * alpha / r`` with W and b frozen."""

    def __init__(self, in_features: int, out_features: int, config: LoraConfig, bias: bool = True,
                 device=None, dtype=None) -> None:
        self.config = config
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.lora_A = nn.Parameter(self.weight.new_zeros((config.r, in_features)))
        self.lora_B = nn.Parameter(self.weight.new_zeros((out_features, config.r)))
        self.lora_dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if hasattr(self, "lora_A"):
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = self.lora_dropout(x) @ self.lora_A.transpose(0, 1) @ self.lora_B.transpose(0, 1)
        return F.linear(x, self.weight, self.bias) + update * self.config.scaling

    def folded_weight(self) -> torch.Tensor:
        return self.weight + (self.lora_B @ self.lora_A) * self.config.scaling


class LoRAEmbedding(nn.Embedding):
    """``E[x] + (A^T)[x] B^T * alpha / r`` with the table E frozen (the vendor applies no dropout here)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, config: LoraConfig, **kwargs) -> None:
        self.config = config
        super().__init__(num_embeddings, embedding_dim, **kwargs)
        self.lora_A = nn.Parameter(self.weight.new_zeros((config.r, num_embeddings)))
        self.lora_B = nn.Parameter(self.weight.new_zeros((embedding_dim, config.r)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if hasattr(self, "lora_A"):
            nn.init.zeros_(self.lora_A)
            nn.init.normal_(self.lora_B)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(x, self.lora_A.transpose(0, 1), self.padding_idx, self.max_norm, self.norm_type,
                           self.scale_grad_by_freq, self.sparse)
        return super().forward(x) + (rows @ self.lora_B.transpose(0, 1)) * self.config.scaling

    def folded_weight(self) -> torch.Tensor:
        return self.weight + (self.lora_B @ self.lora_A).transpose(0, 1) * self.config.scaling


def _config_for(configs: list[LoraConfig], class_names: list[str]) -> Optional[LoraConfig]:
    """The first config whose target_modules are all among ``class_names`` (the vendor's rule)."""
    for config in configs:
        if config.target_modules is None or all(name in class_names for name in config.target_modules):
            return config
    return None


def _adapted(module: nn.Module, config: LoraConfig) -> nn.Module:
    """The LoRA layer replacing ``module``, holding ``module``'s own weight (and bias) Parameters."""
    weight = module.weight
    factory = {"device": weight.device, "dtype": weight.dtype}
    if isinstance(module, nn.Embedding):
        new: nn.Module = LoRAEmbedding(module.num_embeddings, module.embedding_dim, config,
                                       padding_idx=module.padding_idx, max_norm=module.max_norm,
                                       norm_type=module.norm_type, scale_grad_by_freq=module.scale_grad_by_freq,
                                       sparse=module.sparse, **factory)
    else:
        new = LoRALinear(module.in_features, module.out_features, config, bias=module.bias is not None, **factory)
        new.bias = module.bias
    new.weight = weight
    new.train(module.training)
    return new


def apply_lora(model: nn.Module, configs: list[LoraConfig]) -> list[str]:
    """Replace every targeted Linear and Embedding of ``model`` in place (children first, in registration
    order) and freeze every parameter but the adapters; returns the converted layers' names.

    Raises:
        ParamsError: no layer matched any config's target_modules.
    """
    converted: list[str] = []

    def visit(module: nn.Module, prefix: str, class_names: list[str]) -> None:
        for name, child in list(module.named_children()):
            path = f"{prefix}{name}"
            names = [*class_names, type(child).__name__]
            visit(child, path + ".", names)
            config = _config_for(configs, names) if isinstance(child, (nn.Linear, nn.Embedding)) else None
            if config is not None and not isinstance(child, (LoRALinear, LoRAEmbedding)):
                setattr(module, name, _adapted(child, config))
                converted.append(path)

    visit(model, "", [type(model).__name__])
    if not converted:
        wanted = sorted({" + ".join(c.target_modules) for c in configs if c.target_modules})
        present = sorted({type(m).__name__ for m in model.modules()})
        raise ParamsError(f"params: model.lora_params: no Linear or Embedding layer of the model is inside "
                          f"{' or '.join(wanted)}; target_modules names module classes, and this model has: "
                          f"{', '.join(present)}")
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.endswith(LORA_SUFFIXES))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    logger.info("LoRA: %d layers adapted (%s); %d of %d parameters train (%.2f%%)", len(converted),
                ", ".join(converted[:4]) + (", ..." if len(converted) > 4 else ""), trainable, total,
                100.0 * trainable / max(total, 1))
    return converted


def folded_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict with each adapter folded into its layer's weight and the adapters left out
    (the vendor's fold_lora_checkpoint; the model itself is not changed). A weight tied to an adapted
    Embedding (a shared LM head) keeps its unfolded value under its own name, as the vendor's fold unties it."""
    state = dict(model.state_dict(keep_vars=False))
    for name, module in model.named_modules():
        if isinstance(module, (LoRALinear, LoRAEmbedding)):
            prefix = f"{name}." if name else ""
            with torch.no_grad():
                state[f"{prefix}weight"] = module.folded_weight().detach().clone()
            del state[f"{prefix}lora_A"], state[f"{prefix}lora_B"]
    return state
