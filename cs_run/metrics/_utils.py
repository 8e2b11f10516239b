"""Input checks and tensor helpers shared by the metrics (trace-safe: they look at shapes only)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from cs_run.metrics.metric import STATE_DTYPE, Metric


def check_same_shape(
    metric: str, labels: torch.Tensor, predictions: torch.Tensor
) -> None:
    """Raises ValueError unless labels and predictions have the same shape."""
    if labels.shape != predictions.shape:
        raise ValueError(
            f"{metric}: labels {tuple(labels.shape)} and predictions {tuple(predictions.shape)} must "
            "have the same shape (pass class indices, e.g. logits.argmax(-1), not logits)"
        )


def flat_weights(
    metric: str, labels: torch.Tensor, weights: torch.Tensor | None
) -> torch.Tensor:
    """``weights`` flattened to float64 (ones when None); a 0-d weight applies to every element."""
    if weights is None:
        return torch.ones(labels.numel(), dtype=STATE_DTYPE, device=labels.device)
    if weights.dim() == 0:
        return weights.to(STATE_DTYPE).expand(labels.numel())
    if weights.numel() != labels.numel():
        raise ValueError(
            f"{metric}: weights {tuple(weights.shape)} must be a scalar or have as many elements as "
            f"labels {tuple(labels.shape)}"
        )
    return weights.reshape(-1).to(STATE_DTYPE)


class PredictionsMetric(Metric):
    """A metric updated with ``labels``, ``predictions`` and optional ``weights`` (the vendor's call):
    :meth:`update` checks and flattens the inputs once for every such metric, then :meth:`_accumulate`."""

    _reshape_predictions = False
    """Reshape predictions with as many elements as the labels but another shape to theirs (accuracy's rule)."""

    def update(
        self,
        labels: torch.Tensor,
        predictions: torch.Tensor,
        weights: torch.Tensor | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Accumulates one batch: the shapes checked, the state moved to ``labels``' device and ``weights``
        flattened to float64 (:func:`flat_weights`; 0 masks an element). ``dtype`` is accepted for vendor
        compatibility and ignored. Errors name the metric's class."""
        metric = type(self).__name__
        if self._reshape_predictions and labels.shape != predictions.shape and labels.numel() == predictions.numel():
            predictions = predictions.reshape(labels.shape)
        check_same_shape(metric, labels, predictions)
        self._to_device_of(labels)
        self._accumulate(labels, predictions, flat_weights(metric, labels, weights))

    def _accumulate(self, labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> None:
        """Adds one checked batch to the state; ``weights`` is flat float64, one per element of ``labels``."""
        raise NotImplementedError


def count_tokens(labels: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """How many elements count: every one of ``labels`` without weights, else those with a positive
    (flat) weight, as the vendor's accuracy and perplexity count their denominators."""
    if weights is None:
        return torch.full((), labels.numel(), dtype=STATE_DTYPE, device=labels.device)
    return (weights > 0).to(STATE_DTYPE).sum()


def class_mask(
    metric: str, num_classes: int, ignore: Iterable[int] | None
) -> list[bool]:
    """Per-class keep flags (a Python list: it is a constant of the computation, not state)."""
    ignore = (
        []
        if ignore is None
        else ([ignore] if isinstance(ignore, int) else list(ignore))
    )
    bad = [c for c in ignore if not isinstance(c, int) or not 0 <= c < num_classes]
    if bad:
        raise ValueError(
            f"{metric}: ignored classes {bad} are not class indices in [0, {num_classes})"
        )
    keep = [c not in ignore for c in range(num_classes)]
    if not any(keep):
        raise ValueError(f"{metric}: every one of the {num_classes} classes is ignored")
    return keep


def check_int(metric: str, name: str, value: int, minimum: int) -> int:
    """``value`` if it is an int (not a bool) of at least ``minimum``, else the ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{metric}: {name} must be an int >= {minimum}, got {value!r}")
    return value


def check_num_classes(metric: str, num_classes: int, minimum: int = 2) -> int:
    return check_int(metric, "num_classes", num_classes, minimum)


def divide_no_nan(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den``, 0 where ``den`` is 0 (TF's divide_no_nan, as the vendor metrics use)."""
    safe = torch.where(den == 0, torch.ones_like(den), den)
    return torch.where(den == 0, torch.zeros_like(num), num / safe)


def confusion_matrix(
    labels: torch.Tensor,
    predictions: torch.Tensor,
    num_classes: int,
    weights: torch.Tensor,
) -> torch.Tensor:
    """Weighted ``num_classes x num_classes`` counts, rows = labels, columns = predictions.

    ``scatter_add_`` keeps the output shape fixed (``bincount`` would not under tracing).
    """
    index = labels.reshape(-1).long() * num_classes + predictions.reshape(-1).long()
    counts = torch.zeros(
        num_classes * num_classes, dtype=STATE_DTYPE, device=labels.device
    )
    counts.scatter_add_(0, index, weights)
    return counts.reshape(num_classes, num_classes)
