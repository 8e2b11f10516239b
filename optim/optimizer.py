"""The compliant optimizer base class: all state exists before the first step, the lr is a tensor.

A traced step (docs/architecture.md#the-csx-engine-cs_runengine) turns every tensor the optimizer reads or
writes into a graph input. That only works if (1) the state exists before the trace, so it can be bound, and (2) nothing in ``step`` depends
on tensor values or on Python numbers that change between steps. :class:`Optimizer` enforces (1) by
calling :meth:`preinitialize` at construction and refusing state created later, and gives (2) by keeping
every ``param_group['lr']`` as a 0-d tensor that schedulers update in place.
"""

from __future__ import annotations

import abc
import functools
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Self

import torch
from torch import Tensor

from cs_run._torch_compat import without_dynamo_wrapper
from cs_run.creation import full, zeros, zeros_like
from cs_run.errors import CheckpointError, ComplianceError

__all__ = ["Optimizer", "ParamsT"]

logger = logging.getLogger(__name__)

ParamsT = Iterable[Tensor] | Iterable[dict[str, Any]]
FOREACH_CHUNK_BYTES = 1 << 20  # parameters per multi-tensor chunk (see Optimizer._foreach_chunks)


_TORCH = {name: without_dynamo_wrapper(getattr(torch.optim.Optimizer, name))
          for name in ("add_param_group", "zero_grad", "state_dict", "load_state_dict")}


def _lr_tensor(value: Any, params: list[Tensor]) -> Tensor:
    """A 0-d lr tensor on the params' device; float64 only for float64 params, else float32."""
    ref = params[0] if params else None
    device = ref.device if ref is not None else torch.device("cpu")
    dtype = torch.float64 if ref is not None and ref.dtype == torch.float64 else torch.float32
    if isinstance(value, Tensor):
        return value.detach().to(device=device, dtype=dtype).reshape(()).clone()
    return full((), float(value), dtype=dtype, device=device)


def _scalar_dtype(device: torch.device) -> torch.dtype:
    """dtype for per-step scalar math (bias corrections): torch does it in Python doubles."""
    return torch.float32 if device.type == "mps" else torch.float64


def _check(name: str, value: Any, low: float = 0.0, high: float | None = None, *, high_open: bool = True) -> None:
    """Raise ValueError naming the hyper-parameter, its value and its range."""
    ok = value >= low and (high is None or (value < high if high_open else value <= high))
    if not ok:
        rng = f">= {low}" if high is None else f"in [{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"Invalid {name}: {value} (must be {rng})")


def _check_betas(betas: Any, count: int = 2) -> None:
    if not isinstance(betas, (tuple, list)) or len(betas) != count:
        raise ValueError(f"Invalid betas: {betas!r} (must be a tuple of {count} floats)")
    for index, beta in enumerate(betas):
        _check(f"beta at index {index}", beta, 0.0, 1.0)


# hyper-parameters that must be >= 0 (rho: in [0, 1]); each named "<key> value" in messages unless named here
_NON_NEGATIVE = ("lr", "eps", "weight_decay", "l2_regularization_rate", "momentum", "dampening", "alpha", "lambd",
                 "lr_decay", "initial_accumulator_value", "momentum_decay")
_MESSAGE_NAMES = {"lr": "learning rate", "eps": "epsilon value", "initial_accumulator_value": "initial_accumulator_value"}


def _checked_defaults(**defaults: Any) -> dict[str, Any]:
    """``defaults`` after checking, in their order, ``betas`` (kept as a tuple), ``rho`` and each
    ``_NON_NEGATIVE`` one."""
    for key, value in defaults.items():
        name = _MESSAGE_NAMES.get(key, f"{key} value")
        if key == "betas":
            _check_betas(value)
            defaults[key] = tuple(value)
        elif key == "rho":
            _check(name, value, 0.0, 1.0, high_open=False)
        elif key in _NON_NEGATIVE:
            _check(name, value)
    return defaults


def _state_size(state: dict) -> tuple[int, int]:
    """Cheap fingerprint of the state's layout: (#params with state, #state entries)."""
    return len(state), sum(len(s) for s in state.values())


def _checked_step(step: Callable) -> Callable:
    """Wrap a subclass's ``step`` so lazily created or missing state fails with a clear message."""

    @functools.wraps(step)
    def checked(self: Optimizer, *args: Any, **kwargs: Any) -> Any:
        before = _state_size(self.state)
        try:
            result = step(self, *args, **kwargs)
        except KeyError as err:
            if err.args and isinstance(err.args[0], str) and err.args[0] not in self.defaults:
                raise ComplianceError(
                    f"{type(self).__name__}.step() read optimizer state {err.args[0]!r}, which "
                    "preinitialize() did not create; create every state tensor in preinitialize()"
                ) from err
            raise
        if _state_size(self.state) != before:
            raise ComplianceError(self._new_state_message())
        return result

    checked._cs_checked = True  # type: ignore[attr-defined]
    return checked


class Optimizer(torch.optim.Optimizer, abc.ABC):
    """Base of Cerebras-compliant optimizers (the vendor's custom optimizer guide).

    Subclasses pass ``params`` and ``defaults`` like torch.optim and implement:

    * ``preinitialize()``: create **all** state tensors (with ``cs_run.zeros_like`` & co.). Called
      by this constructor; state created anywhere else raises :class:`~cs_run.errors.ComplianceError`.
    * ``step(closure=None)``: update params and state in place with torch ops only (no ``.item()``,
      no Python branching on tensor values; branching on hyper-parameters is fine).
    * ``state_names_to_sparsify()``: names of the state that follows the parameter's sparsity.

    Args:
        params: parameters or param-group dicts, as for torch.optim.
        defaults: default hyper-parameters of each group.
        enable_global_step: also keep ``state[p]["step"]``, a 0-d tensor counting this parameter's
            steps, created before ``preinitialize`` (see :meth:`increment_global_step`).

    Every ``param_group["lr"]`` is a 0-d tensor (float32, float64 for float64 params) on the params'
    device; schedulers copy into it, so a changing lr never changes a captured graph.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        if missing:
            raise TypeError(
                f"{cls.__name__} cannot be instantiated: it does not implement {', '.join(missing)}. "
                "A cs_run.optim.Optimizer must define preinitialize() (create all state), "
                "step(closure=None) (torch ops only) and state_names_to_sparsify()"
            )
        return super().__new__(cls)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        step = cls.__dict__.get("step")
        if step is not None and not getattr(step, "_cs_checked", False):
            cls.step = _checked_step(step)  # type: ignore[method-assign]

    def __init__(self, params: ParamsT, defaults: dict[str, Any], enable_global_step: bool = False) -> None:
        self.enable_global_step = enable_global_step
        self._constructed = False
        super().__init__(params, defaults)
        self._preinitialize_new(self.param_groups)
        self._constructed = True

    # -- state creation ------------------------------------------------------------------------
    @abc.abstractmethod
    def preinitialize(self) -> None:
        """Create every state tensor of every parameter (called once, by the constructor)."""

    @abc.abstractmethod
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update the parameters in place from their ``.grad`` with torch ops only."""

    def apply(self, f: Any) -> Any:
        """``optimizer.apply(sparsity)`` (the vendor's sparse API): ``f.apply(self)`` when ``f`` has an apply
        method, else ``f(self)``."""
        f_apply = getattr(f, "apply", None)
        if callable(f_apply):
            return f_apply(self)
        if callable(f):
            return f(self)
        raise TypeError(f"optimizer.apply expects a callable or an object with apply(), got {type(f).__name__}")

    @abc.abstractmethod
    def state_names_to_sparsify(self) -> list[str]:
        """Names of the state tensors that follow their parameter's sparsity pattern."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's add_param_group, plus a tensor lr and, after construction, the group's state."""
        _TORCH["add_param_group"](self, param_group)
        group = self.param_groups[-1]
        group["lr"] = _lr_tensor(group["lr"], group["params"])
        tags = group.get("tags")
        if tags:  # a set, as the vendor keeps it (schedulers' param_group_tags match against it)
            group["tags"] = set(tags) if isinstance(tags, (list, tuple, set, frozenset)) else {tags}
        if self._constructed:
            self._preinitialize_new([group])

    def _preinitialize_new(self, groups: list[dict[str, Any]]) -> None:
        """Run preinitialize for the params of ``groups``, keeping the state others already have."""
        kept = {p: dict(s) for p, s in self.state.items() if len(s)}  # preinitialize overwrites entries
        for group in groups:
            for p in group["params"]:
                self.state[p] = {}
                if self.enable_global_step:
                    self.state[p]["step"] = zeros((), dtype=_step_dtype(), device=p.device)
        self.preinitialize()
        self.state.update(kept)
        for group in self.param_groups:  # every param gets an entry, so step() never adds one
            for p in group["params"]:
                self.state[p]
        self._state_layout = [frozenset(self.state[p]) for g in self.param_groups for p in g["params"]]

    def _new_state_message(self) -> str:
        params = [p for g in self.param_groups for p in g["params"]]
        for index, (p, expected) in enumerate(zip(params, self._state_layout)):
            extra = sorted(set(self.state.get(p, {})) - expected)
            if extra:
                return (
                    f"{type(self).__name__}.step() created optimizer state {extra} for parameter {index}; "
                    "create all state in preinitialize() so it exists before the step is traced"
                )
        return (
            f"{type(self).__name__}.step() added state entries; create all state in preinitialize() "
            "so it exists before the step is traced"
        )

    def _zeros_like_params(self, *names: str) -> None:
        """``state[p][name] = zeros_like(p)`` for every parameter: the common preinitialize."""
        for group in self.param_groups:
            for p in group["params"]:
                for name in names:
                    self.state[p][name] = zeros_like(p)

    def _tensors(self, group: dict[str, Any], *names: str) -> tuple[list[Tensor], ...]:
        """``_group_tensors`` for per-tensor steps: the grads negated when ``maximize``."""
        params, grads, *lists = self._group_tensors(group, *names)
        if group.get("maximize", False):
            grads = [-g for g in grads]
        return (params, grads, *lists)

    def _group_tensors(self, group: dict[str, Any], *names: str) -> tuple[list[Tensor], ...]:
        """(params, grads, *state lists) of the params of ``group`` that have a grad.

        Params without a grad are skipped, like torch.optim; on CSX that choice is frozen at trace time.
        """
        params = [p for p in group["params"] if p.grad is not None]
        lists = [[self.state[p][name] for p in params] for name in names]
        return (params, [p.grad for p in params], *lists)

    def _foreach_chunks(self, group: dict[str, Any], *names: str) -> Iterator[tuple[list[Tensor], ...]]:
        """``_group_tensors`` for multi-tensor steps, in chunks of at most ``FOREACH_CHUNK_BYTES`` of
        parameters (a parameter larger than that is a chunk of its own), the grads negated when ``maximize``.

        Chunks keep each multi-tensor op's working set in cache across the rule's dozen passes: on CPU a
        whole-model foreach pass per line is about 2x slower than chunks of 1 MiB. On an accelerator the
        group is one chunk: torch's multi-tensor kernels split their work themselves, and each chunk
        more is a dozen more kernel launches (GPT-2 small's step made 2,818 on an H200, 2026-11-27).
        """
        params, grads, *lists = self._group_tensors(group, *names)
        limit = FOREACH_CHUNK_BYTES if params and params[0].device.type == "cpu" else math.inf
        start, size = 0, 0
        for end, p in enumerate(params + [None]):
            if end > start and (p is None or size + p.numel() * p.element_size() > limit):
                chunk_grads = grads[start:end]
                if group.get("maximize", False):
                    chunk_grads = list(torch._foreach_neg(chunk_grads))
                yield (params[start:end], chunk_grads, *(lst[start:end] for lst in lists))
                start, size = end, 0
            if p is not None:
                size += p.numel() * p.element_size()

    def increment_global_step(self, p: Tensor) -> Tensor:
        """Add 1 to ``state[p]["step"]`` in place and return it (needs ``enable_global_step``)."""
        step = self.state[p]["step"]
        step.add_(1)
        return step

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's zero_grad (see ``_undecorated``)."""
        _TORCH["zero_grad"](self, set_to_none)

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """torch's state_dict (see ``_undecorated``), a group's ``tags`` set as a sorted list (a checkpoint
        holds no sets; :meth:`load_state_dict` makes it a set again)."""
        state = _TORCH["state_dict"](self)
        for group in state["param_groups"]:  # torch packs each group into a new dict: the live groups keep their sets
            if isinstance(group.get("tags"), (set, frozenset)):
                group["tags"] = sorted(group["tags"], key=str)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load_state_dict, then copy every value into the existing tensors in place.

        A captured graph keeps pointing at the same storage, so loading a checkpoint never forces a
        retrace. Loaded state with an unknown name is dropped (logged); state the checkpoint lacks
        keeps its preinitialized value (logged).
        """
        old_state = {p: dict(s) for p, s in self.state.items()}
        old_groups = [dict(g) for g in self.param_groups]
        _TORCH["load_state_dict"](self, state_dict)
        for group, old_group in zip(self.param_groups, old_groups):  # e.g. a torch.optim checkpoint
            for key, value in old_group.items():
                group.setdefault(key, value)
        params = [p for g in self.param_groups for p in g["params"]]
        for index, p in enumerate(params):
            old, new = old_state.get(p, {}), self.state[p]
            for key in [k for k in new if k not in old]:
                logger.warning("Dropping unknown optimizer state %r of parameter %d", key, index)
                del new[key]
            for key, tensor in old.items():
                if key in new and isinstance(tensor, Tensor):
                    new[key] = _copy_into(tensor, new[key], f"state[{index}][{key!r}]")
                else:
                    if key not in new:
                        logger.warning("Checkpoint lacks optimizer state %r of parameter %d", key, index)
                    new[key] = tensor
        for group, old_group in zip(self.param_groups, old_groups):
            for key, value in old_group.items():  # lr, and a scheduled weight_decay: the tensors a graph captured
                if key != "params" and isinstance(value, Tensor) and isinstance(group.get(key), (Tensor, int, float)):
                    group[key] = _copy_into(value, group[key], f"param_groups[].{key}")
            if isinstance(group.get("tags"), (list, tuple)):
                group["tags"] = set(group["tags"])


class _CoreOptimizer(Optimizer):
    """Base of the built-in optimizers: ``step()`` is one loop, written once, that hands each param group
    to ``_step_group``, which gathers the group's tensors (``_tensors``, ``_foreach_chunks``) and calls
    the optimizer's module-level functional core with the group's hyper-parameters (torch.optim's shape:
    the class holds the settings, a function does the math)."""

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Re-evaluate the loss with ``closure`` (if given), then apply the rule to every param group."""
        loss = _run_closure(closure)
        for group in self.param_groups:
            self._step_group(group)
        return loss

    @abc.abstractmethod
    def _step_group(self, group: dict[str, Any]) -> None:
        """Update the params of ``group`` that have a grad, and their state, in place."""


def _run_closure(closure: Callable[[], Any] | None) -> Any:
    """Re-evaluate the loss with grad enabled when a closure is given (torch.optim's contract)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _step_dtype() -> torch.dtype:
    """torch.optim's dtype for step counters (float32 unless the default dtype is float64)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _copy_into(dst: Tensor, value: Any, where: str) -> Tensor:
    """Copy ``value`` into ``dst`` in place when shapes allow; return the tensor to keep."""
    if not isinstance(value, Tensor):
        if isinstance(value, (int, float)) and dst.numel() == 1:
            with torch.no_grad():
                dst.fill_(value)
            return dst
        raise CheckpointError(f"optimizer {where}: expected a tensor or number, got {type(value).__name__}")
    if value.shape == dst.shape or value.numel() == dst.numel() == 1:
        with torch.no_grad():
            dst.copy_(value.reshape(dst.shape))
        return dst
    logger.warning("optimizer %s: shape %s replaces %s (a traced step will retrace)", where,
                   tuple(value.shape), tuple(dst.shape))
    return value.to(device=dst.device)
