"""Step-aware hyper-parameters, update schedules and the mask rules of ``cstorch.sparse.utils``.

Everything here is tensor ops on 0-d tensors and masks, with no value read on the host: the number of
weights to keep is a tensor, and top-k by a tensor k is a stable descending sort whose first k indices
are scattered into the mask. So a mask update traces into a CSX step and replays, and the eager run
computes exactly the same masks (ties go to the lower index in both).
"""

from __future__ import annotations

import abc
import math
from typing import Any, Callable, Optional, Sequence, Union

import torch

__all__ = [
    "Constant", "Cosine", "Cycling", "Exp", "FreqSchedule", "HyperParameterSchedule", "InputGroupScoreShaper",
    "Lambda", "Linear", "ListSchedule", "OutputGroupScoreShaper", "Power", "ScoreFlattener", "UpdateSchedule",
    "make_hyperparam_schedule", "make_mask_drop_minimum", "make_mask_grow_maximum", "make_mask_topk_sparsity",
    "make_update_schedule",
]


def _as_step(step: Any) -> torch.Tensor:
    return step if isinstance(step, torch.Tensor) else torch.tensor(step, dtype=torch.float32)


class HyperParameterSchedule(abc.ABC):
    """A value that depends on the sparsity step (the count of finite optimizer steps)."""

    @abc.abstractmethod
    def compute(self, step: torch.Tensor) -> torch.Tensor:
        """The value at ``step`` as a 0-d float tensor on ``step``'s device."""

    def __call__(self, step: Any) -> torch.Tensor:
        return self.compute(_as_step(step))

    def update(self, is_update_step: torch.Tensor) -> None:
        """Advance internal state on an update step (only :class:`Cycling` has any)."""
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None

    def to(self, device: torch.device) -> None:
        """Move any state tensor to ``device`` (the weights')."""
        return None


def _const(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.full((), value, dtype=torch.float32, device=like.device)


class Constant(HyperParameterSchedule):
    """The same value at every step."""

    def __init__(self, value: float) -> None:
        self.value = float(value)

    def compute(self, step: torch.Tensor) -> torch.Tensor:
        return _const(self.value, step)


class Linear(HyperParameterSchedule):
    """``init + step * slope``."""

    def __init__(self, init: float, slope: float) -> None:
        self.init, self.slope = float(init), float(slope)

    def compute(self, step: torch.Tensor) -> torch.Tensor:
        return step * self.slope + self.init


class Exp(HyperParameterSchedule):
    """``final - (final - init) * exp(step * gamma)``: from init towards final."""

    def __init__(self, init: float, gamma: float, final: float = 1.0) -> None:
        self.init, self.gamma, self.final = float(init), float(gamma), float(final)

    def compute(self, step: torch.Tensor) -> torch.Tensor:
        return self.final - (self.final - self.init) * torch.exp(step * self.gamma)


class Power(HyperParameterSchedule):
    """``init * beta ** step``."""

    def __init__(self, init: float, beta: float) -> None:
        self.init, self.beta = float(init), float(beta)

    def compute(self, step: torch.Tensor) -> torch.Tensor:
        return self.init * torch.pow(self.beta, step.float())


class Cosine(HyperParameterSchedule):
    """``o + a * cos(step * pi / half_period)`` with ``o = (init + minimum) / 2`` and ``a = init - o``:
    from init down to minimum at half_period and back up at 2 * half_period."""

    def __init__(self, init: float, half_period: float, minimum: float = 0.0) -> None:
        self.offset = (float(minimum) + float(init)) / 2
        self.amplitude = float(init) - self.offset
        self.frequency = math.pi / float(half_period)

    def compute(self, step: torch.Tensor) -> torch.Tensor:
        return self.amplitude * torch.cos(step * self.frequency) + self.offset


class Cycling(HyperParameterSchedule):
    """The next of ``values`` after every update step, round and round."""

    def __init__(self, values: Sequence[float]) -> None:
        self.values = [float(v) for v in values]
        self.index = torch.zeros((), dtype=torch.int64)

    def compute(self, step: torch.Tensor) -> torch.Tensor:
        table = torch.tensor(self.values, dtype=torch.float32, device=step.device)
        # index_select, not table[index]: indexing by a 0-d tensor reads its value, which a traced step cannot
        return torch.index_select(table, 0, self.index.to(step.device).reshape(1)).reshape(())

    def update(self, is_update_step: torch.Tensor) -> None:
        advanced = torch.remainder(self.index + 1, len(self.values))
        self.index.copy_(torch.where(is_update_step.to(self.index.device), advanced, self.index))

    def state_dict(self) -> dict:
        return {"index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.index.copy_(state["index"])

    def to(self, device: torch.device) -> None:
        self.index = self.index.to(device)


class Lambda(HyperParameterSchedule):
    """A user's function of the step tensor."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.fn = fn

    def compute(self, step: torch.Tensor) -> torch.Tensor:
        return self.fn(step)


_SCHEDULES = {"constant": Constant, "linear": Linear, "exp": Exp, "power": Power, "cosine": Cosine, "cycling": Cycling}


def make_hyperparam_schedule(schedule: Any) -> HyperParameterSchedule:
    """A number (constant), a list (cycling), a callable of the step, or ``{type: ..., ...}``."""
    if isinstance(schedule, HyperParameterSchedule):
        return schedule
    if isinstance(schedule, (int, float)) and not isinstance(schedule, bool):
        return Constant(schedule)
    if isinstance(schedule, (list, tuple)):
        return Cycling(schedule)
    if isinstance(schedule, dict):
        kwargs = dict(schedule)
        if "type" not in kwargs:
            raise ValueError(f"a schedule mapping needs a type ({', '.join(_SCHEDULES)}), got {schedule!r}; a "
                             "per-parameter mapping is keyed by the parameter tensors (in a params file: one entry "
                             "per param_filter)")
        kind = str(kwargs.pop("type")).lower()
        if kind not in _SCHEDULES:
            raise ValueError(f"unknown schedule type {kind!r}; one of {', '.join(_SCHEDULES)}")
        return _SCHEDULES[kind](**kwargs)
    if callable(schedule):
        return Lambda(schedule)
    raise ValueError(f"cannot make a schedule of {schedule!r}: give a number, a list, a callable or {{type: ...}}")


class UpdateSchedule(abc.ABC):
    """Which sparsity steps change the masks (a 0-d bool tensor of the step tensor)."""

    start: Optional[int] = None
    stop: Optional[int] = None

    @abc.abstractmethod
    def __call__(self, step: torch.Tensor) -> torch.Tensor:
        """True where ``step`` is an update step."""


class FreqSchedule(UpdateSchedule):
    """Every ``freq`` steps counted from ``start``, at or after start and before ``stop``."""

    def __init__(self, freq: int = 1, start: int = 0, stop: Optional[int] = None) -> None:
        self.freq, self.start, self.stop = int(freq), int(start or 0), stop

    def __call__(self, step: torch.Tensor) -> torch.Tensor:
        step = torch.as_tensor(step)
        due = torch.remainder(step - self.start, self.freq) == 0
        if self.start:
            due = due & (step >= self.start)
        if self.stop is not None:
            due = due & (step < self.stop)
        return due


class ListSchedule(UpdateSchedule):
    """Exactly the listed steps."""

    def __init__(self, steps: Sequence[int]) -> None:
        self.steps = tuple(int(s) for s in steps)
        self.start, self.stop = min(self.steps), max(self.steps)

    def __call__(self, step: torch.Tensor) -> torch.Tensor:
        step = torch.as_tensor(step)
        return torch.isin(step, torch.tensor(self.steps, dtype=step.dtype, device=step.device))


def make_update_schedule(update: Union[None, dict, UpdateSchedule, Callable]) -> Callable[[torch.Tensor], torch.Tensor]:
    """None: every step; ``{freq, start, stop}``; ``{steps: [...]}``; or a callable of the step."""
    if update is None:
        return FreqSchedule(freq=1)
    if isinstance(update, UpdateSchedule) or (callable(update) and not isinstance(update, dict)):
        return update
    if isinstance(update, dict) and "freq" in update:
        return FreqSchedule(**update)
    if isinstance(update, dict) and "steps" in update:
        return ListSchedule(update["steps"])
    raise ValueError(f"invalid update schedule {update!r}: give {{freq, start, stop}} or {{steps: [...]}}")


# ----------------------------------------------------------------------------------------- masks

class ScoreFlattener:
    """All of a weight competes at once (unstructured sparsity): the score as one row."""

    def __call__(self, tensor: torch.Tensor):
        return tensor.reshape(1, -1), lambda t: t.reshape(tensor.shape)


class OutputGroupScoreShaper:
    """A ``[groups * rows, cols]`` weight scored per group of output rows: each group keeps its share."""

    def __init__(self, num_groups: int) -> None:
        self.num_groups = num_groups

    def __call__(self, tensor: torch.Tensor):
        return tensor.reshape(self.num_groups, -1), lambda t: t.reshape(tensor.shape)


class InputGroupScoreShaper:
    """A ``[rows, groups * cols]`` weight scored per group of input columns."""

    def __init__(self, num_groups: int) -> None:
        self.num_groups = num_groups

    def __call__(self, tensor: torch.Tensor):
        rows, cols = tensor.shape
        shaped = tensor.t().reshape(self.num_groups, -1)
        return shaped, lambda t: t.reshape(cols, rows).t().contiguous()


def _top_k(score: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Per row of ``score``, True at its ``k`` highest entries (ties: the lower index), k a 0-d tensor."""
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices
    rank = torch.arange(score.shape[-1], device=score.device).expand_as(order)
    # order is a permutation: every position gets exactly one flag, True for the first k (none for k = 0)
    return torch.zeros_like(score, dtype=torch.bool).scatter(-1, order, rank < k.to(score.device))


def _kept(density: torch.Tensor, count: Union[int, torch.Tensor]) -> torch.Tensor:
    """``int(density * count)`` as the vendor rounds it (truncation of the float32 product)."""
    return (density * count).int()


def make_mask_topk_sparsity(score: torch.Tensor, sparsity: torch.Tensor, score_shaper=None) -> torch.Tensor:
    """The mask keeping the ``int((1 - sparsity) * n)`` highest scores of each group of n."""
    rows, unshape = (score_shaper or ScoreFlattener())(score)
    return unshape(_top_k(rows, _kept(1 - sparsity, rows.shape[-1])))


def make_mask_drop_minimum(score: torch.Tensor, mask: torch.Tensor, drop_fraction: torch.Tensor, score_shaper=None):
    """``mask`` less the lowest-scoring ``drop_fraction`` of its connections (per group); also returns
    how many each group keeps (``int((1 - drop_fraction) * kept / groups)``)."""
    rows, unshape = (score_shaper or ScoreFlattener())(torch.where(mask, score, float("-inf")))
    keep = _kept(1 - drop_fraction, mask.sum().float() / rows.shape[0])
    return unshape(_top_k(rows, keep)), keep


def make_mask_grow_maximum(score: torch.Tensor, mask: torch.Tensor, sparsity: torch.Tensor,
                           mask_nonzero: Optional[torch.Tensor] = None, score_shaper=None) -> torch.Tensor:
    """``mask`` plus the highest-scoring pruned positions, as many as bring each group back to
    ``int((1 - sparsity) * n)`` connections (none when it has that many already)."""
    rows, unshape = (score_shaper or ScoreFlattener())(torch.where(mask, float("-inf"), score))
    if mask_nonzero is None:
        mask_nonzero = mask.sum().int()
    grow = torch.clamp(_kept(1 - sparsity, rows.shape[-1]) - mask_nonzero, min=0)
    return mask | unshape(_top_k(rows, grow))
