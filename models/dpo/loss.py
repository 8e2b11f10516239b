"""The Model Zoo's DPO loss (Release 2.10 ``losses/DPOLoss.py``), its four loss types.

With the policy's and the reference's summed log-probabilities of the chosen (``pc``, ``rc``) and rejected
(``pr``, ``rr``) answers, ``logits = (pc - pr) - (rc - rr)`` (``rc - rr`` is 0 when ``reference_free``), and
the batch mean of:

* ``sigmoid``: ``-logsigmoid(beta * logits)`` (Rafailov et al. 2023)
* ``hinge``: ``relu(1 - beta * logits)`` (SLiC)
* ``ipo``: ``(logits - 1 / (2 * beta)) ** 2`` (Azar et al. 2023; the model averages the log-probs over the
  answer's tokens for it)
* ``dpop``: ``-logsigmoid(beta * (logits - dpop_penalty_weight * max(0, rc - pc)))`` (Pal et al. 2024)
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DPOLoss", "DPOLossType", "LOSS_TYPES"]

DPOLossType = Literal["sigmoid", "hinge", "ipo", "dpop"]
LOSS_TYPES = ("sigmoid", "hinge", "ipo", "dpop")


class DPOLoss(nn.Module):
    """``forward(pc, pr, rc, rr) -> scalar``: the formulas above, averaged over the batch."""

    def __init__(self, beta: float = 0.1, loss_type: DPOLossType = "sigmoid", reference_free: bool = False,
                 dpop_penalty_weight: float = 5.0) -> None:
        super().__init__()
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"dpo.loss_type: unknown {loss_type!r}; expected one of {', '.join(LOSS_TYPES)}")
        if loss_type == "dpop" and reference_free:
            raise ValueError("dpo.loss_type: dpop penalizes the policy falling below the reference; it needs "
                             "reference_free: false")
        self.beta, self.loss_type = beta, loss_type
        self.reference_free, self.dpop_penalty_weight = reference_free, dpop_penalty_weight

    def forward(self, policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
                reference_chosen_logps: Optional[torch.Tensor],
                reference_rejected_logps: Optional[torch.Tensor]) -> torch.Tensor:
        logits = policy_chosen_logps - policy_rejected_logps
        if not self.reference_free:
            logits = logits - (reference_chosen_logps - reference_rejected_logps)
        if self.loss_type == "sigmoid":
            losses = -F.logsigmoid(self.beta * logits)
        elif self.loss_type == "hinge":
            losses = torch.relu(1 - self.beta * logits)
        elif self.loss_type == "ipo":
            losses = torch.pow(logits - 1 / (2 * self.beta), 2.0)
        else:  # dpop
            penalty = torch.clamp(reference_chosen_logps - policy_chosen_logps, min=0.0)
            losses = -F.logsigmoid(self.beta * (logits - self.dpop_penalty_weight * penalty))
        return losses.mean()
