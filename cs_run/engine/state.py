"""State discovery and temporary binding (docs/architecture.md#the-csx-engine-cs_runengine).

Everything a step reads or mutates becomes a graph input. Three sources, in this order:

1. **Walked objects.** The step function's closure cells, the globals its code names, its defaults
   and (for bound methods) ``__self__`` are walked a few levels deep. Every ``torch.nn.Module``
   found contributes its parameters and buffers (metrics are modules, so their state comes this way),
   every ``torch.optim.Optimizer`` its param-group tensors (``lr`` as a 0-d tensor, ...) and per-param
   state tensors, and every other object with tensor attributes (LR schedulers' ``last_epoch``, grad
   scalers, user objects) those attributes, including tensors one level inside dict/list attributes.
2. **Registered objects.** :func:`register_state` adds an object that the walk might not reach (for
   example one only reachable through a C extension or a weak reference). Held weakly.
3. **Lifted tensors.** Any other real tensor the step touches is seen by the trace's function mode
   and lifted to an input automatically (the trace runs again once with it); see ``trace.py``.

Binding swaps the real tensors for the trace's fake inputs *in their containers* and restores them in
``finally``; nothing stays swapped after the trace. A container that holds a different tensor at the
end of the step than the one bound was *rebound* by the step (``self.x = self.x + 1``): the new value
becomes a graph output that replay copies into the real tensor, so tensor identity is kept.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from types import FunctionType, MethodType, ModuleType
from typing import Any, Callable, Iterator

import torch

__all__ = ["Slot", "StateSet", "discover_state", "optimizer_state_rebinds", "register_state", "unregister_state"]

_REGISTRY: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_MAX_DEPTH = 4
_SKIP_MODULE_PREFIXES = ("torch", "numpy", "builtins", "typing", "collections", "functools", "logging")


def register_state(obj: Any) -> Any:
    """Makes every traced CSX step treat ``obj``'s tensor attributes as state (held weakly).

    For objects a step uses without the walk reaching them. Modules, optimizers and objects the step
    closes over need no registration. Returns ``obj`` so it can be used as a decorator-style call.
    """
    _REGISTRY[id(obj)] = obj
    return obj


def unregister_state(obj: Any) -> None:
    """Undoes :func:`register_state` (no error when ``obj`` was not registered)."""
    _REGISTRY.pop(id(obj), None)


@dataclass
class Slot:
    """One state tensor: where it lives (``container[key]``), its name and the real tensor."""

    name: str
    container: Any  # a dict (module._parameters, param group, optimizer state) or an object
    key: Any
    tensor: torch.Tensor
    kind: str  # parameter | buffer | optimizer | object | lifted

    def get(self) -> Any:
        if isinstance(self.container, (dict, list)):
            return self.container[self.key]
        return getattr(self.container, self.key)

    def set(self, value: Any) -> None:
        if isinstance(self.container, (dict, list)):
            self.container[self.key] = value
        else:
            object.__setattr__(self.container, self.key, value)


@dataclass
class StateSet:
    """The state of a step: slots (one per distinct tensor) plus the optimizers to re-key."""

    slots: list[Slot] = field(default_factory=list)
    aliases: list[Slot] = field(default_factory=list)  # same tensor held in a second place (tied weights)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    modules: list[torch.nn.Module] = field(default_factory=list)
    opt_state_index: dict[tuple[int, Any], int] = field(default_factory=dict)  # (id(param), name) -> slot
    _index: dict[int, int] = field(default_factory=dict)
    _bindings: tuple[int, list[tuple[Any, Any, torch.Tensor]]] = (0, [])  # (len(slots), still_bound's triples)

    def add(self, name: str, container: Any, key: Any, tensor: torch.Tensor, kind: str) -> None:
        slot = Slot(name, container, key, tensor, kind)
        if id(tensor) in self._index:
            self.aliases.append(slot)
        else:
            self._index[id(tensor)] = len(self.slots)
            self.slots.append(slot)

    def index_of(self, tensor: torch.Tensor) -> int | None:
        return self._index.get(id(tensor))

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [s.tensor for s in self.slots]

    def still_bound(self) -> bool:
        """True when every container still holds its tensor (an identity check before every replay, so
        it loops over prepared (container, key, tensor) triples rather than calling ``Slot.get``)."""
        if self._bindings[0] != len(self.slots):  # slots are only added (lifted) during the trace
            self._bindings = (len(self.slots), [(s.container, s.key, s.tensor) for s in self.slots
                                                if s.kind != "lifted"])
        for container, key, tensor in self._bindings[1]:
            if (container[key] if isinstance(container, (dict, list)) else getattr(container, key)) is not tensor:
                return False
        return True

    @contextlib.contextmanager
    def bind(self, fakes: list[torch.Tensor]) -> Iterator[dict[int, torch.Tensor]]:
        """Points every slot at its fake input for the duration of the trace; restores in ``finally``.

        Yields ``id(real) -> fake``, which the trace uses to substitute stray real tensors.
        """
        mapping = {id(s.tensor): f for s, f in zip(self.slots, fakes)}
        bound: list[Slot] = []
        opt_saved: list[tuple[torch.optim.Optimizer, Any, list]] = []
        try:
            for slot in self.slots + self.aliases:
                if slot.kind in ("lifted", "optimizer_state"):
                    continue
                slot.set(mapping[id(slot.tensor)])
                bound.append(slot)
            for opt in self.optimizers:
                opt_saved.append(_bind_optimizer(opt, mapping))
            yield mapping
        finally:
            for opt, state, params in reversed(opt_saved):
                opt.state = state
                for group, ps in zip(opt.param_groups, params):
                    group["params"] = ps
            for slot in reversed(bound):
                slot.set(slot.tensor)

    def rebound(self, mapping: dict[int, torch.Tensor]) -> list[tuple[int, Any]]:
        """Slots whose container now holds something other than the fake bound to it: (slot, value)."""
        out = []
        for i, slot in enumerate(self.slots):
            if slot.kind in ("lifted", "optimizer_state"):
                continue
            value = slot.get()
            if value is not mapping[id(slot.tensor)]:
                out.append((i, value))
        return out


def _bind_optimizer(opt: torch.optim.Optimizer, mapping: dict[int, torch.Tensor]) -> tuple:
    """Re-keys ``opt.state`` by the fake params and points param groups at the fakes."""
    saved_state, saved_params = opt.state, [g["params"] for g in opt.param_groups]
    new_state: defaultdict = defaultdict(dict)
    for p, st in saved_state.items():
        new_state[mapping.get(id(p), p)] = {k: mapping.get(id(v), v) if isinstance(v, torch.Tensor) else v
                                            for k, v in st.items()}
    opt.state = new_state
    for g in opt.param_groups:
        g["params"] = [mapping.get(id(p), p) for p in g["params"]]
    return opt, saved_state, saved_params


def optimizer_state_rebinds(state: StateSet, mapping: dict[int, torch.Tensor]) -> tuple[list, list[str]]:
    """While bound: optimizer state entries the step replaced ``(slot index, value)`` or created (names).

    A created tensor entry means the optimizer initialises state lazily inside ``step()``, which a
    replayed graph cannot do: the caller turns it into a ComplianceError.
    """
    inverse = {id(f): rid for rid, f in mapping.items()}
    changed, created = [], []
    for opt in state.optimizers:
        for fake_p, st in opt.state.items():
            real_id = inverse.get(id(fake_p))
            for k, v in st.items():
                idx = state.opt_state_index.get((real_id, k))
                if idx is None:
                    if isinstance(v, torch.Tensor):
                        created.append(f"{type(opt).__name__}.state[...][{k!r}]")
                elif v is not mapping[id(state.slots[idx].tensor)]:
                    changed.append((idx, v))
    return changed, created


def discover_state(fn: Callable, extra: tuple = ()) -> StateSet:
    """Walks ``fn`` (and ``extra`` objects) for modules, optimizers and tensor-holding objects."""
    found: dict[int, Any] = {}
    order: list[Any] = []
    _walk(fn, found, order, depth=0)
    gc.collect()  # a registered object of an earlier run that only a reference cycle keeps is not this step's
    for obj in list(extra) + list(_REGISTRY.values()):
        _walk(obj, found, order, depth=0)
    state = StateSet()
    modules = [o for o in order if isinstance(o, torch.nn.Module)]
    for obj in modules:  # modules first: parameter slots get module names, not optimizer ones
        _add_module(state, obj, _name_of(obj, found))
    for obj in order:
        if isinstance(obj, torch.optim.Optimizer):
            _add_optimizer(state, obj, _name_of(obj, found))
        elif not isinstance(obj, torch.nn.Module):
            _add_object(state, obj, _name_of(obj, found))
    return state


def _name_of(obj: Any, found: dict[int, Any]) -> str:
    return getattr(obj, "_cs_run_state_name", None) or type(obj).__name__


def _add_module(state: StateSet, module: torch.nn.Module, prefix: str) -> None:
    if module in state.modules:
        return
    state.modules.append(module)
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        base = f"{prefix}.{mod_name}" if mod_name else prefix
        for k, p in mod._parameters.items():
            if p is not None:
                state.add(f"{base}.{k}", mod._parameters, k, p, "parameter")
        for k, b in mod._buffers.items():
            if b is not None:
                state.add(f"{base}.{k}", mod._buffers, k, b, "buffer")


def _add_optimizer(state: StateSet, opt: torch.optim.Optimizer, prefix: str) -> None:
    if opt in state.optimizers:
        return
    state.optimizers.append(opt)
    for gi, group in enumerate(opt.param_groups):
        for pi, p in enumerate(group["params"]):
            if state.index_of(p) is None:  # a param of no walked module
                state.add(f"{prefix}.param_groups.{gi}.params.{pi}", group["params"], pi, p, "parameter")
        for k, v in group.items():
            if k != "params" and isinstance(v, torch.Tensor):
                state.add(f"{prefix}.param_groups.{gi}.{k}", group, k, v, "optimizer")
    for pi, (p, st) in enumerate(opt.state.items()):
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                state.add(f"{prefix}.state.{pi}.{k}", st, k, v, "optimizer_state")
                state.opt_state_index[(id(p), k)] = state.index_of(v)


def _add_object(state: StateSet, obj: Any, prefix: str) -> None:
    for k, v in list(vars(obj).items()):
        if isinstance(v, torch.Tensor):
            state.add(f"{prefix}.{k}", obj, k, v, "object")
        elif isinstance(v, dict):
            for dk, dv in v.items():
                if isinstance(dv, torch.Tensor):
                    state.add(f"{prefix}.{k}.{dk}", v, dk, dv, "object")
        elif isinstance(v, list):
            for i, dv in enumerate(v):
                if isinstance(dv, torch.Tensor):
                    state.add(f"{prefix}.{k}.{i}", v, i, dv, "object")


def _is_library(obj: Any) -> bool:
    mod = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", "") or ""
    return mod.startswith(_SKIP_MODULE_PREFIXES)


def _walk(obj: Any, found: dict[int, Any], order: list[Any], depth: int) -> None:
    """Collects modules, optimizers and tensor-holding objects reachable from ``obj``."""
    if depth > _MAX_DEPTH or id(obj) in found or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    if isinstance(obj, (torch.Tensor, ModuleType, type)):
        return
    if isinstance(obj, (torch.nn.Module, torch.optim.Optimizer)):
        found[id(obj)] = obj
        order.append(obj)
        if isinstance(obj, torch.optim.Optimizer):
            return
        for v in vars(obj).values():  # a module may hold an optimizer or scheduler as an attribute
            if not isinstance(v, (dict, torch.Tensor)):
                _walk(v, found, order, depth + 1)
        return
    found[id(obj)] = obj
    if isinstance(obj, MethodType):
        _walk(obj.__self__, found, order, depth)
        _walk(obj.__func__, found, order, depth)
    elif isinstance(obj, FunctionType):
        _walk_function(obj, found, order, depth)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in list(obj)[:256]:
            _walk(v, found, order, depth + 1)
    elif isinstance(obj, dict):
        for v in list(obj.values())[:256]:
            _walk(v, found, order, depth + 1)
    elif isinstance(obj, weakref.ref):
        _walk(obj(), found, order, depth + 1)
    elif isinstance(obj, functools.partial):
        _walk((obj.func, obj.args, obj.keywords), found, order, depth + 1)
    elif hasattr(obj, "__dict__"):
        _walk_object(obj, found, order, depth)


def _walk_object(obj: Any, found: dict[int, Any], order: list[Any], depth: int) -> None:
    """A plain object: state if it holds tensors; its other attributes are walked on."""
    try:
        attrs = list(vars(obj).values())[:256]
    except TypeError:
        return
    holds_tensors = _has_tensor_attr(obj)
    if _is_library(obj) and not holds_tensors:
        return
    if holds_tensors:
        order.append(obj)
    for v in attrs:
        if not isinstance(v, torch.Tensor):
            _walk(v, found, order, depth + 1)


def _has_tensor_attr(obj: Any) -> bool:
    try:
        values = vars(obj).values()
    except TypeError:
        return False
    for v in values:
        if isinstance(v, torch.Tensor):
            return True
        if isinstance(v, dict) and any(isinstance(x, torch.Tensor) for x in v.values()):
            return True
    return False


def _walk_function(fn: FunctionType, found: dict[int, Any], order: list[Any], depth: int) -> None:
    if _is_library(fn) or fn.__module__ in ("cs_run.tracing", "cs_run.engine.step"):
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None:
            _walk(wrapped, found, order, depth)
        return
    for cell in fn.__closure__ or ():
        try:
            _walk(cell.cell_contents, found, order, depth + 1)
        except ValueError:  # empty cell
            pass
    for name in _code_names(fn.__code__):
        if name in fn.__globals__:
            _walk(fn.__globals__[name], found, order, depth + 1)
    for d in fn.__defaults__ or ():
        _walk(d, found, order, depth + 1)
    if getattr(fn, "__wrapped__", None) is not None:
        _walk(fn.__wrapped__, found, order, depth)


def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _code_names(const)
    return names
