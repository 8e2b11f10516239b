"""The run schedule: how many steps a run takes, and which of its steps log, checkpoint and end it.

One copy of the rules for both front doors: the Model Zoo runner (``runners/base.py``) and the
cstorch loop (:func:`cs_run.utils.data.compute_num_steps`, :class:`~cs_run.utils.data.DataExecutor`).
The rules are the vendor's (its ``compute_num_steps``, which Model Zoo 2.x calls, and the 1.9
runner's ``_configure_run_steps``, which agree):

* ``num_steps`` and ``num_epochs`` are mutually exclusive; the run takes the smallest of
  ``num_epochs x steps_per_epoch``, ``num_steps`` and ``max_steps - initial_step``; at least one of
  the three must be given (``steps_per_epoch`` alone says how long an epoch is, not how long a run is).
* ``steps_per_epoch`` counts loader batches and may not exceed the loader's length; it defaults to
  that length. An epoch is ``steps_per_epoch // grad_accum_steps`` optimizer steps.
* a loader without a length cannot be counted in epochs (``num_epochs`` is refused).
* ``max_steps`` caps the *global* step: a run that starts at or past it is an error, not a no-op.
* the counts in the rules below are *run* steps (1-based, counted from this run's start), as in the
  vendor's logging callback and DataExecutor: the last step always logs and checkpoints.

Every bad combination raises :class:`~cs_run.errors.ParamsError` (a ``ValueError``), whose message
names the option as the caller spells it (``runconfig.num_steps`` for the runner, ``num_steps`` for
the cstorch API).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from cs_run.errors import ParamsError

__all__ = ["MIN_STEPS", "MaxStepsReached", "StepBudget", "StepOptions", "check_step_options", "step_budget", "is_final_step",
           "is_log_step", "is_checkpoint_step"]

MIN_STEPS = 1
"""The least num_steps, max_steps, num_epochs, steps_per_epoch and grad_accum_steps: the params fields
declare it as their ``min``, so the params, the Trainer and the CLI flags' ranges refuse what this does."""

UNBOUNDED_EPOCH = 2**62
"""Steps per epoch of a loader without a length and no ``steps_per_epoch``: the epoch never ends."""


class MaxStepsReached(ParamsError, RuntimeError):
    """The run starts at or past max_steps: a ParamsError, and the RuntimeError the vendor raises."""


@dataclass(frozen=True)
class StepBudget:
    steps: int
    """Optimizer steps this run takes (>= 1)."""
    steps_per_epoch: int
    """Optimizer steps per epoch (:data:`UNBOUNDED_EPOCH` when the loader has no length)."""


def _check(name: str, value: object, where: str, *, zero_ok: bool = False) -> None:
    if value is None:
        return
    low = 0 if zero_ok else MIN_STEPS
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ParamsError(f"{where}Invalid {name}: {value!r} (must be an integer >= {low})")


def _keys(names: Mapping[str, str] | None) -> dict[str, str]:
    key = {k: k for k in ("num_steps", "max_steps", "num_epochs", "steps_per_epoch", "grad_accum_steps")}
    return {**key, **(names or {})}


def check_step_options(*, num_steps: int | None = None, max_steps: int | None = None, num_epochs: int | None = None,
                       steps_per_epoch: int | None = None, grad_accum_steps: int = 1, where: str = "",
                       training: bool = False, names: Mapping[str, str] | None = None) -> None:
    """The checks that need no loader: params run them at load time, naming the file and line, and a
    :class:`StepOptions` when it is built (a training run's with ``training``, once, before any work).

    Raises:
        ParamsError: a value is not a positive integer, num_steps and num_epochs are both set, or
            nothing says how long to run while steps_per_epoch is set (or the run trains).
    """
    key = _keys(names)
    for name, value in (("num_steps", num_steps), ("max_steps", max_steps), ("num_epochs", num_epochs),
                        ("steps_per_epoch", steps_per_epoch), ("grad_accum_steps", grad_accum_steps)):
        _check(key[name], value, where)
    if num_steps is not None and num_epochs is not None:
        raise ParamsError(f"{where}{key['num_steps']} and {key['num_epochs']} are mutually exclusive; set one of them "
                          f"({key['max_steps']} may be combined with either)")
    if (training or steps_per_epoch is not None) and num_steps is None and num_epochs is None and max_steps is None:
        raise ParamsError(_no_length(key, where))


def _no_length(key: dict[str, str], where: str) -> str:
    return (f"{where}set one of {key['num_steps']}, {key['num_epochs']} or {key['max_steps']} to say how long to "
            f"run ({key['steps_per_epoch']} only sets the length of an epoch)")


@dataclass(frozen=True)
class StepOptions:
    """A run's step options, checked once when built (:func:`check_step_options`) and carried as this
    value; :meth:`budget` then needs only what the loader and the start checkpoint add.

    ``where`` heads every message and ``names`` says how the caller spells each option (the runner's
    ``runconfig.num_steps``, ``optimizer.grad_accum_steps``; the Trainer's ``loop.num_steps``).
    ``training`` adds the rule that a training run must be told how long to run.
    """

    num_steps: int | None = None
    max_steps: int | None = None
    num_epochs: int | None = None
    steps_per_epoch: int | None = None
    grad_accum_steps: int = 1
    where: str = ""
    names: Mapping[str, str] = field(default_factory=dict)
    training: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", MappingProxyType(_keys(self.names)))  # every option's spelling, once
        check_step_options(num_steps=self.num_steps, max_steps=self.max_steps, num_epochs=self.num_epochs,
                           steps_per_epoch=self.steps_per_epoch, grad_accum_steps=self.grad_accum_steps,
                           where=self.where, training=self.training, names=self.names)

    def budget(self, loader_batches: int | None, initial_step: int = 0) -> StepBudget:
        """The steps of one run (see the module docstring for the rules).

        Args:
            loader_batches: ``len(loader)``, or None for a loader without a length.
            initial_step: the global step the run starts at (from a loaded checkpoint).

        Raises:
            ParamsError: the options do not fit the loader or the start step; the message names the
                option and the fix.
        """
        where, key = self.where, self.names
        num_steps, max_steps, num_epochs = self.num_steps, self.max_steps, self.num_epochs
        steps_per_epoch, grad_accum_steps = self.steps_per_epoch, self.grad_accum_steps

        def fail(message: str) -> ParamsError:
            return ParamsError(f"{where}{message}")

        _check("initial step", initial_step, where, zero_ok=True)
        if loader_batches is not None:
            if loader_batches < 1:
                raise fail("the dataloader yields no batches; check its dataset size, batch_size and drop_last")
            if steps_per_epoch is not None and steps_per_epoch > loader_batches:
                raise fail(f"{key['steps_per_epoch']}={steps_per_epoch} exceeds the {loader_batches} batches "
                           f"one pass over the dataloader gives; set it to at most {loader_batches}")
            batches = steps_per_epoch if steps_per_epoch is not None else loader_batches
            if grad_accum_steps > batches:
                raise fail(f"{key['grad_accum_steps']}={grad_accum_steps} is greater than the {batches} batches "
                           f"per epoch, so no optimizer step is taken; lower it or enlarge the epoch")
            per_epoch = batches // grad_accum_steps
        else:
            if num_epochs is not None:
                raise fail(f"{key['num_epochs']} needs a dataloader with a length (this one has none, e.g. an "
                           f"IterableDataset); count the run in {key['num_steps']} or {key['max_steps']}")
            per_epoch = steps_per_epoch // grad_accum_steps if steps_per_epoch is not None else UNBOUNDED_EPOCH
            per_epoch = max(per_epoch, 1)
        candidates = []
        if num_epochs is not None:
            candidates.append(num_epochs * per_epoch)
        if num_steps is not None:
            candidates.append(num_steps)
        if max_steps is not None:
            if initial_step >= max_steps:
                raise MaxStepsReached(f"{where}the run starts at global step {initial_step}, which already reaches "
                                      f"{key['max_steps']}={max_steps}; raise {key['max_steps']} to train further, or "
                                      "start from step 0 (another model_dir, or no checkpoint)")
            candidates.append(max_steps - initial_step)
        if not candidates:
            raise ParamsError(_no_length(key, where))
        return StepBudget(steps=min(candidates), steps_per_epoch=per_epoch)


def step_budget(*, loader_batches: int | None, initial_step: int = 0, num_steps: int | None = None,
                max_steps: int | None = None, num_epochs: int | None = None, steps_per_epoch: int | None = None,
                grad_accum_steps: int = 1, where: str = "", names: dict[str, str] | None = None) -> StepBudget:
    """The steps of one run from options not checked before: :class:`StepOptions` (checked) and its
    :meth:`~StepOptions.budget` in one call (the cstorch API's ``compute_num_steps``).

    Raises:
        ParamsError: an invalid value or combination; the message names the option and the fix.
    """
    options = StepOptions(num_steps=num_steps, max_steps=max_steps, num_epochs=num_epochs,
                          steps_per_epoch=steps_per_epoch, grad_accum_steps=grad_accum_steps, where=where,
                          names=names or {})
    return options.budget(loader_batches, initial_step)


def is_final_step(run_step: int, total_steps: int) -> bool:
    """``run_step`` (1-based, counted from this run's start) is the run's last."""
    return run_step >= total_steps


def is_log_step(run_step: int, total_steps: int, log_steps: int | None) -> bool:
    """Every ``log_steps`` run steps, and the final step (``log_steps`` 0/None: the final step only)."""
    return is_final_step(run_step, total_steps) or bool(log_steps and run_step % log_steps == 0)


def is_checkpoint_step(run_step: int, total_steps: int, checkpoint_steps: int | None) -> bool:
    """Every ``checkpoint_steps`` run steps, and the final step, so a run never ends without its weights.

    ``checkpoint_steps`` 0/None means the final step only. (The vendor's DataExecutor checkpoints
    nothing then; cs-run keeps the final checkpoint, which its eval and resume read.)
    """
    return is_final_step(run_step, total_steps) or bool(checkpoint_steps and run_step % checkpoint_steps == 0)
