"""Metrics computed from a weighted confusion matrix: F-beta, mean IOU, Dice (Model Zoo semantics).

The matrix (rows = labels, columns = predictions) is the only state; ignored classes are a Python
constant applied in ``compute``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from cs_run.metrics._utils import (
    PredictionsMetric,
    check_num_classes,
    class_mask,
    confusion_matrix,
    divide_no_nan,
)
from cs_run.metrics.metric import STATE_DTYPE

__all__ = ["DiceCoefficientMetric", "FBetaScoreMetric", "MeanIOUMetric"]


class _ConfusionMatrixMetric(PredictionsMetric):
    """Accumulates ``confusion_matrix[label, prediction] += weight``."""

    def __init__(
        self, num_classes: int, ignore_classes: Iterable[int] | None = None, name: str | None = None
    ) -> None:
        metric = type(self).__name__
        num_classes = check_num_classes(metric, num_classes)
        keep = class_mask(metric, num_classes, ignore_classes)
        super().__init__(name)
        self.num_classes = num_classes
        self._keep = keep
        self.register_state(
            "confusion_matrix", torch.zeros(num_classes, num_classes, dtype=STATE_DTYPE)
        )

    def _accumulate(self, labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> None:
        """One batch of class indices."""
        self.confusion_matrix.add_(confusion_matrix(labels, predictions, self.num_classes, weights))

    def _parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(true positives, predicted per class, actual per class, keep mask) as float64 vectors."""
        cm = self.confusion_matrix
        mask = torch.tensor(self._keep, dtype=STATE_DTYPE, device=cm.device)
        return torch.diagonal(cm), cm.sum(dim=0), cm.sum(dim=1), mask


class FBetaScoreMetric(_ConfusionMatrixMetric):
    """F-beta = (1 + beta^2) * precision * recall / (beta^2 * precision + recall).

    Args:
        num_classes: Number of classes (>= 2).
        beta: Weight of recall relative to precision (> 0).
        average_type: "micro" (default): pool the counts of all kept classes; "macro": the plain
            mean of the per-class scores over the kept classes (0 for a class with no support).
        ignore_labels: Class indices left out of the score.
        name: Metric name (default: the class name).
    """

    def __init__(
        self,
        num_classes: int,
        beta: float = 1.0,
        average_type: str = "micro",
        ignore_labels: Iterable[int] | None = None,
        name: str | None = None,
    ) -> None:
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta > 0:
            raise ValueError(
                f"FBetaScoreMetric: beta must be a positive number, got {beta!r}"
            )
        if average_type not in ("micro", "macro"):
            raise ValueError(
                f"FBetaScoreMetric: average_type must be one of micro, macro; got {average_type!r}"
            )
        super().__init__(num_classes, ignore_labels, name)
        self.beta = float(beta)
        self.average_type = average_type

    def compute(self) -> torch.Tensor:
        tp, predicted, actual, mask = self._parts()
        b2 = self.beta**2
        if self.average_type == "micro":
            precision = divide_no_nan((tp * mask).sum(), (predicted * mask).sum())
            recall = divide_no_nan((tp * mask).sum(), (actual * mask).sum())
            return divide_no_nan((1 + b2) * precision * recall, b2 * precision + recall)
        precision = divide_no_nan(tp, predicted)
        recall = divide_no_nan(tp, actual)
        fbeta = divide_no_nan((1 + b2) * precision * recall, b2 * precision + recall)
        return (fbeta * mask).sum() / mask.sum()


class MeanIOUMetric(_ConfusionMatrixMetric):
    """Mean over classes of IOU = tp / (tp + fp + fn).

    The mean runs over the kept classes that occur in the labels or the predictions; 0 when none do.

    Args:
        num_classes: Number of classes (>= 2).
        ignore_classes: Class indices left out of the mean.
        name: Metric name (default: the class name).
    """

    def compute(self) -> torch.Tensor:
        tp, predicted, actual, mask = self._parts()
        return _masked_mean_ratio(tp * mask, (predicted + actual - tp) * mask)


class DiceCoefficientMetric(_ConfusionMatrixMetric):
    """Mean over classes of Dice = 2 tp / (2 tp + fp + fn) (the per-class F1).

    The mean runs over the kept classes that occur in the labels or the predictions; 0 when none do.

    Args:
        num_classes: Number of classes (>= 2).
        ignore_classes: Class indices left out of the mean.
        name: Metric name (default: the class name).
    """

    def compute(self) -> torch.Tensor:
        tp, predicted, actual, mask = self._parts()
        return _masked_mean_ratio(2 * tp * mask, (predicted + actual) * mask)


def _masked_mean_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """Mean of num/den over the entries with den != 0; 0 when there are none."""
    valid = (den != 0).to(num.dtype).sum()
    total = divide_no_nan(num, den).sum()
    return divide_no_nan(total, valid)
