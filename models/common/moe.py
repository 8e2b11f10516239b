"""Mixture of experts (the ``moe:`` section): FeedForwardNetwork.MoEConfig, the Model Zoo's
SparseMoEBlock with learned routing, and its LoadBalancingLoss.

Routing (SparseMoEBlock.forward, ``routing_algorithm: learned``): ``gate`` (a linear layer, hidden ->
num_experts) gives router logits (in fp32 with ``router_fp32``); ``router_selection_nonlinearity``
(softmax or sigmoid) gives the routing weights whose top ``top_k`` experts a token goes to;
``expert_weighting_nonlinearity`` gives the weights the chosen experts' outputs are scaled by, with
``expert_weighting_normalization`` divided by their sum over the chosen experts (plus
``null_expert_bias`` when > 0). Shared experts (``num_shared_experts``) see every token with weight 1.

The computation is dense: every expert runs on every token and its output is multiplied by the token's
weight for it (zero for experts not chosen). That is the Model Zoo's own result (its sparse kernels
compute only the chosen rows and zero the rest) with no data-dependent shapes, so the CSX engine
traces it as one graph. Parameter names are those of the Model Zoo's default ``moe_implementation:
experimental`` (SparseActFeedForwardNetwork): ``ffn.gate``, ``ffn.experts.experts.<i>.<layer>.
linear_layer[_for_glu]`` and ``ffn.experts.shared_experts.<j>.ffn.<layer>...``; the other
implementations lay their parameters out differently and are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

import torch
from torch import nn

from cs_run.models.common.ffn import FeedForwardNetwork, SingleFeedForwardLayer
from cs_run.models.common.initializers import initializer_spec, make_initializer

__all__ = ["MoEConfig", "moe_config", "SparseMoEBlock", "load_balancing_loss"]

_NONLINEARITIES = ("softmax", "sigmoid")


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
    """The ``moe`` section; ValueError naming ``moe.<key>`` for an unknown key or a value cs-run cannot
    honour."""
    known = {f.name for f in fields(MoEConfig)}
    for key in section:
        if key not in known:
            raise ValueError(f"moe.{key}: unknown key; the moe section takes {', '.join(sorted(known))}")
    cfg = MoEConfig(**section)
    if not cfg.enabled:
        return cfg
    if cfg.routing_algorithm != "learned":
        raise ValueError(f"moe.routing_algorithm: {cfg.routing_algorithm!r} is not supported by cs-run (learned "
                         "routing only; hash and uniform routing are not implemented)")
    if cfg.moe_implementation != "experimental":
        raise ValueError(f"moe.moe_implementation: {cfg.moe_implementation!r} is not supported by cs-run: its "
                         "parameters are laid out differently; use the default 'experimental' (same math)")
    for key in ("router_selection_nonlinearity", "expert_weighting_nonlinearity"):
        if getattr(cfg, key) not in _NONLINEARITIES:
            raise ValueError(f"moe.{key}: {getattr(cfg, key)!r} is not supported by cs-run (softmax or sigmoid; "
                             "sinkhorn is not implemented)")
    if cfg.probability_before_ffn:
        raise ValueError("moe.probability_before_ffn: true is not supported by cs-run (weights apply after the FFN)")
    if cfg.num_experts < 1:
        raise ValueError(f"moe.num_experts: must be >= 1 with experts enabled, got {cfg.num_experts}")
    if not 1 <= cfg.top_k <= cfg.num_experts:
        raise ValueError(f"moe.top_k: must be in [1, num_experts={cfg.num_experts}], got {cfg.top_k}")
    if cfg.num_shared_experts is not None and cfg.num_shared_experts < 1:
        raise ValueError(f"moe.num_shared_experts: must be >= 1 when given, got {cfg.num_shared_experts}")
    if cfg.load_balancing_loss_coef < 0:
        raise ValueError(f"moe.load_balancing_loss_coef: must be >= 0, got {cfg.load_balancing_loss_coef}")
    if cfg.gate_initializer is not None:
        initializer_spec(cfg.gate_initializer, "moe.gate_initializer")
    return cfg


def _nonlinearity(name: str, logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits, dim=-1) if name == "softmax" else torch.sigmoid(logits)


class SparseMoEBlock(nn.Module):
    """The MoE FFN of a decoder layer: ``forward(x) -> (output, routing weights (fp32), expert mask)``,
    the last two [batch, seq, num_experts] for the load-balancing loss."""

    def __init__(self, cfg: MoEConfig, hidden_size: int, filter_size: int, activation: str, dropout: float,
                 bias: bool, initializer: dict, output_initializer: dict, gate_initializer: dict) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = nn.Linear(hidden_size, cfg.num_experts, bias=bool(cfg.router_use_bias))
        self.experts = _Experts(cfg, hidden_size, filter_size, activation, dropout, bias, initializer,
                                output_initializer)
        with torch.no_grad():
            make_initializer(gate_initializer)(self.gate.weight)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        logits = self.gate(x)
        if cfg.router_fp32:
            logits = logits.float()
        routing_fp32 = _nonlinearity(cfg.router_selection_nonlinearity, logits)
        routing = routing_fp32.to(x.dtype)
        if cfg.expert_weighting_nonlinearity != cfg.router_selection_nonlinearity:
            weights = _nonlinearity(cfg.expert_weighting_nonlinearity, logits).to(x.dtype)
        else:
            weights = routing
        indices = routing.topk(cfg.top_k, dim=-1).indices
        # one-hot by comparison (no scatter): [B, S, k, E] summed over k
        experts = torch.arange(cfg.num_experts, device=x.device)
        mask = (indices.unsqueeze(-1) == experts).to(x.dtype).sum(dim=-2)
        weights = weights * mask
        if cfg.expert_weighting_normalization:
            denom = weights.sum(dim=-1, keepdim=True)
            if cfg.null_expert_bias is not None and cfg.null_expert_bias > 0:
                denom = denom + cfg.null_expert_bias
            weights = weights / denom
        return self.experts(x, weights), routing_fp32, mask.float()


class _Experts(nn.Module):
    """SparseActFeedForwardNetwork's parameters (``experts.<i>.<layer>``, ``shared_experts.<j>``), computed
    densely: shared experts' outputs plus each routed expert's output times its weight."""

    def __init__(self, cfg: MoEConfig, hidden_size: int, filter_size: int, activation: str, dropout: float,
                 bias: bool, initializer: dict, output_initializer: dict) -> None:
        super().__init__()
        self.experts = nn.ModuleList()
        for _ in range(cfg.num_experts):
            layers = nn.ModuleList([SingleFeedForwardLayer(hidden_size, filter_size, bias, activation),
                                    SingleFeedForwardLayer(filter_size, hidden_size, bias, None, dropout)])
            with torch.no_grad():
                for i, layer in enumerate(layers):
                    init = make_initializer(output_initializer if i == len(layers) - 1 else initializer)
                    for linear in (layer.linear_layer, layer.linear_layer_for_glu):
                        if linear is not None:
                            init(linear.weight)
                            if linear.bias is not None:
                                linear.bias.zero_()
            self.experts.append(layers)
        self.shared_experts = nn.ModuleList([
            FeedForwardNetwork(hidden_size, filter_size, activation, dropout, bias, initializer, output_initializer)
            for _ in range(cfg.num_shared_experts or 0)])

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for expert in self.shared_experts:
            out = out + expert(x)
        for i, expert in enumerate(self.experts):
            y = x
            for layer in expert:
                y = layer(y)
            out = out + y * weights[..., i:i + 1]
        return out


def load_balancing_loss(routing: list[tuple[torch.Tensor, torch.Tensor]], num_experts: int,
                        attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """LoadBalancingLoss: per sequence, the fraction of (unmasked) tokens routed to each expert times the
    mean routing probability of that expert, each averaged over layers; ``num_experts**2`` times the mean
    of that product over sequences and experts."""
    tokens = torch.zeros_like(routing[0][0][:, 0, :])
    probs = torch.zeros_like(tokens)
    for weights, mask in routing:
        if attention_mask is None:
            tokens = tokens + mask.mean(dim=1)
            probs = probs + weights.mean(dim=1)
        else:
            m = attention_mask[:, :, None].to(weights.dtype).broadcast_to(mask.shape)
            count = m.sum(dim=1)
            tokens = tokens + (mask * m).sum(dim=1) / count
            probs = probs + (weights * m).sum(dim=1) / count
    tokens = tokens / len(routing)
    probs = probs / len(routing)
    return num_experts ** 2 * torch.mean(probs * tokens)
