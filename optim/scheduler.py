"""The closed-form schedule family (``cs_run.optim.scheduler``): a param-group value as a tensor function of the step.

torch's schedulers are chainable (each step multiplies ``group['lr']`` by a factor computed in Python),
which bakes a new Python number into every traced step. Here ``step()`` adds 1 to the tensor
``last_epoch``, evaluates ``_get_closed_form()`` with torch ops and copies the result into the value
``param_group_key`` names (``"lr"`` for :mod:`.lr_scheduler`, ``"weight_decay"`` for
:mod:`.weight_decay_scheduler`) of every targeted group, in place, so one captured graph serves every
step (docs/architecture.md#layers). The classes and arguments are the vendor's 2.10 ``*Scheduler`` family;
values are computed in float64 (the vendor: float32), so they agree with the vendor's to float32
round-off except where the vendor is defective (documented per class, checked against the golden
files in tests/optim/test_vendor_oracle.py).
"""

from __future__ import annotations

import abc
import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from cs_run.creation import full

from .optimizer import _lr_tensor, _scalar_dtype

__all__ = [
    "ChainedScheduler",
    "ConstantScheduler",
    "CosineAnnealingScheduler",
    "CosineAnnealingWarmRestartsScheduler",
    "CosineDecayScheduler",
    "CyclicScheduler",
    "ExponentialScheduler",
    "InverseExponentialTimeDecayScheduler",
    "InverseSquareRootDecayScheduler",
    "LambdaScheduler",
    "LinearScheduler",
    "MultiStepScheduler",
    "MultiplicativeScheduler",
    "OneCycleScheduler",
    "PiecewiseConstantScheduler",
    "PolynomialScheduler",
    "ScalePerParamScheduler",
    "Scheduler",
    "SequentialScheduler",
    "StepScheduler",
]

TagsT = str | None | list[str | None] | tuple[str | None, ...] | set[str | None]


def _tag_set(tags: TagsT | None) -> set[str | None] | None:
    if tags is None:
        return None
    if isinstance(tags, (list, tuple, set, frozenset)):
        out = set(tags)
        if len(out) != len(tags):
            raise ValueError(f"Invalid param_group_tags: {list(tags)} (contains duplicate values)")
        return out
    return {tags}


class Scheduler(abc.ABC):
    """Base of the closed-form schedules of one param-group value (``param_group_key``).

    Subclasses set their hyper-parameters, call ``super().__init__(optimizer, total_iters=...)`` and
    implement ``_get_closed_form()`` (the older name ``_get_closed_form_lr`` works too): the value at
    step ``self.last_epoch`` (an int64 tensor) computed with torch ops only, phases selected with
    ``torch.where``. Like torch, construction already applies the value of step ``last_epoch + 1``
    (0 by default); call ``step()`` after each ``optimizer.step()``.

    Args:
        optimizer: the optimizer whose groups are scheduled.
        total_iters: number of steps the schedule lasts (used by SequentialScheduler and some schedules).
        last_epoch: the step before the first one; -1 starts from scratch.
        param_group_tags: schedule only the groups whose ``tags`` contain one of these; ``[None]`` (or
            ``None`` inside the list) means the untagged groups; None means every group.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Scheduler:
        if getattr(cls, "__abstractmethods__", None):
            raise TypeError(f"{cls.__name__} cannot be instantiated: implement _get_closed_form() (or "
                            "_get_closed_form_lr()), the value at step self.last_epoch as a tensor")
        return super().__new__(cls)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_get_closed_form_lr" in cls.__dict__ and "_get_closed_form" not in cls.__dict__:
            cls._get_closed_form = cls.__dict__["_get_closed_form_lr"]  # type: ignore[attr-defined]

    def __init__(self, optimizer: torch.optim.Optimizer, total_iters: int | None, last_epoch: int = -1,
                 param_group_tags: TagsT | None = None) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"{type(self).__name__} needs a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if total_iters is not None and total_iters <= 0:
            raise ValueError(f"Invalid total_iters: {total_iters} (must be > 0)")
        self.optimizer = optimizer
        self.total_iters = total_iters
        self.param_group_tags = _tag_set(param_group_tags)
        self._validate_tags_apply()
        key = self.param_group_key
        for group in optimizer.param_groups:  # e.g. a Python float lr or weight_decay: make it a tensor
            if self._applies_to(group) and not isinstance(group.get(key), Tensor):
                group[key] = _lr_tensor(group.get(key, 0.0), list(group["params"]))
        device = next((g[key].device for g in optimizer.param_groups if isinstance(g.get(key), Tensor)),
                      torch.device("cpu"))
        self.last_epoch = full((), int(last_epoch), dtype=torch.int64, device=device)
        self.step()

    @property
    @abc.abstractmethod
    def param_group_key(self) -> str:
        """The param-group entry this schedule sets, e.g. ``"lr"`` or ``"weight_decay"``."""

    @abc.abstractmethod
    def _get_closed_form(self) -> Tensor:
        """The value at step ``self.last_epoch`` as a 0-d tensor, with torch ops only."""

    def _get_closed_form_lr(self) -> Tensor:
        """The older name of :meth:`_get_closed_form`."""
        return self._get_closed_form()

    # -- tags ---------------------------------------------------------------------------------
    def _applies_to(self, group: dict[str, Any]) -> bool:
        if self.param_group_tags is None:
            return True
        tags = group.get("tags") or {None}
        tags = tags if isinstance(tags, (set, frozenset, list, tuple)) else {tags}
        return bool(self.param_group_tags.intersection(tags))

    def _validate_tags_apply(self) -> None:
        if any(self._applies_to(g) for g in self.optimizer.param_groups):
            return
        available = sorted({str(t) for g in self.optimizer.param_groups for t in (g.get("tags") or ())})
        raise ValueError(f"{type(self).__name__}: param_group_tags {sorted(map(str, self.param_group_tags or ()))} "
                         f"match no param group of the optimizer (its groups' tags: {available or 'none'})")

    # -- helpers for subclasses ---------------------------------------------------------------
    @property
    def _dtype(self) -> torch.dtype:
        return _scalar_dtype(self.last_epoch.device)

    def _step_float(self) -> Tensor:
        """The step as a float tensor (float64 where the device has it)."""
        return self.last_epoch.to(self._dtype)

    def _const(self, value: float) -> Tensor:
        """A 0-d constant made inside the step (an ``aten.full`` node, not a captured tensor)."""
        return torch.full((), float(value), dtype=self._dtype, device=self.last_epoch.device)

    # -- the public protocol ------------------------------------------------------------------
    def step(self, epoch: int | None = None) -> None:
        """Advance one step (or jump to ``epoch``) and write the new value into the groups in place."""
        if epoch is None:
            self.last_epoch.add_(1)
        else:
            self.last_epoch.fill_(int(epoch))
        self._apply(self._get_closed_form())

    def _group_values(self, value: Tensor) -> list[Tensor | None]:
        """The value of every group (None: not targeted); ScalePerParamScheduler scales it per group."""
        return [value if self._applies_to(g) else None for g in self.optimizer.param_groups]

    def _apply(self, value: Tensor) -> None:
        key = self.param_group_key
        for group, group_value in zip(self.optimizer.param_groups, self._group_values(value)):
            if group_value is not None:
                group[key].copy_(group_value)

    def get(self) -> list[Tensor | None]:
        """The value of the current step for every group (None for groups the tags exclude)."""
        return self._group_values(self._get_closed_form())

    def get_last_value(self) -> list[Tensor | None]:
        """Copies of the targeted groups' current values (read them in a step closure on CSX)."""
        key = self.param_group_key
        return [g[key].detach().clone() if self._applies_to(g) else None for g in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Just the step: every other attribute is a hyper-parameter from the constructor."""
        return {"last_epoch": self.last_epoch.detach().clone()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Copy the step in place (a traced step keeps its input) and reapply its value.

        Accepts torch's and the vendor's scheduler state dicts too (only ``last_epoch`` is read).
        """
        value = state_dict["last_epoch"]
        with torch.no_grad():
            if isinstance(value, Tensor):
                self.last_epoch.copy_(value)
            else:
                self.last_epoch.fill_(int(value))
        self._apply(self._get_closed_form())


@contextlib.contextmanager
def _at_step(scheduler: Scheduler, step: Tensor) -> Iterator[Scheduler]:
    """Evaluate ``scheduler`` at another step tensor (composition), restoring its own afterwards."""
    own = scheduler.last_epoch
    scheduler.last_epoch = step
    try:
        yield scheduler
    finally:
        scheduler.last_epoch = own


# -- decays ---------------------------------------------------------------------------------------
class ConstantScheduler(Scheduler):
    """``value = val`` (``total_iters`` only matters inside SequentialScheduler).

    Unlike torch.optim.lr_scheduler.ConstantLR (a factor applied for ``total_iters`` steps), this is
    the vendor's: a constant value.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, val: float, total_iters: int | None = None,
                 param_group_tags: TagsT | None = None) -> None:
        self.val = float(val)
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)

    @property
    def initial_val(self) -> float:
        return self.val

    def _get_closed_form(self) -> Tensor:
        return self._const(self.val)


class PolynomialScheduler(Scheduler):
    """Polynomial decay from ``initial_val`` to ``end_val`` over ``total_iters``.

    ``value = (initial - end) * (1 - t' / T')^power + end`` with, without ``cycle``, ``t' = min(t, T)``,
    ``T' = T``; with ``cycle`` (Keras), ``t' = t`` and ``T' = T * max(1, ceil(t / T))``. Equals torch's
    PolynomialLR when ``end_val == 0``.

    Note:
        The vendor's ``cycle=True`` never cycles: it holds ``end_val`` from ``total_iters`` on (and
        before that uses ``T' = T * ceil((t + 1) / T)``, i.e. ``T``). cs-run cycles as documented
        (Keras' PolynomialDecay); both facts are tested against the vendor's golden values.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, end_val: float, total_iters: int,
                 power: float = 1.0, cycle: bool = False, param_group_tags: TagsT | None = None) -> None:
        self.initial_val, self.end_val = float(initial_val), float(end_val)
        self.power, self.cycle = float(power), cycle
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)

    def _get_closed_form(self) -> Tensor:
        t = self._step_float()
        total = float(self.total_iters)
        if self.cycle:
            period = torch.clamp(torch.ceil(t / total), min=1.0) * total
        else:
            t, period = torch.clamp(t, max=total), self._const(total)
        decay = (1 - t / period) ** self.power
        return decay * (self.initial_val - self.end_val) + self.end_val


class LinearScheduler(PolynomialScheduler):
    """Linear ramp from ``initial_val`` to ``end_val`` over ``total_iters``, then flat (power 1)."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, end_val: float, total_iters: int,
                 cycle: bool = False, param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, initial_val, end_val, total_iters, power=1.0, cycle=cycle,
                         param_group_tags=param_group_tags)


class ExponentialScheduler(Scheduler):
    """``value = initial * decay_rate^(t / total_iters)``, the exponent floored when ``staircase``.

    torch's ExponentialLR is ``total_iters=1``; ``staircase=True`` is torch's StepLR.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, total_iters: int, decay_rate: float,
                 staircase: bool = False, param_group_tags: TagsT | None = None) -> None:
        self.initial_val, self.decay_rate, self.staircase = float(initial_val), float(decay_rate), staircase
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)

    def _get_closed_form(self) -> Tensor:
        power = self._step_float() / self.total_iters
        if self.staircase:
            power = torch.floor(power)
        return self._const(self.decay_rate) ** power * self.initial_val


class InverseExponentialTimeDecayScheduler(Scheduler):
    """Keras' InverseTimeDecay: ``value = initial / (1 + decay_rate * t^step_exponent / total_iters)``.

    The ratio ``t^step_exponent / total_iters`` is floored when ``staircase``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, step_exponent: int, total_iters: int,
                 decay_rate: float, staircase: bool = False, param_group_tags: TagsT | None = None) -> None:
        self.initial_val, self.step_exponent = float(initial_val), step_exponent
        self.decay_rate, self.staircase = float(decay_rate), staircase
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)

    def _get_closed_form(self) -> Tensor:
        ratio = self._step_float() ** self.step_exponent / self.total_iters
        if self.staircase:
            ratio = torch.floor(ratio)
        return self.initial_val / (1 + self.decay_rate * ratio)


class InverseSquareRootDecayScheduler(Scheduler):
    """``value = initial * scale / sqrt(max(t, warmup_steps))`` (constant during the warm-up)."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float = 1.0, scale: float = 1.0,
                 warmup_steps: int = 1.0, param_group_tags: TagsT | None = None) -> None:
        if warmup_steps <= 0:
            raise ValueError(f"Invalid warmup_steps: {warmup_steps} (must be > 0)")
        self.initial_val, self.scale, self.warmup_steps = float(initial_val), float(scale), warmup_steps
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _get_closed_form(self) -> Tensor:
        t = torch.clamp(self._step_float(), min=float(self.warmup_steps))
        return self.scale / torch.sqrt(t) * self.initial_val


class CosineDecayScheduler(Scheduler):
    """Keras' CosineDecay: half a cosine from ``initial_val`` to ``end_val`` over ``total_iters``, then ``end_val``.

    Equals torch's CosineAnnealingLR(T_max=total_iters, eta_min=end) up to ``total_iters``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, end_val: float, total_iters: int,
                 param_group_tags: TagsT | None = None) -> None:
        self.initial_val, self.end_val = float(initial_val), float(end_val)
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)

    def _get_closed_form(self) -> Tensor:
        t = torch.clamp(self._step_float(), max=float(self.total_iters))
        progress = 0.5 * (1 + torch.cos(math.pi * t / self.total_iters))
        return progress * (self.initial_val - self.end_val) + self.end_val


class CosineAnnealingScheduler(Scheduler):
    """SGDR's cosine without restarts: ``eta_min + (initial - eta_min) (1 + cos(pi t / T_max)) / 2``.

    Periodic past ``T_max``, like torch's CosineAnnealingLR.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, T_max: int, eta_min: float = 0.0,
                 param_group_tags: TagsT | None = None) -> None:
        if T_max <= 0:
            raise ValueError(f"Invalid T_max: {T_max} (must be > 0)")
        self.initial_val, self.T_max, self.eta_min = float(initial_val), T_max, float(eta_min)
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _get_closed_form(self) -> Tensor:
        cosine = 1 + torch.cos(math.pi * self._step_float() / self.T_max)
        return self.eta_min + (self.initial_val - self.eta_min) * cosine / 2


class StepScheduler(Scheduler):
    """``value = initial * gamma^floor(t / step_size)``, torch's StepLR."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, step_size: int, gamma: float,
                 param_group_tags: TagsT | None = None) -> None:
        if step_size <= 0:
            raise ValueError(f"Invalid step_size: {step_size} (must be > 0)")
        self.initial_val, self.step_size, self.gamma = float(initial_val), step_size, float(gamma)
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _get_closed_form(self) -> Tensor:
        return self._const(self.gamma) ** torch.floor(self._step_float() / self.step_size) * self.initial_val


class MultiStepScheduler(Scheduler):
    """``value = initial * gamma^(number of milestones <= t)``, torch's MultiStepLR."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, gamma: float, milestones: list[int],
                 param_group_tags: TagsT | None = None) -> None:
        self.initial_val, self.gamma = float(initial_val), float(gamma)
        self.milestones = sorted(int(m) for m in milestones)
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _get_closed_form(self) -> Tensor:
        passed = self._const(0.0)
        for milestone in self.milestones:  # a fixed loop over Python constants: static structure
            passed = passed + (self.last_epoch >= milestone).to(passed.dtype)
        return self._const(self.gamma) ** passed * self.initial_val


class PiecewiseConstantScheduler(Scheduler):
    """``vals[i]`` for ``milestones[i-1] <= t < milestones[i]`` (one more value than milestones).

    ``constant_cls`` is the vendor's argument (the ConstantScheduler subclass it chains); the values
    are the same computed directly.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, constant_cls: type | None, vals: list[float],
                 milestones: list[int], param_group_tags: TagsT | None = None) -> None:
        if len(vals) != len(milestones) + 1:
            raise ValueError(f"Invalid vals: {len(vals)} values for {len(milestones)} milestones "
                             "(must be one more than the milestones)")
        if list(milestones) != sorted(milestones):
            raise ValueError(f"Invalid milestones: {list(milestones)} (must be increasing)")
        self.constant_cls = constant_cls
        self.vals = [float(v) for v in vals]
        self.milestones = [int(m) for m in milestones]
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    @property
    def initial_val(self) -> float:
        return self.vals[0]

    def _get_closed_form(self) -> Tensor:
        value = self._const(self.vals[0])
        for milestone, val in zip(self.milestones, self.vals[1:]):
            value = torch.where(self.last_epoch >= milestone, self._const(val), value)
        return value


# -- cyclic and user-defined ----------------------------------------------------------------------
class CosineAnnealingWarmRestartsScheduler(Scheduler):
    """SGDR: cosine from ``initial_val`` to ``eta_min`` over periods ``T_0, T_0 T_mult, T_0 T_mult^2, ...``.

    Period ``n`` starts at ``s_n = T_0 (T_mult^n - 1) / (T_mult - 1)`` (``n T_0`` when ``T_mult == 1``);
    ``value = eta_min + (initial - eta_min) (1 + cos(pi (t - s_n) / (T_0 T_mult^n))) / 2``. Equals torch's.

    Note:
        The vendor's (which refuses ``T_mult != 1``) computes ``T_cur`` after the first period as
        ``floor(t / T_0) * T_0 - T_0`` instead of ``t mod T_0``, so its restarts are wrong (relative
        error up to ~100x). cs-run keeps torch's SGDR; both facts are tested against the golden values.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, T_0: int, T_mult: int = 1,
                 eta_min: float = 0.0, param_group_tags: TagsT | None = None) -> None:
        if T_0 <= 0 or int(T_0) != T_0:
            raise ValueError(f"Invalid T_0: {T_0} (must be a positive integer)")
        if T_mult < 1 or int(T_mult) != T_mult:
            raise ValueError(f"Invalid T_mult: {T_mult} (must be an integer >= 1)")
        self.initial_val = float(initial_val)
        self.T_0, self.T_mult, self.eta_min = int(T_0), int(T_mult), float(eta_min)
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _period_start(self, n: Tensor) -> Tensor:
        return self.T_0 * (self.T_mult**n - 1) / (self.T_mult - 1)

    def _get_closed_form(self) -> Tensor:
        t = self._step_float()
        if self.T_mult == 1:
            t_cur, t_i = torch.remainder(t, self.T_0), self._const(self.T_0)
        else:
            n = torch.floor(torch.log(t / self.T_0 * (self.T_mult - 1) + 1) / math.log(self.T_mult))
            # log rounding can put n one off at a period boundary: correct it with exact integers
            n = torch.where(self._period_start(n + 1) <= t, n + 1, n)
            n = torch.where(self._period_start(n) > t, n - 1, n)
            t_cur, t_i = t - self._period_start(n), self.T_0 * self._const(self.T_mult) ** n
        cosine = 1 + torch.cos(math.pi * t_cur / t_i)
        return self.eta_min + (self.initial_val - self.eta_min) * cosine / 2


class CyclicScheduler(Scheduler):
    """Cyclical values (Smith, 2017): triangles between ``base_val`` and ``max_val``.

    ``mode`` is 'triangular' (constant amplitude), 'triangular2' (halved every cycle) or 'exp_range'
    (scaled by ``gamma^t``). As in the vendor's, the mode decides what the scale is evaluated on
    (the cycle for the triangles, the iteration for exp_range); ``scale_mode`` is accepted for the
    signature. Equals torch's CyclicLR with ``cycle_momentum=False``.
    """

    _MODES = ("triangular", "triangular2", "exp_range")

    def __init__(self, optimizer: torch.optim.Optimizer, base_val: float, max_val: float, step_size_up: int = 2000,
                 step_size_down: int | None = None, mode: str = "triangular", gamma: float = 1.0,
                 scale_mode: str = "cycle", param_group_tags: TagsT | None = None) -> None:
        if mode not in self._MODES:
            raise ValueError(f"Invalid mode: {mode!r} (must be one of {', '.join(self._MODES)})")
        if scale_mode not in ("cycle", "iterations"):
            raise ValueError(f"Invalid scale_mode: {scale_mode!r} (must be 'cycle' or 'iterations')")
        self.base_val, self.max_val = float(base_val), float(max_val)
        self.step_size_up = float(step_size_up)
        self.step_size_down = float(step_size_down) if step_size_down is not None else self.step_size_up
        self.mode, self.gamma = mode, float(gamma)
        self.scale_mode = "iterations" if mode == "exp_range" else "cycle"
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    @property
    def initial_val(self) -> float:
        """The value at step 0 (ChainedScheduler divides by it)."""
        return self.base_val

    def _scale(self, x: Tensor) -> Tensor:
        if self.mode == "triangular":
            return torch.ones_like(x)
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        return self._const(self.gamma) ** x

    def _get_closed_form(self) -> Tensor:
        t = self._step_float()
        total = self.step_size_up + self.step_size_down
        ratio = self.step_size_up / total
        cycle = torch.floor(1 + t / total)
        x = 1.0 + t / total - cycle
        # 1. rising edge: x / ratio; 2. falling edge: (x - 1) / (ratio - 1)
        factor = torch.where(x <= ratio, x / ratio, (x - 1) / (ratio - 1))
        height = (self.max_val - self.base_val) * factor
        return self.base_val + height * self._scale(cycle if self.scale_mode == "cycle" else t)


class OneCycleScheduler(Scheduler):
    """1cycle (Smith & Topin, 2018): ``initial -> max_val -> initial / final_div_factor`` over ``total_steps``.

    Phases end at ``pct_start * total_steps - 1`` and ``total_steps - 1`` (three-phase: also
    ``2 pct_start total_steps - 2``), annealed by cosine or linearly. Equals torch's OneCycleLR with
    ``div_factor = max_val / initial_val`` and ``cycle_momentum=False``.

    Note:
        Past ``total_steps`` the last phase is held at its end value (torch raises there). The vendor
        keeps annealing past the end: its linear schedules go negative and its cosine rises again.
        cs-run keeps the end value; both facts are tested against the golden values.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, max_val: float,
                 total_steps: int = 1000, pct_start: float = 0.3, final_div_factor: float = 1e4,
                 three_phase: bool = False, anneal_strategy: str = "cos",
                 param_group_tags: TagsT | None = None) -> None:
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"Invalid anneal_strategy: {anneal_strategy!r} (must be 'cos' or 'linear')")
        if not 0 < pct_start < 1:
            raise ValueError(f"Invalid pct_start: {pct_start} (must be in (0, 1))")
        self.initial_val, self.max_val = float(initial_val), float(max_val)
        self.total_steps, self.pct_start = int(total_steps), float(pct_start)
        self.final_div_factor, self.three_phase = float(final_div_factor), three_phase
        self.anneal_strategy = anneal_strategy
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _phases(self) -> list[tuple[float, float, float]]:
        """(end_step, start_value, end_value) of each phase, as torch defines them."""
        init, peak = self.initial_val, self.max_val
        low = init / self.final_div_factor
        up_end = self.pct_start * self.total_steps - 1
        if self.three_phase:
            return [(up_end, init, peak), (2 * self.pct_start * self.total_steps - 2, peak, init),
                    (self.total_steps - 1, init, low)]
        return [(up_end, init, peak), (self.total_steps - 1, peak, low)]

    def _anneal(self, start: float, end: float, pct: Tensor) -> Tensor:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (torch.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _get_closed_form(self) -> Tensor:
        t = self._step_float()
        phases, values, begin = self._phases(), [], 0.0
        for end_step, start_val, end_val in phases:
            pct = torch.clamp((t - begin) / (end_step - begin), max=1.0)
            values.append(self._anneal(start_val, end_val, pct))
            begin = end_step
        value = values[-1]
        for (end_step, _, _), phase_value in reversed(list(zip(phases[:-1], values[:-1]))):
            value = torch.where(t <= end_step, phase_value, value)  # the first phase whose end is not passed
        return value


def _vendor_default_lambdas() -> list[Callable[[Tensor], Tensor]]:
    """The vendor's default ``set_value_lambda``: ``t / 30`` and ``0.95^t`` (torch's docs example)."""
    return [lambda t: t / 30, lambda t: 0.95**t]


class LambdaScheduler(Scheduler):
    """``value = initial * value_lambda(t)``, or the vendor's rule over ``set_value_lambda()``.

    With ``value_lambda`` (a cs-run extra; the step is a float64 0-d tensor, so branch with
    ``torch.where``) the value is ``initial_val * value_lambda(t)``. Without it, the vendor's rule:
    ``set_value_lambda()`` returns a list of functions and the value is the product over them of
    ``initial_val * f(t)``; by default ``[t / 30, 0.95^t]``, i.e. ``initial^2 * t / 30 * 0.95^t``
    (override ``set_value_lambda`` as with the vendor).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, param_group_tags: TagsT | None = None,
                 value_lambda: Callable[[Tensor], Tensor | float] | None = None) -> None:
        self.initial_val = float(initial_val)
        self._value_lambda = value_lambda
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def set_value_lambda(self) -> list[Callable[[Tensor], Tensor | float]]:
        """The factor functions of the vendor's rule (default: ``[t / 30, 0.95^t]``)."""
        return _vendor_default_lambdas()

    def _factor(self, fn: Callable[[Tensor], Tensor | float], t: Tensor) -> Tensor:
        return torch.as_tensor(fn(t), device=t.device).to(self._dtype)

    def _get_closed_form(self) -> Tensor:
        t = self._step_float()
        if self._value_lambda is not None:
            return self._factor(self._value_lambda, t) * self.initial_val
        fns = self.set_value_lambda()
        value = self._const(1.0)
        for fn in fns if isinstance(fns, (list, tuple)) else [fns]:
            value = self._factor(fn, t) * self.initial_val * value
        return value


class MultiplicativeScheduler(Scheduler):
    """``value = initial * coefficient^t``: torch's MultiplicativeLR with a constant factor, in closed form."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, coefficient: float,
                 param_group_tags: TagsT | None = None) -> None:
        self.initial_val, self.coefficient = float(initial_val), float(coefficient)
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _get_closed_form(self) -> Tensor:
        return self._const(self.coefficient) ** self._step_float() * self.initial_val


# -- composition ----------------------------------------------------------------------------------
def _check_children(kind: str, parent: Scheduler | None, optimizer: torch.optim.Optimizer,
                    schedulers: list[Scheduler], key: str, tags: set | None) -> None:
    if not schedulers:
        raise ValueError(f"{kind} needs at least one scheduler")
    for index, scheduler in enumerate(schedulers):
        if not isinstance(scheduler, Scheduler):
            raise TypeError(f"{kind}: schedulers[{index}] is a {type(scheduler).__name__}, "
                            "not a cs_run.optim.scheduler.Scheduler")
        if scheduler.optimizer is not optimizer:
            raise ValueError(f"{kind}: schedulers[{index}] belongs to another optimizer")
        if scheduler.param_group_key != key:
            raise ValueError(f"{kind}: schedulers[{index}] sets {scheduler.param_group_key!r}, not {key!r}")
        if scheduler.param_group_tags != tags:
            raise ValueError(f"{kind}: schedulers[{index}] has param_group_tags {scheduler.param_group_tags}, "
                             f"not {tags} (all must target the same groups)")


class SequentialScheduler(Scheduler):
    """Scheduler ``k`` runs from ``milestones[k-1]`` on, at the shifted step ``t - milestones[k-1]``.

    Its state is one step; the children's own steps are not used. Equals torch's SequentialLR.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, schedulers: list[Scheduler], milestones: list[int],
                 last_epoch: int = -1, param_group_tags: TagsT | None = None) -> None:
        schedulers = list(schedulers)
        milestones = [int(m) for m in (milestones.tolist() if hasattr(milestones, "tolist") else milestones)]
        _check_children(type(self).__name__, self, optimizer, schedulers, self.param_group_key,
                        _tag_set(param_group_tags))
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"{type(self).__name__}: {len(schedulers)} schedulers need {len(schedulers) - 1} "
                             f"milestones, got {len(milestones)}")
        if milestones != sorted(milestones):
            raise ValueError(f"Invalid milestones: {milestones} (must be increasing)")
        self._schedulers, self._milestones = schedulers, milestones
        super().__init__(optimizer, total_iters=None, last_epoch=last_epoch, param_group_tags=param_group_tags)

    @property
    def initial_val(self) -> float:
        return self._schedulers[0].initial_val

    def _get_closed_form(self) -> Tensor:
        with _at_step(self._schedulers[0], self.last_epoch) as first:
            value = first._get_closed_form()
        for milestone, scheduler in zip(self._milestones, self._schedulers[1:]):
            with _at_step(scheduler, self.last_epoch - milestone) as shifted:
                value = torch.where(self.last_epoch >= milestone, shifted._get_closed_form(), value)
        return value


class ChainedScheduler(Scheduler):
    """``value = s_0(t) * prod_i s_i(t) / s_i.initial_val``: the first sets the value, the rest scale it.

    Matches torch's ChainedScheduler for multiplicative schedules (StepLR, ExponentialLR, ...).
    """

    def __init__(self, schedulers: list[Scheduler], param_group_tags: TagsT | None = None) -> None:
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError(f"{type(self).__name__} needs at least one scheduler")
        optimizer = schedulers[0].optimizer
        _check_children(type(self).__name__, self, optimizer, schedulers, self.param_group_key,
                        _tag_set(param_group_tags))
        for index, scheduler in enumerate(schedulers[1:], start=1):
            if not getattr(scheduler, "initial_val", 0.0):
                raise ValueError(f"{type(self).__name__}: schedulers[{index}] ({type(scheduler).__name__}) needs a "
                                 "non-zero initial value to act as a factor")
        self._schedulers = schedulers
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    @property
    def initial_val(self) -> float:
        return self._schedulers[0].initial_val

    def _get_closed_form(self) -> Tensor:
        value = None
        for scheduler in self._schedulers:
            with _at_step(scheduler, self.last_epoch) as s:
                v = s._get_closed_form()
            value = v if value is None else value * (v / scheduler.initial_val)
        return value


class ScalePerParamScheduler(Scheduler):
    """``scheduler``'s value times each group's ``adjust_learning_rate`` (or ``adjust_val``; default 1).

    The per-group scaling of muP-style parameterizations; the wrapped scheduler's own step is unused.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: Scheduler,
                 param_group_tags: TagsT | None = None) -> None:
        _check_children(type(self).__name__, self, optimizer, [scheduler], self.param_group_key,
                        _tag_set(param_group_tags))
        self.adjustment_scalars = [float(g.get("adjust_learning_rate", g.get("adjust_val", 1.0)))
                                   for g in optimizer.param_groups]
        self._scheduler = scheduler
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    @property
    def initial_val(self) -> float:
        return self._scheduler.initial_val

    def _get_closed_form(self) -> Tensor:
        with _at_step(self._scheduler, self.last_epoch) as s:
            return s._get_closed_form()

    def _group_values(self, value: Tensor) -> list[Tensor | None]:
        return [value * scale if self._applies_to(g) else None
                for g, scale in zip(self.optimizer.param_groups, self.adjustment_scalars)]
