"""Accuracy and mean per-class accuracy, Model Zoo semantics."""

from __future__ import annotations

import torch

from cs_run.metrics._utils import (
    PredictionsMetric,
    check_num_classes,
    count_tokens,
    divide_no_nan,
)
from cs_run.metrics.metric import STATE_DTYPE

__all__ = ["AccuracyMetric", "MeanPerClassAccuracyMetric"]


class AccuracyMetric(PredictionsMetric):
    """Fraction of correct predictions: ``sum(w * (labels == predictions)) / count(w > 0)``.

    Called as ``metric(labels=..., predictions=..., weights=None)`` with class indices (e.g.
    ``logits.argmax(-1)``). Without weights every element counts.

    Note:
        As in the vendor's Model Zoo, the denominator counts the elements with a positive weight,
        so weights act as a mask (a 0/1 mask gives the usual masked accuracy); non-binary weights
        scale the numerator only.
    """

    _reshape_predictions = True  # predictions with labels' element count but another shape take labels' shape

    def __init__(self, name: str | None, compute_on_system: bool = True) -> None:
        super().__init__(name, compute_on_system)
        self.register_state(
            "total_correct_predictions", torch.zeros((), dtype=STATE_DTYPE)
        )
        self.register_state("total_num_tokens", torch.zeros((), dtype=STATE_DTYPE))

    def _accumulate(self, labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> None:
        # without weights these are ones: multiplying by them and counting them is exact (float64)
        correct = (labels == predictions).reshape(-1).to(STATE_DTYPE) * weights
        self.total_correct_predictions.add_(correct.sum())
        self.total_num_tokens.add_(count_tokens(labels, weights))

    def compute(self) -> torch.Tensor:
        """Accuracy so far (NaN before any update)."""
        return self.total_correct_predictions / self.total_num_tokens


class MeanPerClassAccuracyMetric(PredictionsMetric):
    """Mean over all ``num_classes`` of the per-class accuracy (the recall of each class).

    ``per_class[c] = sum(w * correct, label == c) / sum(w, label == c)``; weights scale both sums
    (0 masks an element).

    Note:
        As in the vendor's Model Zoo, a class that never occurs in the labels contributes 0 to the
        mean (scikit-learn's ``balanced_accuracy_score`` leaves it out instead).
    """

    def __init__(self, num_classes: int, name: str | None = None) -> None:
        num_classes = check_num_classes(
            "MeanPerClassAccuracyMetric", num_classes, minimum=1
        )
        super().__init__(name)
        self.num_classes = num_classes
        self.register_state(
            "total_per_class_correct_predictions",
            torch.zeros(num_classes, dtype=STATE_DTYPE),
        )
        self.register_state(
            "total_per_class_tokens", torch.zeros(num_classes, dtype=STATE_DTYPE)
        )

    def _accumulate(self, labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> None:
        """One batch of class indices (any shape; flattened)."""
        flat_labels = labels.reshape(-1).long()
        correct = (flat_labels == predictions.reshape(-1).long()).to(STATE_DTYPE) * weights
        self.total_per_class_correct_predictions.scatter_add_(0, flat_labels, correct)
        self.total_per_class_tokens.scatter_add_(0, flat_labels, weights)

    def compute(self) -> torch.Tensor:
        return divide_no_nan(
            self.total_per_class_correct_predictions, self.total_per_class_tokens
        ).mean()
