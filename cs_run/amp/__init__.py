"""Mixed precision and loss scaling (``cstorch.amp``): GradScaler, optimizer_step, autocast."""

from cs_run.amp.grad_scaler import GradScaler as GradScaler
from cs_run.amp.optimizer_step import optimizer_step as optimizer_step
from cs_run.amp.precision import autocast as autocast
from cs_run.amp.precision import build_grad_scaler as build_grad_scaler
from cs_run.amp.precision import resolve_mixed_precision as resolve_mixed_precision

__all__ = [
    "GradScaler",
    "autocast",
    "build_grad_scaler",
    "optimizer_step",
    "resolve_mixed_precision",
]
