"""Accuracy, Model Zoo semantics."""

from __future__ import annotations

import torch

from cs_run.metrics._utils import match_shapes
from cs_run.metrics.metric import STATE_DTYPE, Metric

__all__ = ["AccuracyMetric"]


class AccuracyMetric(Metric):
    """Fraction of correct predictions: ``sum(w * (labels == predictions)) / count(w > 0)``.

    Called as ``metric(labels=..., predictions=..., weights=None)`` with class indices (e.g.
    ``logits.argmax(-1)``). Without weights every element counts.

    Note:
        As in the vendor's Model Zoo, the denominator counts the elements with a positive weight,
        so weights act as a mask (a 0/1 mask gives the usual masked accuracy); non-binary weights
        scale the numerator only.
    """

    def __init__(self, name: str, compute_on_system: bool = True) -> None:
        super().__init__(name, compute_on_system)
        self.register_state(
            "total_correct_predictions", torch.zeros((), dtype=STATE_DTYPE)
        )
        self.register_state("total_num_tokens", torch.zeros((), dtype=STATE_DTYPE))

    def update(
        self,
        labels: torch.Tensor,
        predictions: torch.Tensor,
        weights: torch.Tensor | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Accumulates one batch. ``dtype`` is accepted for vendor compatibility and ignored."""
        predictions = match_shapes("AccuracyMetric", labels, predictions)
        self._to_device_of(labels)
        correct = (labels == predictions).to(STATE_DTYPE)
        if weights is None:
            num_tokens = torch.full(
                (), labels.numel(), dtype=STATE_DTYPE, device=labels.device
            )
        else:
            if weights.numel() != labels.numel():
                raise ValueError(
                    f"AccuracyMetric: weights {tuple(weights.shape)} must have as many elements as "
                    f"labels {tuple(labels.shape)}"
                )
            weights = weights.reshape(labels.shape).to(STATE_DTYPE)
            correct = correct * weights
            num_tokens = (weights > 0).to(STATE_DTYPE).sum()
        self.total_correct_predictions.add_(correct.sum())
        self.total_num_tokens.add_(num_tokens)

    def compute(self) -> torch.Tensor:
        """Accuracy so far (NaN before any update)."""
        return self.total_correct_predictions / self.total_num_tokens
