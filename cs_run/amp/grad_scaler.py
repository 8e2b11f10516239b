"""Static and dynamic loss scaling (``cstorch.amp.GradScaler``), trace-safe.

Everything that depends on a tensor value is a tensor op: the overflow check is a reduction of
``isfinite``, the step is skipped by selecting the old parameter and optimizer-state values with
``torch.where``, and the scale update is ``torch.where`` over the counters. No Python ``if`` reads a
tensor, so the whole sequence scale -> backward -> unscale_ -> step -> update traces once with
``make_fx`` and replays. The state is five 0-d buffers created in ``__init__`` (the class is a
``torch.nn.Module`` so the CSX engine discovers them like a model's buffers).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import torch

from cs_run.amp import _multi_tensor
from cs_run.errors import ParamsError

__all__ = ["GradScaler"]

logger = logging.getLogger(__name__)

# Vendor defaults for dynamic loss scaling.
DEFAULT_INIT_SCALE = 2.0**15
DEFAULT_STEPS_PER_INCREASE = 2000
DEFAULT_MIN_LOSS_SCALE = 2.0**-14
DEFAULT_MAX_LOSS_SCALE = 2.0**15
DEFAULT_OVERFLOW_TOLERANCE = 0.0  # the vendor's 2.10 default: halve on every overflow

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


def _scale_mode(loss_scale: str | float | None, init_scale: float | None) -> tuple[bool, bool, float]:
    """(dynamic, enabled, the initial scale) that a ``loss_scale`` argument asks for: 'dynamic' (from
    ``init_scale``), a fixed number, or None / 0 (no scaling)."""
    if isinstance(loss_scale, str):
        if loss_scale != "dynamic":
            raise ParamsError(
                f"GradScaler: invalid loss_scale: {loss_scale!r} (must be 'dynamic' or a number)"
            )
        return True, True, _positive("init_scale", DEFAULT_INIT_SCALE if init_scale is None else init_scale)
    if loss_scale is None or loss_scale == 0:
        return False, False, 1.0
    return False, True, _positive("loss_scale", loss_scale)


def _scale_bounds(min_loss_scale: float | None, max_loss_scale: float | None) -> tuple[float, float]:
    """The checked ``(min_loss_scale, max_loss_scale)``, the defaults where None."""
    low = _positive("min_loss_scale", DEFAULT_MIN_LOSS_SCALE if min_loss_scale is None else min_loss_scale)
    high = _positive("max_loss_scale", DEFAULT_MAX_LOSS_SCALE if max_loss_scale is None else max_loss_scale)
    if low > high:
        raise ParamsError(f"GradScaler: min_loss_scale {low} is larger than max_loss_scale {high}")
    return low, high


def _positive(name: str, value: Any, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ParamsError(
            f"GradScaler: invalid {name}: {value!r} (must be a finite number > 0)"
        )
    return float(value)


class GradScaler(torch.nn.Module):
    """Scales the loss so float16 gradients do not underflow, and skips steps whose gradients overflow.

    Usage is that of ``torch.amp.GradScaler``: ``scale(loss).backward()``, ``unscale_(optimizer)``
    (optional, before clipping), ``step(optimizer)``, ``update()``.

    Args:
        loss_scale: ``"dynamic"`` for dynamic loss scaling, a number > 0 for a static scale, or
            0.0 / None (the vendor default) for no scaling: ``scale`` returns the loss unchanged and
            ``step`` is a plain ``optimizer.step()``.
        init_scale: Initial scale for dynamic scaling (default 2**15).
        steps_per_increase: Number of consecutive overflow-free steps after which the dynamic scale
            doubles (default 2000).
        min_loss_scale: Lower bound of the dynamic scale (default 2**-14).
        max_loss_scale: Upper bound of the dynamic scale (default 2**15).
        overflow_tolerance: Largest fraction of steps with inf/NaN gradients, counted since the
            last change of the scale, that is tolerated before the scale is halved (default 0.0, the
            vendor's: halve on every overflow, like ``torch.amp.GradScaler``). A step with inf/NaN
            gradients is always skipped, tolerated or not.
        max_gradient_norm: Accepted for vendor compatibility. On the vendor stack it only applies to
            pipeline mode; cs-run clips in :func:`cs_run.amp.optimizer_step` instead, so it is stored
            and otherwise unused.

    Note:
        Skipping is exact: ``step`` snapshots the parameters and every tensor of the optimizer state,
        runs ``optimizer.step()``, and selects the snapshot back where the gradients overflowed. That
        costs one copy of the parameters and optimizer state per step. State that a ``torch.optim``
        optimizer creates lazily in the skipped step is zeroed instead (exact for Adam/AdamW, and for
        SGD without dampening); ``cs_run.optim`` optimizers create all state up front.
        A static scaler also skips steps with inf/NaN gradients, and its scale never changes.
    """

    def __init__(
        self,
        loss_scale: str | float | None = None,
        init_scale: float | None = None,
        steps_per_increase: int | None = None,
        min_loss_scale: float | None = None,
        max_loss_scale: float | None = None,
        overflow_tolerance: float = DEFAULT_OVERFLOW_TOLERANCE,
        max_gradient_norm: float | None = None,
    ) -> None:
        super().__init__()
        self.dynamic, self.enabled, scale = _scale_mode(loss_scale, init_scale)
        if steps_per_increase is None:
            steps_per_increase = DEFAULT_STEPS_PER_INCREASE
        if (
            isinstance(steps_per_increase, bool)
            or not isinstance(steps_per_increase, int)
            or steps_per_increase < 1
        ):
            raise ParamsError(
                f"GradScaler: invalid steps_per_increase: {steps_per_increase!r} (must be an int >= 1)"
            )
        self.steps_per_increase = steps_per_increase
        self.min_loss_scale, self.max_loss_scale = _scale_bounds(min_loss_scale, max_loss_scale)
        if self.dynamic and not self.min_loss_scale <= scale <= self.max_loss_scale:
            raise ParamsError(
                f"GradScaler: init_scale {scale} is outside [min_loss_scale, max_loss_scale] = "
                f"[{self.min_loss_scale}, {self.max_loss_scale}]"
            )
        if (
            not isinstance(overflow_tolerance, (int, float))
            or not 0.0 <= overflow_tolerance < 1.0
        ):
            raise ParamsError(
                f"GradScaler: invalid overflow_tolerance: {overflow_tolerance!r} (must be in [0, 1))"
            )
        self.overflow_tolerance = float(overflow_tolerance)
        self.max_gradient_norm = _positive(
            "max_gradient_norm", max_gradient_norm, allow_none=True
        )

        self.register_buffer("current_scale", torch.tensor(scale, dtype=torch.float32))
        self.register_buffer("growth_tracker", torch.zeros((), dtype=torch.int64))
        self.register_buffer("steps_since_rescale", torch.zeros((), dtype=torch.int64))
        self.register_buffer(
            "overflows_since_rescale", torch.zeros((), dtype=torch.int64)
        )
        self.register_buffer("found_inf", torch.zeros((), dtype=torch.float32))
        # Python bookkeeping of the current iteration; frozen per step, reset by update().
        self._stage: dict[int, str] = {}
        self._opt_found_inf: dict[int, torch.Tensor] = {}

    # -- user API ---------------------------------------------------------------------------------
    def is_enabled(self) -> bool:
        """False for ``loss_scale`` 0.0/None, where the scaler passes everything through."""
        return self.enabled

    def get_scale(self) -> float:
        """The current scale as a float (a host read: call it outside a traced step)."""
        return float(self.current_scale)

    def scale(self, outputs: Any) -> Any:
        """Multiplies a tensor (or a list/tuple of tensors) by the current scale."""
        if not self.enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            self._to_device_of(outputs)
            return outputs * self.current_scale
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(
            f"GradScaler.scale expects a tensor or a list/tuple of tensors, got {type(outputs).__name__}"
        )

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divides the optimizer's gradients by the scale in place and records inf/NaN (no host read)."""
        if not self.enabled:
            return
        stage = self._stage.get(id(optimizer), _READY)
        if stage == _UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        if stage == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        grads = [p.grad for p in _params(optimizer) if p.grad is not None]
        # Same rounding as torch: reciprocal in float64, then float32 (exact for powers of two).
        inv_scale = self.current_scale.double().reciprocal().float()
        found = torch.zeros((), dtype=torch.float32, device=self.current_scale.device)
        if _multi_tensor.multi_tensor_kernels(grads):  # one multi-tensor kernel per device and dtype, as torch's GradScaler
            for same in _by_device_and_dtype(grads):
                found_here = torch.zeros((), dtype=torch.float32, device=same[0].device)
                torch._amp_foreach_non_finite_check_and_unscale_(same, found_here, inv_scale.to(same[0].device))
                found = torch.maximum(found, found_here.to(found.device))
        elif grads:
            finite = torch.stack(
                [g.isfinite().all().to(found.device) for g in grads]
            ).all()
            found = (~finite).to(torch.float32)
            for g in grads:
                g.mul_(inv_scale.to(g.device))
        self._opt_found_inf[id(optimizer)] = found
        self.found_inf.copy_(torch.maximum(self.found_inf, found))
        self._stage[id(optimizer)] = _UNSCALED

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Unscales (if not done yet) and steps the optimizer, keeping the old values on overflow."""
        if not self.enabled:
            return optimizer.step(*args, **kwargs)
        if self._stage.get(id(optimizer)) == _STEPPED:
            raise RuntimeError(
                "step() has already been called since the last update()."
            )
        if self._stage.get(id(optimizer), _READY) == _READY:
            self.unscale_(optimizer)
        skip = self._opt_found_inf[id(optimizer)] > 0
        result = _step_unless(skip, optimizer, args, kwargs)
        self._stage[id(optimizer)] = _STEPPED
        return result

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Updates the scale from the overflows seen since the last update (tensor ops only)."""
        if not self.enabled:
            return
        if new_scale is not None:
            self.current_scale.copy_(torch.as_tensor(new_scale, dtype=torch.float32))
        elif self.dynamic:
            if not self._opt_found_inf:
                raise RuntimeError(
                    "No inf checks were recorded prior to update(): call step() or unscale_() first."
                )
            self._update_dynamic(self.found_inf > 0)
        self.found_inf.zero_()
        self._stage.clear()
        self._opt_found_inf.clear()

    def _update_dynamic(self, overflow: torch.Tensor) -> None:
        """Halve on a not-tolerated overflow, double after ``steps_per_increase`` clean steps."""
        steps = self.steps_since_rescale + 1
        overflows = self.overflows_since_rescale + overflow.long()
        # 1. too many overflows since the last rescale: halve (bounded below), reset the counters
        decrease = overflow & (
            overflows.double() / steps.double() > self.overflow_tolerance
        )
        # 2. clean step completing a window: double (bounded above), reset the counters
        tracker = torch.where(
            overflow, torch.zeros_like(self.growth_tracker), self.growth_tracker + 1
        )
        increase = tracker >= self.steps_per_increase
        scale = self.current_scale
        new_scale = torch.where(
            decrease, torch.clamp(scale * 0.5, min=self.min_loss_scale), scale
        )
        new_scale = torch.where(
            increase, torch.clamp(scale * 2.0, max=self.max_loss_scale), new_scale
        )
        rescaled = decrease | increase
        zero = torch.zeros_like(steps)
        self.current_scale.copy_(new_scale)
        self.growth_tracker.copy_(torch.where(increase, zero, tracker))
        self.steps_since_rescale.copy_(torch.where(rescaled, zero, steps))
        self.overflows_since_rescale.copy_(torch.where(rescaled, zero, overflows))

    # -- checkpointing ----------------------------------------------------------------------------
    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        """Scale, counters (tensors, cloned) and the hyper-parameters, for a checkpoint."""
        return {
            "scale": self.current_scale.detach().clone(),
            "growth_tracker": self.growth_tracker.detach().clone(),
            "steps_since_rescale": self.steps_since_rescale.detach().clone(),
            "overflows_since_rescale": self.overflows_since_rescale.detach().clone(),
            "dynamic": self.dynamic,
            "enabled": self.enabled,
            "steps_per_increase": self.steps_per_increase,
            "min_loss_scale": self.min_loss_scale,
            "max_loss_scale": self.max_loss_scale,
            "overflow_tolerance": self.overflow_tolerance,
        }

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> Any:  # type: ignore[override]
        """Restores the scale and counters in place (also reads ``torch.amp.GradScaler`` state dicts)."""
        if "scale" not in state_dict:
            raise ValueError(
                "GradScaler.load_state_dict: the state dict has no 'scale' entry"
            )
        tracker = state_dict.get("growth_tracker", state_dict.get("_growth_tracker", 0))
        with torch.no_grad():
            self.current_scale.copy_(
                torch.as_tensor(state_dict["scale"], dtype=torch.float32)
            )
            self.growth_tracker.copy_(torch.as_tensor(tracker))
            self.steps_since_rescale.copy_(
                torch.as_tensor(state_dict.get("steps_since_rescale", 0))
            )
            self.overflows_since_rescale.copy_(
                torch.as_tensor(state_dict.get("overflows_since_rescale", 0))
            )
        for key in (
            "steps_per_increase",
            "min_loss_scale",
            "max_loss_scale",
            "overflow_tolerance",
        ):
            if key in state_dict and state_dict[key] != getattr(self, key):
                logger.warning(
                    "GradScaler: checkpoint has %s=%s, keeping the configured %s",
                    key,
                    state_dict[key],
                    getattr(self, key),
                )
        return None

    def _to_device_of(self, tensor: torch.Tensor) -> None:
        """Moves the state to the loss's device on first use (a device check, trace-safe)."""
        if self.current_scale.device != tensor.device:
            self.to(tensor.device)

    def extra_repr(self) -> str:
        mode = "dynamic" if self.dynamic else ("static" if self.enabled else "disabled")
        return f"loss_scale={mode}, steps_per_increase={self.steps_per_increase}"


def _by_device_and_dtype(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return list(groups.values())


def _params(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for group in optimizer.param_groups:
        yield from group["params"]


def _state_tensors(
    optimizer: torch.optim.Optimizer,
) -> dict[tuple[int, str], torch.Tensor]:
    """Every tensor of ``optimizer.state``, keyed by (owner id, name)."""
    out: dict[tuple[int, str], torch.Tensor] = {}
    for owner, entry in optimizer.state.items():
        if isinstance(entry, torch.Tensor):
            out[(id(owner), "")] = entry
        elif isinstance(entry, dict):
            for name, value in entry.items():
                if isinstance(value, torch.Tensor):
                    out[(id(owner), str(name))] = value
    return out


@torch.no_grad()
def _step_unless(
    skip: torch.Tensor, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict
) -> Any:
    """Runs ``optimizer.step()`` and puts back the old params/state where ``skip`` is true.

    The snapshot is one copy of parameters and state; the select is exact (bitwise old values).
    State is matched by (parameter, name) after the step, so an optimizer that rebinds a state
    tensor instead of updating it in place is restored too.
    """
    params = list(dict.fromkeys(_params(optimizer)))
    saved_params = [p.clone() for p in params]
    saved_state = {key: t.clone() for key, t in _state_tensors(optimizer).items()}
    result = optimizer.step(*args, **kwargs)
    for param, old in zip(params, saved_params):
        param.copy_(torch.where(skip.to(param.device), old, param))
    for key, tensor in _state_tensors(optimizer).items():
        old = saved_state.get(key)
        if (
            old is None
        ):  # created lazily by this step (torch.optim): as if never stepped
            old = torch.zeros_like(tensor)
        tensor.copy_(torch.where(skip.to(tensor.device), old.to(tensor.device), tensor))
    return result
