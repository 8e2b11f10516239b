"""Sparse weights as masks: ``cstorch.sparse.SparsityAlgorithm`` and the mask each weight gets.

A sparse weight keeps its dense tensor and gets a boolean mask, a persistent buffer ``<name>_mask``
of the module that owns it (so it is in the model's state dict and every checkpoint, as the vendor's).
``model.apply(sparsity)`` picks the weights, computes their first masks and zeroes the pruned entries;
then every forward re-applies the masks to the weights, the backward masks their gradients (pruned
entries get exactly zero, NaN included, before clipping sees them), and ``optimizer.apply(sparsity)``
masks the optimizer's state of each weight's shape before the step and the weights and that state
again after it, then lets the algorithm update the masks. All of it is tensor ops inside the step, so a
CSX step traces it once and replays it, bit-identical to the eager run. docs/architecture.md#sparsity.
"""

from __future__ import annotations

import abc
import sys
import weakref
from collections import OrderedDict
from typing import Any, Callable, Iterator, Optional, Union

import torch
from torch.utils.hooks import RemovableHandle
from torch.utils.weak import WeakIdKeyDictionary

from cs_run.engine import register_state
from cs_run.sparse.init import make_init_method
from cs_run.sparse.utils import HyperParameterSchedule, make_hyperparam_schedule

__all__ = ["ParamSchedules", "SparseParameter", "SparsityAlgorithm"]

ParamFilter = Callable[[str, torch.Tensor], bool]


class SparseParameter:
    """One sparse weight: the module that owns it, its full name and its mask buffer.

    The weight and the mask are looked up in the module each time (never held), so the CSX engine can
    bind both to its trace inputs."""

    def __init__(self, module: torch.nn.Module, name: str, mask: torch.Tensor) -> None:
        self._module = weakref.ref(module)
        self.name = name
        self.param_name = name.rsplit(".", 1)[-1]
        self.schedule: Optional[HyperParameterSchedule] = None
        """Its sparsity schedule (``algorithm.sparsity[param]`` when it was sparsified)."""
        self.mask_name = f"{self.param_name}_mask"
        module.register_buffer(self.mask_name, mask, persistent=True)

    @property
    def module(self) -> torch.nn.Module:
        module = self._module()
        if module is None:
            raise RuntimeError(f"the module of sparse parameter {self.name} no longer exists")
        return module

    @property
    def param(self) -> torch.Tensor:
        return self.module._parameters[self.param_name]

    @property
    def mask(self) -> torch.Tensor:
        return self.module._buffers[self.mask_name]

    @torch.no_grad()
    def prune(self, tensor: Optional[torch.Tensor] = None) -> None:
        """Zero ``tensor``'s (by default the weight's) entries where the mask is False, in place."""
        (self.param if tensor is None else tensor).mul_(self.mask)

    def __repr__(self) -> str:
        return f"SparseParameter({self.name})"


def _apply_root(module: torch.nn.Module) -> torch.nn.Module:
    """The module ``torch.nn.Module.apply`` was called on, when this call comes from inside it (it calls
    the function on every submodule, children first): the outermost apply frame's ``self``."""
    root, frame = module, sys._getframe(1)
    while frame is not None:
        if frame.f_code is torch.nn.Module.apply.__code__:
            root = frame.f_locals.get("self", root)
        frame = frame.f_back
    return root


class ParamSchedules:
    """``algorithm.sparsity``: each sparse weight's sparsity schedule, as the vendor's per-parameter mapping.

    ``sparsity={param: level, ...}`` (keys are the parameter tensors, values anything a schedule is made
    from) gives those weights their own schedules, and a weight not in it has none (an error when it is
    sparsified); a number or a schedule is the default of every weight. Assigning a default later keeps
    the per-parameter entries; assigning a mapping replaces them all (the vendor's setter)."""

    def __init__(self, per_param: Optional[dict] = None, default: Optional[HyperParameterSchedule] = None) -> None:
        self._per_param: WeakIdKeyDictionary = WeakIdKeyDictionary(per_param or {})
        self.default = default
        unique: dict[int, HyperParameterSchedule] = {}
        for schedule in [default, *self._per_param.values()]:
            if schedule is not None:
                unique.setdefault(id(schedule), schedule)
        # a plain list, so the CSX engine's state walk (which does not enter torch's weak mappings) finds
        # a cycling schedule's index
        self._schedules = list(unique.values())

    @classmethod
    def of(cls, value: Any, previous: Optional["ParamSchedules"] = None) -> "ParamSchedules":
        if isinstance(value, ParamSchedules):
            return value
        if isinstance(value, dict) and any(isinstance(k, torch.Tensor) for k in value):
            wrong = [k for k in value if not isinstance(k, torch.Tensor)]
            if wrong:
                raise ValueError(f"a per-parameter sparsity mapping is keyed by the parameters themselves (tensors), "
                                 f"got the key {wrong[0]!r}")
            return cls({p: make_hyperparam_schedule(v) for p, v in value.items()})
        kept = dict(previous._per_param) if previous is not None else {}
        return cls(kept, None if value is None else make_hyperparam_schedule(value))

    def __getitem__(self, param: torch.Tensor) -> HyperParameterSchedule:
        schedule = self._per_param.get(param, self.default)
        if schedule is None:
            raise ValueError("no sparsity level: the per-parameter sparsity mapping has no entry for this weight"
                             if len(self._per_param) else "no sparsity level was given")
        return schedule

    def __contains__(self, param: torch.Tensor) -> bool:
        return param in self._per_param or self.default is not None

    def schedules(self) -> list[HyperParameterSchedule]:
        """Every schedule, the default first, each once."""
        return list(self._schedules)


class SparsityAlgorithm(abc.ABC):
    """What decides each sparse weight's mask: its first mask and how it changes (:meth:`update`).

    Use it as the vendor's: ``model.apply(sparsity)`` then ``optimizer.apply(sparsity)``. Applied
    directly, an algorithm sparsifies every parameter of the module (except those marked
    ``requires_dense``); :func:`cs_run.sparse.configure` wraps it in a :class:`~cs_run.sparse.Group`
    with a parameter filter.
    """

    def __init__(self, sparsity: Union[float, dict, list, HyperParameterSchedule, None],
                 init_method: Union[str, Callable] = "random") -> None:
        self._sparsity = ParamSchedules.of(sparsity)
        self.init_method = make_init_method(init_method)
        self.sparse_params: "OrderedDict[str, SparseParameter]" = OrderedDict()
        self.autoupdate = True
        """Update the masks after every optimizer step (False: call :meth:`update` yourself)."""
        self._hooked: WeakIdKeyDictionary = WeakIdKeyDictionary()  # weight tensors holding this one's grad hook
        self._optimizers: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._target_sparsity_hooks: "OrderedDict[int, Callable]" = OrderedDict()
        self._computed_sparsity_hooks: "OrderedDict[int, Callable]" = OrderedDict()
        register_state(self)  # its step counter and schedule state are state of every traced step

    @property
    def num_sparse_params(self) -> int:
        return len(self.sparse_params)

    @property
    def sparsity(self) -> ParamSchedules:
        """Each weight's sparsity schedule: ``algorithm.sparsity[param]``."""
        return self._sparsity

    @sparsity.setter
    def sparsity(self, value: Any) -> None:
        self._sparsity = ParamSchedules.of(value, self._sparsity)

    # ---------------------------------------------------------------------------- module side
    def __call__(self, module: torch.nn.Module) -> None:
        """``model.apply(sparsity)``: torch calls this on every submodule; the model's call sparsifies it."""
        if _apply_root(module) is module:
            self.apply(module)

    def apply(self, obj: Union[torch.nn.Module, torch.optim.Optimizer]) -> None:
        """Sparsify a module's weights, or make an optimizer keep them sparse."""
        if isinstance(obj, torch.nn.Module):
            self.sparsify_module(obj)
        elif isinstance(obj, torch.optim.Optimizer):
            self.sparsify_optimizer(obj)
        else:
            raise TypeError(f"sparsity.apply expects a torch.nn.Module or an optimizer, got {type(obj).__name__}")

    def sparsify_module(self, module: torch.nn.Module, select: Optional[ParamFilter] = None) -> int:
        """Give every parameter of ``module`` that ``select(name, param)`` picks a mask; returns how many."""
        before = self.num_sparse_params
        for name, owner, param in _members(module):
            if select is None or select(name, param):
                self.sparsify_parameter(owner, name, param)
        added = self.num_sparse_params - before
        if added:
            module.register_forward_pre_hook(self._forward_pre_hook)
            self._after_sparsify()
        return added

    @torch.no_grad()
    def sparsify_parameter(self, module: torch.nn.Module, name: str, param: torch.Tensor) -> None:
        """Compute ``param``'s first mask (the sparsity at step 0), register it and prune the weight."""
        if getattr(param, "_sparse_param", None) is not None or getattr(param, "requires_dense", False):
            return
        try:
            level = torch.clamp(self.sparsity[param](torch.zeros((), dtype=torch.int64)), 0.0, 1.0)
            mask = self._initial_mask(param, level).to(device=param.device, dtype=torch.bool)
        except ValueError as e:  # no level for this weight, or an init method that cannot mask it: say which
            raise ValueError(f"{type(self).__name__} {name}: {e}") from None
        sparse = SparseParameter(module, name, mask)
        sparse.schedule = self.sparsity[param]  # by name from now on: a traced step binds other tensors
        param._sparse_param = sparse
        self.sparse_params[name] = sparse
        sparse.prune()

    def _initial_mask(self, param: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
        return self.init_method(param, level)

    def _after_sparsify(self) -> None:
        """Called once a module's weights have their masks (state moves to the weights' device)."""
        return None

    def _forward_pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        for sparse in self.sparse_params.values():
            param = sparse.param
            sparse.prune(param)
            if param.requires_grad and param not in self._hooked:  # the weight tensor this step sees
                self._hooked[param] = param.register_hook(lambda grad, s=sparse: self._grad_hook(s, grad))

    def _grad_hook(self, sparse: SparseParameter, grad: torch.Tensor) -> torch.Tensor:
        """Pruned entries' gradients are exactly zero (a select, so a NaN there does not survive)."""
        return torch.where(sparse.mask, grad, torch.zeros_like(grad))

    # ------------------------------------------------------------------------- optimizer side
    def sparsify_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Mask the optimizer's state before each step and weights and state after it, then :meth:`update`."""
        if optimizer in self._optimizers:
            return
        if self._optimizers:
            raise RuntimeError("one sparsity algorithm serves one optimizer")
        if not self.sparse_params:
            raise RuntimeError("optimizer.apply(sparsity) before model.apply(sparsity): sparsify the model first")
        self._optimizers[optimizer] = True
        optimizer.register_step_pre_hook(lambda opt, args, kwargs: self._prune_states(opt))
        optimizer.register_step_post_hook(lambda opt, args, kwargs: self._after_step(opt))

    def sparse_params_of(self, optimizer: Optional[torch.optim.Optimizer]) -> Iterator[SparseParameter]:
        """The sparse weights ``optimizer`` updates (all of them without one)."""
        if optimizer is None:
            yield from self.sparse_params.values()
            return
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        yield from (s for s in self.sparse_params.values() if id(s.param) in held)

    @torch.no_grad()
    def _prune_states(self, optimizer: torch.optim.Optimizer) -> None:
        for sparse in self.sparse_params_of(optimizer):
            for state in _state_like(optimizer, sparse.param):
                sparse.prune(state)

    def _prune_all(self, optimizer: Optional[torch.optim.Optimizer], sparse: SparseParameter) -> None:
        sparse.prune()
        for state in _state_like(optimizer, sparse.param):
            sparse.prune(state)

    def _after_step(self, optimizer: torch.optim.Optimizer) -> None:
        for sparse in self.sparse_params_of(optimizer):
            self._prune_all(optimizer, sparse)
        if self.autoupdate:
            self.update(optimizer)

    @abc.abstractmethod
    def update(self, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        """Update the masks after an optimizer step."""

    # ---------------------------------------------------------------------------- reporting
    def register_target_sparsity_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(algorithm, name, target)`` after each update with the scheduled sparsity level."""
        handle = RemovableHandle(self._target_sparsity_hooks)
        self._target_sparsity_hooks[handle.id] = hook
        return handle

    def register_computed_sparsity_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(algorithm, name, actual)`` after each update with a weight's mask's sparsity."""
        handle = RemovableHandle(self._computed_sparsity_hooks)
        self._computed_sparsity_hooks[handle.id] = hook
        return handle

    def _report_target(self, name: str, target: Any) -> None:
        for hook in self._target_sparsity_hooks.values():
            hook(self, name, target)

    def _report_computed(self, name: str, computed: Any) -> None:
        for hook in self._computed_sparsity_hooks.values():
            hook(self, name, computed)

    # ---------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> Any:
        """The algorithm's own state (the masks are the model's buffers)."""
        return {}

    def load_state_dict(self, state: Any) -> None:
        """Restore :meth:`state_dict`'s state into the existing tensors."""
        return None


def _state_like(optimizer: Optional[torch.optim.Optimizer], param: torch.Tensor) -> list[torch.Tensor]:
    """The optimizer's state tensors of ``param``'s shape (its moments), which follow its mask (the vendor's
    rule), except those marked ``requires_dense``."""
    if optimizer is None:
        return []
    return [value for value in optimizer.state.get(param, {}).values()
            if isinstance(value, torch.Tensor) and value.shape == param.shape
            and not getattr(value, "requires_dense", False)]


def _members(module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module, torch.Tensor]]:
    """(full name, owning module, parameter) of every parameter, modules marked requires_dense skipped."""
    for prefix, owner in module.named_modules():
        if getattr(owner, "requires_dense", False):
            continue
        for local, param in owner._parameters.items():
            if param is not None:
                yield (f"{prefix}.{local}" if prefix else local), owner, param
