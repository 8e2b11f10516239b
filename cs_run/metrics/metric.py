"""Base class of on-system metrics, the global registry of metrics by name, and a run's own metrics.

The registry keeps every metric under its name, several under one name as the vendor's does (names
need not be unique): :func:`get_all_metrics` reports a repeated name as ``name.0``, ``name.1``, ... in
registration order and a name held once as itself; a run's :class:`MetricSet` names its metrics the same
way (docs/architecture.md, "A run's metrics").

A metric keeps its running state in registered buffers (it is a ``torch.nn.Module``), so the CSX
engine discovers the state like a model's buffers, and ``update`` only does in-place tensor ops: an
update inside a traced step becomes part of the graph and each replay mutates the real state.
``compute`` is tensor-only too; it normally runs on the host after the run (``float(metric)``).

With several replicas each keeps the sums of its own shard; a host read (``float(metric)``,
:func:`compute_all_metrics`) first sums every state over the replicas, so it is a collective: every
replica reads, as the runners' eval does. A metric whose state is not a sum overrides
:meth:`Metric.reduce_state`.

The registry lives as long as the process (the vendor's does too), so a runner reports a
:class:`MetricSet` instead: the metrics of its own run, never those an earlier run or the program's
other code registered, and of those only the ones the run updated (docs/architecture.md, "A run's
metrics").

Every metric counts its updates in a tensor (``num_updates``, the vendor's property): an update
inside a compiled step is replayed without Python, so a Python counter would stop at the trace.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import sys
import types
from typing import Any, Callable, Iterable, Iterator

import torch

from cs_run import replicas

__all__ = [
    "Metric",
    "MetricSet",
    "compute_all_metrics",
    "discarded_registrations",
    "get_all_metrics",
    "register_metric",
    "reset_all_metrics",
    "unregister_metric",
]

logger = logging.getLogger(__name__)

_METRICS: dict[str, list[Metric]] = {}  # by name, in registration order (the vendor's Metric.registry)
_COLLECTING: list[MetricSet] = []  # the sets whose collecting() block is running
_SERIALS = itertools.count()

# Running sums are kept in float64: float32 stops counting exactly past 2**24 tokens, which a long
# LLM eval reaches. (The vendor keeps float32; results differ only in the last bits.)
STATE_DTYPE = torch.float64


class Metric(torch.nn.Module):
    """A named metric with tensor state: ``reset``, ``update``, ``compute``; calling it = update + compute.

    Subclasses register their state with :meth:`register_state` in ``__init__`` and implement
    :meth:`update` (in-place tensor ops only, no Python branching on tensor values) and
    :meth:`compute` (tensor ops, returns a tensor).

    Args:
        name: Name under which the metric is registered and reported (required, as in the vendor's
            ``Metric(name)``; None: the class name).
            Names need not be unique: a second metric of the same name is registered beside the
            first, and the two are reported as ``name.0`` and ``name.1``.
        compute_on_system: Accepted for compatibility with the vendor API; cs-run always keeps the
            state on the device and computes from it, so the flag has no effect.
    """

    def __init__(self, name: str | None, compute_on_system: bool = True) -> None:
        super().__init__()
        if name is None or name == "":
            name = type(self).__name__
        if not isinstance(name, str):
            raise TypeError(f"Metric name must be a string, got {name!r}")
        self.name = name
        self.compute_on_system = compute_on_system
        self._initial_values: dict[str, torch.Tensor] = {}
        self._in_update = False
        self._serial = next(_SERIALS)  # the registration order, across names
        # Updates since the last reset, counted on the device (a compiled step replays the increment).
        self.register_buffer("_updates", torch.zeros((), dtype=torch.int64), persistent=False)
        # The modules whose import made this metric, innermost first, with their specs (which tell one
        # import of a module from the next); empty when not made at import (not a module-level metric).
        self._imported_from = _modules_being_imported()
        register_metric(self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "update" in cls.__dict__:  # every class's own update counts (once per outermost call)
            cls.update = _counting(cls.__dict__["update"])

    @property
    def num_updates(self) -> int:
        """Updates since the last reset (on this replica; a host read)."""
        return int(self._updates)

    # -- state -----------------------------------------------------------------------------------
    def register_state(self, name: str, value: torch.Tensor) -> None:
        """Registers a state tensor (a buffer) whose initial value ``reset`` restores in place."""
        if name in self._initial_values:
            raise ValueError(f"Metric {self.name!r} already has a state named {name!r}")
        self._initial_values[name] = value.detach().clone()
        # Non-persistent: a metric held by a model (``self.accuracy = AccuracyMetric(...)``) must not
        # add its running sums to the model's checkpoints. The engine still finds it in buffers().
        self.register_buffer(name, value.detach().clone(), persistent=False)

    def state_names(self) -> list[str]:
        """Names of the state tensors, in registration order."""
        return list(self._initial_values)

    def reset(self) -> None:
        """Restores every state tensor to its initial value, in place (tensor identity is kept, so
        a compiled step that captured the state keeps updating the same tensors)."""
        with torch.no_grad():
            for name, initial in self._initial_values.items():
                getattr(self, name).copy_(initial)
            self._updates.zero_()

    def _apply(self, fn: Any, recurse: bool = True) -> Metric:
        """``.to()``/``.half()`` on a model move its metrics but keep their accumulator dtypes:
        counting in bfloat16 would stop at 256."""
        super()._apply(fn, recurse)
        for name, initial in self._initial_values.items():
            buf = getattr(self, name)
            if buf.dtype != initial.dtype:
                setattr(self, name, buf.to(initial.dtype))
        return self

    def _to_device_of(self, tensor: torch.Tensor) -> None:
        """Moves the state to ``tensor``'s device on first use (the metric may be built before the
        backend moved the model). Compares devices only, never values, so it is trace-safe."""
        for buf in self.buffers():
            if buf.device != tensor.device:
                self.to(tensor.device)
                self._initial_values = {
                    k: v.to(tensor.device) for k, v in self._initial_values.items()
                }
            return

    # -- to implement ----------------------------------------------------------------------------
    def update(self, *args: Any, **kwargs: Any) -> None:
        """Accumulates one batch into the state (tensor ops only)."""
        raise NotImplementedError

    def compute(self) -> torch.Tensor:
        """The metric value from the current state, as a tensor."""
        raise NotImplementedError

    # -- conveniences ----------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``metric(...)``: update with this batch, then return the running value (a tensor)."""
        self.update(*args, **kwargs)
        return self.compute()

    def reduce_state(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """``value`` of state ``name`` over all replicas: the sum (every built-in metric keeps sums)."""
        return replicas.all_reduce_sum(value)

    @contextlib.contextmanager
    def replicas_reduced(self) -> Iterator[Metric]:
        """Inside the block the state is that of all replicas together (one collective per state);
        the replica's own state is back afterwards, so reading twice never counts twice."""
        if replicas.world_size() == 1 or not replicas.joined():
            yield self
            return
        own = {name: getattr(self, name) for name in [*self._initial_values, "_updates"]}
        for name, value in own.items():
            setattr(self, name, replicas.all_reduce_sum(value) if name == "_updates" else self.reduce_state(name, value))
        try:
            yield self
        finally:
            for name, value in own.items():
                setattr(self, name, value)

    def __float__(self) -> float:
        # Host read: syncs with the device once. Use after the run or inside a step closure.
        with self.replicas_reduced():
            return float(self.compute())

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


def _counting(update: Callable) -> Callable:
    """``update`` that adds one to the metric's update count (a subclass's update that calls its base's
    counts once); the count is a tensor op, so it is part of a traced step."""

    @functools.wraps(update)
    def counted(self: Metric, *args: Any, **kwargs: Any) -> Any:
        if self._in_update:
            return update(self, *args, **kwargs)
        self._in_update = True
        try:
            result = update(self, *args, **kwargs)
        finally:
            self._in_update = False
        with torch.no_grad():
            self._updates.add_(1)  # on the state's device: update moved it there
        return result

    return counted


def _modules_being_imported() -> tuple[tuple[str, Any], ...]:
    """The modules whose import is running on this thread's stack, innermost first: (name, its spec)."""
    names = []
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            spec = frame.f_globals.get("__spec__")
            if getattr(spec, "_initializing", False):  # importlib's mark of a module being executed
                names.append((frame.f_globals.get("__name__"), spec))
        frame = frame.f_back
    return tuple(names)


def imported_metrics(modules: Iterable[str]) -> list[Metric]:
    """The registered metrics made while one of ``modules``, or a module one of them names (imports)
    at module level, was being imported: the module-level metrics of a run's code, whoever imported it
    first (docs/architecture.md, "A run's metrics")."""
    names = set(modules)
    for name in list(names):
        module = sys.modules.get(name)
        for value in vars(module).values() if module is not None else ():
            owner = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
            if isinstance(owner, str):
                names.add(owner)
    return [m for held in _METRICS.values() for m in held if any(
        name in names and getattr(sys.modules.get(name), "__spec__", None) is spec for name, spec in m._imported_from)]


def _registered(metric: Metric) -> bool:
    return any(m is metric for m in _METRICS.get(metric.name, ()))


def register_metric(metric: Metric) -> None:
    """Adds ``metric`` to the global registry, after the metrics already registered under its name
    (a metric already registered is left where it is)."""
    if not _registered(metric):
        _METRICS.setdefault(metric.name, []).append(metric)
    for collected in _COLLECTING:
        collected.add(metric)


def unregister_metric(name_or_metric: str | Metric) -> None:
    """Removes a metric from the registry: a name removes every metric registered under it, a metric
    only itself (no error when there is none)."""
    if isinstance(name_or_metric, Metric):
        held = _METRICS.get(name_or_metric.name, [])
        held[:] = [m for m in held if m is not name_or_metric]
        if not held:
            _METRICS.pop(name_or_metric.name, None)
    else:
        _METRICS.pop(name_or_metric, None)


@contextlib.contextmanager
def discarded_registrations() -> Iterator[None]:
    """Metrics registered inside the block leave no trace: out of the registry afterwards and never added
    to a running :meth:`MetricSet.collecting` set (a trial build of a model, e.g. on the meta device,
    that the run does not keep)."""
    before = {id(m) for held in _METRICS.values() for m in held}
    collecting = _COLLECTING[:]
    _COLLECTING.clear()
    try:
        yield
    finally:
        _COLLECTING[:] = collecting
        for metric in [m for held in _METRICS.values() for m in held if id(m) not in before]:
            unregister_metric(metric)


def reported_names(metrics: Iterable[Metric]) -> Iterator[tuple[str, Metric]]:
    """``(name, metric)`` grouped by name (at the name's first place), a name held by several metrics
    numbered ``name.0``, ``name.1``, ... in their order, a name held once as itself: the vendor's
    ``get_all_metrics`` rule."""
    by_name: dict[str, list[Metric]] = {}
    for metric in metrics:
        by_name.setdefault(metric.name, []).append(metric)
    for name, held in by_name.items():
        for i, metric in enumerate(held):
            yield (f"{name}.{i}" if len(held) > 1 else name), metric


def get_all_metrics() -> Iterator[tuple[str, Metric]]:
    """Every registered metric as ``(name, metric)`` pairs, as the vendor's generator yields them:
    grouped by name in registration order, a repeated name as ``name.0``, ``name.1``, ...
    (``dict(get_all_metrics())`` is a mapping)."""
    return reported_names([m for held in _METRICS.values() for m in held])


def compute_all_metrics() -> dict[str, float]:
    """The value of every registered metric as a Python float, by its :func:`get_all_metrics` name
    (one host read per metric)."""
    return {name: float(metric) for name, metric in get_all_metrics()}


def reset_all_metrics() -> None:
    """Resets every registered metric's state in place, e.g. before an eval pass."""
    for held in _METRICS.values():
        for metric in held:
            metric.reset()


class MetricSet:
    """The metrics of one run: those registered while :meth:`collecting` runs (the run imports the
    user's modules, builds the model, runs its steps; the Model Zoo's R_1.x rule, whose global
    registry served one run per process) and those :meth:`add_module` finds in the model (the Model
    Zoo 2.x rule: metrics attached to the model). They are named as :func:`get_all_metrics` names the
    registry, counting the set's own metrics only: in registration order, two of one name as
    ``name.0`` and ``name.1`` (none is dropped, as the Model Zoo 2.3 runner reported every
    ``get_all_metrics`` entry; docs/architecture.md, "A run's metrics")."""

    def __init__(self) -> None:
        self._members: list[Metric] = []

    @contextlib.contextmanager
    def collecting(self) -> Iterator[MetricSet]:
        """Inside the block every newly registered metric joins this set (blocks may nest)."""
        _COLLECTING.append(self)
        try:
            yield self
        finally:
            _COLLECTING.remove(self)

    def add(self, metric: Metric) -> None:
        if not any(m is metric for m in self._members):
            self._members.append(metric)
            self._members.sort(key=lambda m: m._serial)  # registration order, as the registry's

    def add_module(self, module: torch.nn.Module) -> None:
        """Adds every metric among ``module.modules()``, in module order."""
        for sub in module.modules():
            if isinstance(sub, Metric):
                self.add(sub)

    def update(self, other: MetricSet) -> None:
        """Adds ``other``'s metrics."""
        for metric in other._members:
            self.add(metric)

    def metrics(self) -> dict[str, Metric]:
        """The set's metrics by the names it reports them under (``name.i`` for a repeated name)."""
        return dict(reported_names(self._members))

    def add_imported(self, modules: Iterable[str]) -> None:
        """Adds the module-level metrics of ``modules`` (:func:`imported_metrics`): a run's, also when an
        earlier run or the program imported them first."""
        for metric in imported_metrics(modules):
            self.add(metric)

    def compute(self) -> dict[str, float]:
        """The value of every metric updated since its reset, as a Python float (a host read each; a
        collective with replicas). A metric nobody updated is left out with a warning, as the Model Zoo
        2.x trainer skips an unused metric: its value would be a division by zero, not a result."""
        values = {}
        for name, metric in reported_names(self._members):
            with metric.replicas_reduced():
                if metric.num_updates == 0:
                    logger.warning("Metric %s was not updated in this evaluation: not reported (update it in the "
                                   "eval step, or remove it)", name)
                    continue
                values[name] = float(metric.compute())
        return values

    def reset(self) -> None:
        """Resets the set's metrics in place (only these: other runs' and the program's stay as they are)."""
        for metric in self._members:
            metric.reset()
