"""Input checks and small tensor helpers shared by the metrics (trace-safe: shapes only)."""

from __future__ import annotations

import torch

from cs_run.metrics.metric import STATE_DTYPE


def match_shapes(
    metric: str, labels: torch.Tensor, predictions: torch.Tensor
) -> torch.Tensor:
    """Returns ``predictions`` with the shape of ``labels``; a different element count is an error."""
    if labels.shape == predictions.shape:
        return predictions
    if labels.numel() != predictions.numel():
        raise ValueError(
            f"{metric}: labels {tuple(labels.shape)} and predictions {tuple(predictions.shape)} must "
            "have the same shape (pass class indices, e.g. logits.argmax(-1), not logits)"
        )
    return predictions.reshape(labels.shape)


def weights_like(
    metric: str, labels: torch.Tensor, weights: torch.Tensor | None
) -> torch.Tensor:
    """``weights`` as a float64 tensor of ``labels``' shape (ones when None)."""
    if weights is None:
        return torch.ones(labels.shape, dtype=STATE_DTYPE, device=labels.device)
    if weights.numel() != labels.numel():
        raise ValueError(
            f"{metric}: weights {tuple(weights.shape)} must have as many elements as labels "
            f"{tuple(labels.shape)}"
        )
    return weights.reshape(labels.shape).to(STATE_DTYPE)
