"""dino's losses, as the Model Zoo 2.10 generic image encoders' ``losses/`` compute them:

* DinoDistillationLoss: cross entropy of the centred, sharpened teacher softmax over the global views against
  the student's log-softmax over every view (global pairs of the same view skipped), averaged over the pairs;
  then the center moves toward the teacher's batch mean (``center_momentum``);
* iBOTPatchLoss: the same per patch token of the global views, counted only where the student's patch was
  masked, each image's sum divided by its masked-patch count, summed and divided by batch x views;
* KoLeoLoss: minus the mean log distance of each L2-normalised cls token to its nearest neighbour in the batch.

The teacher temperature follows the vendor's schedulers (``utils/scheduler.py``) of each loss's own ``step``
buffer, which counts its forward passes; ``center`` and ``step`` are checkpointed buffers, as the vendor's.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from cs_run.models.dino.config import TempLossConfig

__all__ = ["teacher_temperature", "DinoDistillationLoss", "iBOTPatchLoss", "KoLeoLoss"]


def teacher_temperature(cfg: TempLossConfig, step: torch.Tensor) -> torch.Tensor:
    """The vendor's LinearWarmupConstantScheduler / LinearWarmupCosineDecayScheduler (no freeze steps) at
    ``step``: a linear warmup from ``warmup_teacher_temp`` reaching ``teacher_temp`` at step warmup - 1, then
    the constant, or a cosine from ``teacher_temp`` to ``teacher_temp`` (the same constant, as configured)."""
    start, base, warmup = cfg.warmup_teacher_temp, cfg.teacher_temp, cfg.warmup_teacher_temp_steps
    step = step.to(torch.float32)
    warm = start + (base - start) / (warmup - 1) * step if warmup > 1 else torch.full_like(step, start)
    if cfg.teacher_temp_scheduler == "linear_constant":
        return torch.where(step < warmup, warm, torch.full_like(step, base))
    cosine = base + 0.5 * (base - base) * (1 + torch.cos(math.pi * (step - warmup) / (cfg.total_steps - warmup)))
    return torch.where(step < warmup, warm, cosine)


class DinoDistillationLoss(nn.Module):
    def __init__(self, cfg: TempLossConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.student_temp = cfg.student_temp
        self.center_momentum = cfg.center_momentum
        self.register_buffer("center", torch.zeros(cfg.input_size))
        self.register_buffer("step", torch.zeros(1, dtype=torch.int32))

    def forward(self, student_global_output: torch.Tensor, teacher_global_output: torch.Tensor,
                student_local_output: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Outputs ``[batch, views, input_size]``; the loss averaged over the (teacher, student) view pairs."""
        temp = teacher_temperature(self.cfg, self.step)
        teacher = F.softmax((teacher_global_output - self.center) / temp, dim=-1).detach()
        total, terms = self._crops(student_global_output, teacher, skip_same=True)
        if student_local_output is not None:
            local, n = self._crops(student_local_output, teacher, skip_same=False)
            total, terms = total + local, terms + n
        with torch.no_grad():
            batch_center = teacher_global_output.mean(dim=(0, 1))
            self.center.copy_(self.center * self.center_momentum + batch_center * (1 - self.center_momentum))
            self.step.add_(1)
        return total / terms

    def _crops(self, student: torch.Tensor, teacher: torch.Tensor, skip_same: bool):
        log_p = F.log_softmax(student / self.student_temp, dim=-1)
        total, terms = 0.0, 0
        for t in range(teacher.shape[1]):
            for s in range(student.shape[1]):
                if skip_same and s == t:  # the student and teacher saw the same view
                    continue
                total = total + torch.sum(-teacher[:, t] * log_p[:, s], dim=-1).mean()
                terms += 1
        return total, terms


class iBOTPatchLoss(nn.Module):  # noqa: N801 - the vendor's class name
    def __init__(self, cfg: TempLossConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.student_temp = cfg.student_temp
        self.center_momentum = cfg.center_momentum
        self.no_slice = cfg.no_slice
        self.register_buffer("center", torch.zeros(cfg.input_size))
        self.register_buffer("step", torch.zeros(1, dtype=torch.int32))

    def forward(self, teacher_global_output: torch.Tensor, student_global_output: torch.Tensor,
                student_masks: torch.Tensor) -> torch.Tensor:
        """Outputs ``[batch, views, tokens, input_size]`` (the cls token first unless ``no_slice``), masks
        ``[batch, views, patches]``; the vendor's argument order (teacher first)."""
        masks = student_masks.to(student_global_output.dtype)
        if not self.no_slice:  # the trunk's outputs hold the cls token first
            student_global_output, teacher_global_output = student_global_output[:, :, 1:], teacher_global_output[:, :, 1:]
        else:
            masks = torch.cat([masks.new_zeros(*masks.shape[:2], 1), masks], dim=2)
        b, n = masks.shape[:2]
        student = student_global_output.reshape(b, -1, student_global_output.shape[-1]) / self.student_temp
        teacher = teacher_global_output.reshape(b, -1, teacher_global_output.shape[-1])
        temp = teacher_temperature(self.cfg, self.step)
        with torch.no_grad():  # the centred, sharpened teacher in float32, back in its dtype
            q = F.softmax(((teacher - self.center) / temp).float(), dim=-1).to(teacher.dtype)
        log_p = F.log_softmax(student.float(), dim=-1)
        flat = masks.reshape(b, -1)
        per_patch = torch.sum(-q * log_p, dim=-1) * flat
        weight = masks.sum(dim=-1, keepdim=True).clamp(min=1).expand(masks.shape).reshape(b, -1)
        loss = torch.sum(per_patch / weight) / (b * n)
        with torch.no_grad():
            batch_center = torch.sum(teacher * flat.to(teacher.dtype).unsqueeze(-1), dim=(0, 1)) / flat.sum()
            self.center.copy_(self.center * self.center_momentum + batch_center * (1 - self.center_momentum))
            self.step.add_(1)
        return loss


class KoLeoLoss(nn.Module):
    def forward(self, student_global_cls_tokens: torch.Tensor) -> torch.Tensor:
        """``[batch, views, hidden]``: per view, -mean log distance to the nearest other sample."""
        if student_global_cls_tokens.shape[0] < 2:
            raise ValueError("KoLeoLoss requires batch_size >= 2")
        eps = 1e-8
        x = student_global_cls_tokens
        x = x / torch.sqrt(torch.sum(x * x, dim=-1, keepdim=True) + eps)
        eye = torch.eye(x.shape[0], dtype=torch.bool, device=x.device)
        loss = 0.0
        for v in range(x.shape[1]):
            out = x[:, v]
            dots = torch.where(eye, torch.full_like(eye, -1, dtype=out.dtype), out @ out.T)
            nearest = out[dots.argmax(dim=1)]
            loss = loss - torch.log((out - nearest).norm(p=2, dim=-1) + eps).mean()
        return loss
