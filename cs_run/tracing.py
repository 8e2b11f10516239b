"""The public step API: ``compile``, ``trace`` (``compile_step``), ``step_closure``, ``checkpoint_closure``.

``trace`` decides per call from the current backend: on CSX the step is a
:class:`~cs_run.engine.step.CompiledStep` (traced once, compiled, replayed); on CPU/GPU the body runs
eagerly every call, with step closures queued until the step returns so both paths see the same
closure semantics.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, TypeVar

import torch

from cs_run import parallel
from cs_run.backend import Backend, _normalize_type, current_backend
from cs_run.backend import backend as _make_backend
from cs_run.engine import closures
from cs_run.engine.step import CompiledStep

__all__ = ["compile", "trace", "compile_step", "step_closure", "checkpoint_closure", "TracedStepFunction"]

logger = logging.getLogger(__name__)
M = TypeVar("M", bound=torch.nn.Module)


def compile(model: M, backend: Backend | str | None = None) -> M:  # noqa: A001 - the vendor's name
    """Prepares ``model`` for the backend: moves it to the backend's device. Returns the same module
    (a data-parallel wrapper of it with several replicas on CPU/GPU).

    Nothing is compiled here: the step is traced and compiled at its first call, when shapes are known.
    With the backend's ``cluster_config.num_csx`` > 1 this is where the replicas start (launched, or
    joined under torchrun: :func:`cs_run.replicas.start`); on CPU/GPU the model is then returned as a
    :class:`~cs_run.replicas.ReplicatedModule` (torch DDP: gradients averaged over the replicas in
    backward; ``state_dict`` and attributes are the model's). ``backend`` may be a :class:`Backend`, a
    backend type string (``"CSX"``; the vendor's ``"wse_ws"`` means CSX) or None for the current backend
    (CPU when none exists yet).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"cstorch.compile expects a torch.nn.Module, got {type(model).__name__}")
    if isinstance(backend, Backend):
        be = backend
    elif backend is None:
        be = current_backend(raise_exception=False, raise_warning=False) or _make_backend("CPU")
    else:
        current = current_backend(raise_exception=False, raise_warning=False)
        wanted = _normalize_type(backend)
        be = current if current is not None and current.backend_type == wanted else _make_backend(wanted)
    strategy = parallel.Strategy()  # a custom loop is data parallel (cs_run.parallel)
    strategy.start(be.cluster_config.num_csx, be.backend_type, be.cluster_config.collective_timeout)
    model.to(be.torch_device)
    if model not in be.models:
        be.models.append(model)
    return model if be.is_csx else strategy.wrap(model, be.torch_device)


class TracedStepFunction:
    """What ``@trace`` returns: a callable that is eager on CPU/GPU and a compiled step on CSX."""

    def __init__(self, fn: Callable) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self._compiled: Any = None
        self._compiled_for: Backend | None = None

    @property
    def compiled_step(self):
        """The :class:`~cs_run.engine.step.CompiledStep` once a CSX call happened, else None."""
        return self._compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        be = current_backend(raise_exception=False, raise_warning=False)
        if be is None or not be.is_csx:
            with closures.deferring():  # closures called in the step run when it returns
                return self.fn(*args, **kwargs)
        if self._compiled is None or self._compiled_for is not be:
            self._compiled, self._compiled_for = CompiledStep(self.fn, be.engine_options()), be
        return self._compiled(*args, **kwargs)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:  # decorating a method
        if obj is None:
            return self
        bound = obj.__dict__.get(f"__cs_run_traced_{self.fn.__name__}")
        if bound is None:
            bound = TracedStepFunction(self.fn.__get__(obj, objtype))
            obj.__dict__[f"__cs_run_traced_{self.fn.__name__}"] = bound
        return bound


def trace(step_fn: Callable) -> TracedStepFunction:
    """Decorates the function holding one whole training/eval iteration (vendor ``cstorch.trace``).

    On CSX the body runs once per input signature; Python values inside it keep their first value.
    """
    return TracedStepFunction(step_fn)


compile_step = trace


def step_closure(closure: Callable) -> Callable[..., None]:
    """Decorates a function that reads tensor values; it runs after the step on materialized values."""
    return closures.make_closure(closure, checkpoint=False)


def checkpoint_closure(closure: Callable) -> Callable[..., None]:
    """Like :func:`step_closure`, but runs only on checkpoint steps and the final step of the executor."""
    return closures.make_closure(closure, checkpoint=True)
