"""Perplexity and (weighted) mean, Model Zoo semantics."""

from __future__ import annotations

import torch

from cs_run.metrics._utils import count_tokens, flat_weights
from cs_run.metrics.metric import STATE_DTYPE, Metric

__all__ = ["MeanMetric", "PerplexityMetric"]


class PerplexityMetric(Metric):
    """``exp(total_loss / num_tokens)`` over the whole eval.

    Called as ``metric(labels=..., loss=..., weights=None)`` where ``loss`` is the **summed** loss
    of the batch (e.g. ``cross_entropy(..., reduction="sum")`` over the unmasked tokens) and
    ``num_tokens`` counts the labels with a positive weight (all labels when no weights are given).
    """

    def __init__(self, name: str | None, compute_on_system: bool = True) -> None:
        super().__init__(name, compute_on_system)
        self.register_state("total_loss", torch.zeros((), dtype=STATE_DTYPE))
        self.register_state("total_num_tokens", torch.zeros((), dtype=STATE_DTYPE))

    def update(
        self,
        labels: torch.Tensor,
        loss: torch.Tensor,
        weights: torch.Tensor | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Accumulates one batch; ``dtype`` is accepted for vendor compatibility and ignored."""
        self._to_device_of(labels)
        if loss.numel() != 1:
            raise ValueError(
                f"PerplexityMetric: loss must be the batch's summed loss (one value), got shape {tuple(loss.shape)}"
            )
        flat = None if weights is None else flat_weights("PerplexityMetric", labels, weights)
        num_tokens = count_tokens(labels, flat)
        self.total_loss.add_(loss.detach().reshape(()).to(STATE_DTYPE))
        self.total_num_tokens.add_(num_tokens)

    def compute(self) -> torch.Tensor:
        return torch.exp(self.total_loss / self.total_num_tokens)


class MeanMetric(Metric):
    """Weighted mean of every value seen: ``sum(w * value) / sum(w)`` (``w`` = 1 when not given)."""

    def __init__(self, name: str | None, compute_on_system: bool = True) -> None:
        super().__init__(name, compute_on_system)
        self.register_state("total_value", torch.zeros((), dtype=STATE_DTYPE))
        self.register_state("total_weight", torch.zeros((), dtype=STATE_DTYPE))

    def update(self, values: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        """Accumulates a tensor of values (any shape) with optional same-size or scalar weights."""
        if not isinstance(values, torch.Tensor):
            values = torch.as_tensor(
                values, dtype=STATE_DTYPE, device=self.total_value.device
            )
        self._to_device_of(values)
        w = flat_weights("MeanMetric", values, weights)
        self.total_value.add_((values.detach().reshape(-1).to(STATE_DTYPE) * w).sum())
        self.total_weight.add_(w.sum())

    def compute(self) -> torch.Tensor:
        return self.total_value / self.total_weight
