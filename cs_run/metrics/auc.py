"""ROC and PR AUC over a fixed grid of thresholds (TF / Model Zoo / vendor ``AUCMetric`` semantics), trace-safe."""

from __future__ import annotations

import torch

from cs_run.metrics._utils import PredictionsMetric, check_int, divide_no_nan
from cs_run.metrics.metric import STATE_DTYPE

__all__ = ["AUCMetric"]

_EPSILON = 1e-7


class AUCMetric(PredictionsMetric):
    """Approximate area under the ROC (default) or precision-recall curve, from confusion counts at
    a grid of thresholds (TF / Model Zoo / the vendor's ``AUCMetric`` semantics), trace-safe.

    Thresholds are ``[-eps, 1/(n-1), 2/(n-1), ..., (n-2)/(n-1), 1+eps]`` (or ``[-eps, *sorted(thresholds),
    1+eps]``) and an element counts as predicted positive at threshold t when ``prediction > t``.
    ``labels`` are 0/1 (any nonzero is positive), ``predictions`` probabilities in [0, 1], ``weights``
    scale each element (0 masks it).

    ``summation_method``: 'interpolation' is the trapezoidal rule for ROC and, for PR, Davis &
    Goadrich's interpolation (true and false positives vary linearly between thresholds, precision
    does not); 'minoring' / 'majoring' use the lower / upper of the two heights of each interval.

    The state is two histograms of the predictions (positives, negatives) over the threshold
    buckets, from which every threshold's tp/fp/tn/fn follow by a cumulative sum; this is the same
    information as per-threshold counts in O(num_thresholds) memory and one ``bucketize`` per batch.

    Note:
        The rates are ``tp / (tp + fn)`` and ``fp / (fp + tn)`` (0 when undefined), without the
        1e-6 smoothing of TF 1.x, so on predictions that do not fall between two thresholds of
        the same bucket the ROC value equals scikit-learn's ``roc_auc_score`` exactly. Values agree
        with the vendor's to its float32 round-off (tests/metrics/test_auc_vendor.py).
    """

    _CURVES = ("ROC", "PR")
    _SUMMATIONS = ("interpolation", "minoring", "majoring")

    def __init__(
        self,
        num_thresholds: int = 200,
        curve: str = "ROC",
        name: str | None = None,
        summation_method: str = "interpolation",
        thresholds: list[float] | None = None,
    ) -> None:
        if curve not in self._CURVES:
            raise ValueError(f"AUCMetric: curve must be 'ROC' or 'PR', got {curve!r}")
        if summation_method not in self._SUMMATIONS:
            raise ValueError(
                f"AUCMetric: summation_method must be one of {', '.join(self._SUMMATIONS)}, got {summation_method!r}"
            )
        if thresholds is not None:
            inner = sorted(float(t) for t in thresholds)
            num_thresholds = len(inner) + 2
        else:
            check_int("AUCMetric", "num_thresholds", num_thresholds, 2)
            inner = [(i + 1) / (num_thresholds - 1) for i in range(num_thresholds - 2)]
        super().__init__(name)
        self.num_thresholds = num_thresholds
        self.curve = curve
        self.summation_method = summation_method
        self._inner = inner
        self.register_state(
            "positive_histogram", torch.zeros(num_thresholds + 1, dtype=STATE_DTYPE)
        )
        self.register_state(
            "negative_histogram", torch.zeros(num_thresholds + 1, dtype=STATE_DTYPE)
        )

    def thresholds(self, device: torch.device | None = None) -> torch.Tensor:
        """The threshold grid (float64)."""
        return torch.tensor(
            [-_EPSILON, *self._inner, 1.0 + _EPSILON], dtype=STATE_DTYPE, device=device
        )

    def _accumulate(self, labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> None:
        """One batch of 0/1 labels and probabilities (same shape)."""
        # bucket b = number of thresholds strictly below the prediction
        bucket = torch.bucketize(
            predictions.reshape(-1).to(STATE_DTYPE), self.thresholds(labels.device)
        )
        positive = (labels.reshape(-1) != 0).to(STATE_DTYPE)
        self.positive_histogram.scatter_add_(0, bucket, weights * positive)
        self.negative_histogram.scatter_add_(0, bucket, weights * (1 - positive))

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
        if self.curve == "PR" and self.summation_method == "interpolation":
            return _interpolated_pr_auc(tp, fp, fn)
        recall = divide_no_nan(tp, tp + fn)
        if self.curve == "ROC":
            x, y = divide_no_nan(fp, fp + tn), recall
        else:
            x, y = recall, divide_no_nan(tp, tp + fp)
        if self.summation_method == "interpolation":
            heights = (y[:-1] + y[1:]) / 2
        elif self.summation_method == "minoring":
            heights = torch.minimum(y[:-1], y[1:])
        else:
            heights = torch.maximum(y[:-1], y[1:])
        return ((x[:-1] - x[1:]) * heights).sum()


def _interpolated_pr_auc(tp: torch.Tensor, fp: torch.Tensor, fn: torch.Tensor) -> torch.Tensor:
    """PR-AUC with Davis & Goadrich's interpolation, summed over the threshold intervals [A, B].

    Within an interval, tp and p = tp + fp vary linearly, so precision = (tp_A + s (p - p_A)) / p with
    slope s = dtp / dp; its integral over recall is ``s (dtp + c log(p_A / p_B)) / (tp_B + fn_B)`` with
    intercept ``c = tp_B - s p_B`` (the log term is dropped where either p is 0).
    """
    dtp = tp[:-1] - tp[1:]
    p = tp + fp
    dp = p[:-1] - p[1:]
    slope = divide_no_nan(dtp, torch.clamp(dp, min=0))
    intercept = tp[1:] - slope * p[1:]
    both_positive = (p[:-1] > 0) & (p[1:] > 0)
    ratio = torch.where(both_positive, divide_no_nan(p[:-1], torch.clamp(p[1:], min=0)), torch.ones_like(dp))
    area = divide_no_nan(slope * (dtp + intercept * torch.log(ratio)), torch.clamp(tp[1:] + fn[1:], min=0))
    return area.sum()
