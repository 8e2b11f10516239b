"""Precision@K and Recall@K for multi-label retrieval-style predictions, Model Zoo semantics."""

from __future__ import annotations

import torch

from cs_run.metrics._utils import check_int
from cs_run.metrics.metric import STATE_DTYPE, Metric

__all__ = ["PrecisionAtKMetric", "RecallAtKMetric"]


def _hits_per_row(
    metric: str, k: int, labels: torch.Tensor, predictions: torch.Tensor, weights
):
    """Number of a row's labels among its top-k predictions, and the per-row weights (float64)."""
    if (
        labels.dim() != 2
        or predictions.dim() != 2
        or labels.shape[0] != predictions.shape[0]
    ):
        raise ValueError(
            f"{metric}: labels must be (batch, num_labels) and predictions (batch, num_classes); got "
            f"{tuple(labels.shape)} and {tuple(predictions.shape)}"
        )
    if k > predictions.shape[-1]:
        raise ValueError(
            f"{metric}: k={k} is larger than the number of classes {predictions.shape[-1]}"
        )
    if (
        weights is not None
        and weights.dim() != 0
        and weights.numel() != labels.shape[0]
    ):
        raise ValueError(
            f"{metric}: weights must be a scalar or one value per row ({labels.shape[0]}), got {tuple(weights.shape)}"
        )
    topk = torch.topk(predictions, k, dim=-1).indices  # (batch, k)
    hits = (
        (labels.long().unsqueeze(-1) == topk.unsqueeze(1))
        .any(-1)
        .to(STATE_DTYPE)
        .sum(-1)
    )
    w = (
        torch.ones_like(hits)
        if weights is None
        else weights.reshape(-1).to(STATE_DTYPE).expand_as(hits)
    )
    return hits, w


class _AtKMetric(Metric):
    """tp@k against one kind of miss, weighted per row; a subclass names the miss and counts it."""

    miss_state: str  # the state holding the weighted misses

    def __init__(self, k: int, name: str | None = None) -> None:
        k = check_int(type(self).__name__, "k", k, 1)
        super().__init__(name)
        self.k = k
        self.register_state("true_positive_at_k", torch.zeros((), dtype=STATE_DTYPE))
        self.register_state(self.miss_state, torch.zeros((), dtype=STATE_DTYPE))

    def _misses(self, labels: torch.Tensor, hits: torch.Tensor) -> torch.Tensor:
        """Misses per row, given the row's hits."""
        raise NotImplementedError

    def update(
        self,
        labels: torch.Tensor,
        predictions: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> None:
        self._to_device_of(labels)
        hits, w = _hits_per_row(type(self).__name__, self.k, labels, predictions, weights)
        self.true_positive_at_k.add_((hits * w).sum())
        getattr(self, self.miss_state).add_((self._misses(labels, hits) * w).sum())

    def compute(self) -> torch.Tensor:
        return self.true_positive_at_k / (self.true_positive_at_k + getattr(self, self.miss_state))


class PrecisionAtKMetric(_AtKMetric):
    """Precision@K = tp@k / (tp@k + fp@k): the fraction of the top-k predictions that are labels.

    ``labels`` is (batch, num_labels) of relevant class indices, ``predictions`` (batch,
    num_classes) of scores; ``weights`` (scalar or one per row) scale each row's counts.
    """

    miss_state = "false_positive_at_k"

    def _misses(self, labels: torch.Tensor, hits: torch.Tensor) -> torch.Tensor:
        return self.k - hits  # top-k predictions that are not labels


class RecallAtKMetric(_AtKMetric):
    """Recall@K = tp@k / (tp@k + fn@k): the fraction of the labels found in the top-k predictions.

    Same inputs as :class:`PrecisionAtKMetric`; every row has ``num_labels`` relevant labels.
    """

    miss_state = "false_negative_at_k"

    def _misses(self, labels: torch.Tensor, hits: torch.Tensor) -> torch.Tensor:
        return labels.shape[-1] - hits  # labels that are not in the top-k
