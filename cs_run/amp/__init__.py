"""Mixed precision and loss scaling (``cstorch.amp``): GradScaler, optimizer_step, autocast."""

from cs_run.amp.grad_scaler import GradScaler as GradScaler
from cs_run.amp.optimizer_step import optimizer_step as optimizer_step
from cs_run.amp.precision import autocast as autocast
from cs_run.amp.precision import build_grad_scaler as build_grad_scaler
from cs_run.amp.precision import resolve_mixed_precision as resolve_mixed_precision
from cs_run.amp.state import enable_mixed_precision as enable_mixed_precision
from cs_run.amp.state import get_floating_point_dtype as get_floating_point_dtype
from cs_run.amp.state import get_floating_point_dtype_str as get_floating_point_dtype_str
from cs_run.amp.state import get_half_dtype as get_half_dtype
from cs_run.amp.state import get_half_dtype_str as get_half_dtype_str
from cs_run.amp.state import mixed_precision as mixed_precision
from cs_run.amp.state import set_half_dtype as set_half_dtype

__all__ = [
    "GradScaler",
    "autocast",
    "build_grad_scaler",
    "enable_mixed_precision",
    "get_floating_point_dtype",
    "get_floating_point_dtype_str",
    "get_half_dtype",
    "get_half_dtype_str",
    "mixed_precision",
    "optimizer_step",
    "resolve_mixed_precision",
    "set_half_dtype",
]
