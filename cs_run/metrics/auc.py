"""ROC AUC over a fixed grid of thresholds (TF/Model Zoo ``auc`` semantics), trace-safe."""

from __future__ import annotations

import torch

from cs_run.metrics._utils import check_int, check_same_shape, divide_no_nan, flat_weights
from cs_run.metrics.metric import STATE_DTYPE, Metric

__all__ = ["AUCMetric"]

_EPSILON = 1e-7


class AUCMetric(Metric):
    """Approximate area under the ROC curve, from confusion counts at ``num_thresholds`` thresholds.

    Thresholds are ``[-eps, 1/(n-1), 2/(n-1), ..., (n-2)/(n-1), 1+eps]`` and an element counts as
    predicted positive at threshold t when ``prediction > t``; the curve is integrated with the
    trapezoidal rule ("interpolation"). ``labels`` are 0/1 (any nonzero is positive),
    ``predictions`` probabilities in [0, 1], ``weights`` scale each element (0 masks it).

    The state is two histograms of the predictions (positives, negatives) over the threshold
    buckets, from which every threshold's tp/fp/tn/fn follow by a cumulative sum; this is the same
    information as per-threshold counts in O(num_thresholds) memory and one ``bucketize`` per batch.

    Note:
        The rates are ``tp / (tp + fn)`` and ``fp / (fp + tn)`` (0 when undefined), without the
        1e-6 smoothing of TF 1.x, so on predictions that do not fall between two thresholds of
        the same bucket the value equals scikit-learn's ``roc_auc_score`` exactly.
    """

    def __init__(
        self, num_thresholds: int = 200, curve: str = "ROC", name: str | None = None
    ) -> None:
        check_int("AUCMetric", "num_thresholds", num_thresholds, 2)
        if curve != "ROC":
            raise ValueError(
                f"AUCMetric: curve must be 'ROC' (the only curve implemented), got {curve!r}"
            )
        super().__init__(name)
        self.num_thresholds = num_thresholds
        self.curve = curve
        self.register_state(
            "positive_histogram", torch.zeros(num_thresholds + 1, dtype=STATE_DTYPE)
        )
        self.register_state(
            "negative_histogram", torch.zeros(num_thresholds + 1, dtype=STATE_DTYPE)
        )

    def thresholds(self, device: torch.device | None = None) -> torch.Tensor:
        """The threshold grid (float64)."""
        n = self.num_thresholds
        inner = [(i + 1) / (n - 1) for i in range(n - 2)]
        return torch.tensor(
            [-_EPSILON, *inner, 1.0 + _EPSILON], dtype=STATE_DTYPE, device=device
        )

    def update(
        self,
        labels: torch.Tensor,
        predictions: torch.Tensor,
        weights: torch.Tensor | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Accumulates one batch of 0/1 labels and probabilities (same shape)."""
        check_same_shape("AUCMetric", labels, predictions)
        self._to_device_of(labels)
        w = flat_weights("AUCMetric", labels, weights)
        # bucket b = number of thresholds strictly below the prediction
        bucket = torch.bucketize(
            predictions.reshape(-1).to(STATE_DTYPE), self.thresholds(labels.device)
        )
        positive = (labels.reshape(-1) != 0).to(STATE_DTYPE)
        self.positive_histogram.scatter_add_(0, bucket, w * positive)
        self.negative_histogram.scatter_add_(0, bucket, w * (1 - positive))

    def confusion_at_thresholds(
        self,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tp, fp, tn, fn), one value per threshold."""
        # prediction > thresholds[i]  <=>  bucket > i: sum the histogram over buckets i+1..n
        tp = self.positive_histogram.flip(0).cumsum(0).flip(0)[1:]
        fp = self.negative_histogram.flip(0).cumsum(0).flip(0)[1:]
        return (
            tp,
            fp,
            self.negative_histogram.sum() - fp,
            self.positive_histogram.sum() - tp,
        )

    def compute(self) -> torch.Tensor:
        tp, fp, tn, fn = self.confusion_at_thresholds()
        tpr, fpr = divide_no_nan(tp, tp + fn), divide_no_nan(fp, fp + tn)
        return ((fpr[:-1] - fpr[1:]) * (tpr[:-1] + tpr[1:]) / 2).sum()
