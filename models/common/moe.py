"""Mixture of experts (the ``moe:`` section; FeedForwardNetwork.MoEConfig and SparseMoEBlock).

Only the configuration is read here so far: a ``moe`` section that enables experts (more than one
expert in all) is refused with an error naming ``moe.num_experts``, never trained as a dense model.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

__all__ = ["MoEConfig", "moe_config"]


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int = 0
    num_shared_experts: Optional[int] = None
    top_k: int = 1
    load_balancing_loss_coef: float = 0.0
    null_expert_bias: Optional[float] = 0.0
    moe_implementation: str = "experimental"
    router_use_bias: Optional[bool] = False
    router_fp32: bool = True
    routing_algorithm: str = "learned"
    router_selection_nonlinearity: Optional[str] = "softmax"
    expert_weighting_nonlinearity: Optional[str] = "softmax"
    expert_weighting_normalization: Optional[bool] = True
    sinkhorn_n_iters: Optional[int] = 1
    gate_initializer: Any = None
    probability_before_ffn: bool = False

    @property
    def enabled(self) -> bool:
        return self.num_experts + (self.num_shared_experts or 0) > 1


def moe_config(section: dict) -> MoEConfig:
    known = {f.name for f in fields(MoEConfig)}
    for key in section:
        if key not in known:
            raise ValueError(f"moe.{key}: unknown key; the moe section takes {', '.join(sorted(known))}")
    cfg = MoEConfig(**section)
    if cfg.enabled:
        raise ValueError(f"moe.num_experts: {cfg.num_experts} experts: mixture-of-experts layers are not "
                         "implemented in cs-run yet (a dense model would be a different model)")
    return cfg

