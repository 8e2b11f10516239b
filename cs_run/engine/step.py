"""``CompiledStep``: trace -> compile -> replay, tied together (docs/architecture.md#contracts).

The user's step runs once per input signature (at the trace); every later call replays the compiled
graph on the new batch. Python values inside the step are frozen at their first value: a Python
counter incremented in the step counts once, a Python ``if`` on a hyper-parameter is taken as it was
at the trace. Only tensors carry state between steps.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

from cs_run._torch_compat import pytree
from cs_run.batches import compile_time, move_to_device
from cs_run.engine import closures, replica_sync
from cs_run.engine.cache import open_cache
from cs_run.engine.compile import compile_graph, resolve_tier
from cs_run.engine.replay import replay
from cs_run.engine.state import discover_state
from cs_run.engine.trace import GraphSummary, OutputRef, TracedStep, flat_signature, trace_step
from cs_run.errors import ComplianceError
from cs_run.params import CompileTier

__all__ = ["CompiledStep", "EngineOptions", "RecompileError"]

logger = logging.getLogger(__name__)


class RecompileError(ComplianceError):
    """The step's input signature changed and retracing is disabled."""


@dataclass
class EngineOptions:
    """How a CSX step is compiled and run (set from the backend's options).

    Attributes:
        compile_tier: a :class:`~cs_run.params.CompileTier` (a string is checked here, the engine's own
            door) or None for ``compile.DEFAULT_TIER`` (see ``compile.py``).
        compile_dir: Where compiled artifacts are cached; None disables the cache.
        validate_only: Trace only: no compile, no execution (the step returns meta tensors).
        compile_only: Trace and compile into the cache, no execution.
        allow_recompile: A new input signature retraces (with a warning) instead of raising.
        device: Where batches are moved when they arrive on another device.
        cuda_graphs: On a CUDA device, replay the step as one CUDA graph where it can be captured
            (``cudagraph.py``); False runs it without.
    """

    compile_tier: CompileTier | None = None
    compile_dir: str | None = None
    validate_only: bool = False
    compile_only: bool = False
    allow_recompile: bool = True
    device: torch.device | None = None
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        if self.compile_tier is not None and not isinstance(self.compile_tier, CompileTier):
            self.compile_tier = CompileTier.parse(self.compile_tier)


class CompiledStep:
    """A traced step: ``step(*batch)`` traces on a new input signature, then replays."""

    def __init__(self, fn: Callable, options: EngineOptions | None = None) -> None:
        self._fn = fn
        self.options = options or EngineOptions()
        self._executables: dict[Any, tuple[TracedStep, Callable]] = {}
        self.recompiles = 0
        self.num_traces = 0
        self.last_summary: GraphSummary | None = None
        self.steps_left: Callable[[], int | None] | None = None
        """The steps its run still takes, the current one included (None: unknown), which tier auto weighs
        against an inductor build (``compile.py``); set by the runner, else the running loop's
        (``DataExecutor.steps_left``)."""

    def _steps_left(self) -> int | None:
        if self.steps_left is not None:
            return self.steps_left()
        return getattr(closures.current_loop(), "steps_left", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, spec = pytree.tree_flatten((args, kwargs))  # once per call: this is the replay's hot path
        device = self.options.device
        if device is not None and any(isinstance(x, torch.Tensor) and x.device != device for x in leaves):
            leaves = pytree.tree_leaves(move_to_device(leaves, device))
        sig = flat_signature(leaves, spec)
        batch = [x for x in leaves if isinstance(x, torch.Tensor)]  # the graph's batch inputs, in pytree order
        entry = self._executables.get(sig)
        if entry is None or not entry[0].state.still_bound():
            args, kwargs = pytree.tree_unflatten(leaves, spec)
            entry = self._build(sig, args, kwargs, batch, stale=entry is not None)
        traced, executable = entry
        if self.options.validate_only or self.options.compile_only:
            return _meta_outputs(traced)  # nothing runs; closures do not run either
        return replay(executable, traced, batch)

    def _build(self, sig: Any, args: tuple, kwargs: dict, batch: list[torch.Tensor],
               stale: bool) -> tuple[TracedStep, Callable]:
        with compile_time():  # left out of every throughput (cs_run.batches.RateMeter)
            return self._trace_and_compile(sig, args, kwargs, batch, stale)

    def _trace_and_compile(self, sig: Any, args: tuple, kwargs: dict, batch: list[torch.Tensor],
                           stale: bool) -> tuple[TracedStep, Callable]:
        if self._executables:
            why = "the model/optimizer state was replaced" if stale else "the input signature changed"
            if not self.options.allow_recompile:
                raise RecompileError(f"{_name(self._fn)}: {why} and retracing is disabled; keep batch shapes, "
                                     "dtypes and structure fixed (e.g. drop_last=True) or allow recompiles")
            self.recompiles += 1
            warnings.warn(f"cs-run: recompiling step {_name(self._fn)} (recompile #{self.recompiles}): {why}",
                          UserWarning, stacklevel=3)
        traced = trace_step(self._fn, discover_state(self._fn), args, kwargs)
        self.num_traces += 1
        self.last_summary = traced.summary
        logger.info("traced %s: %s", _name(self._fn), traced.summary.format())
        if self.options.validate_only:
            executable: Callable = traced.gm
        else:
            device = traced.state.tensors[0].device if traced.state.tensors else torch.device("cpu")
            tier = resolve_tier(self.options.compile_tier, device)
            if traced.replicas is not None:  # every replica runs the same tier and ordinal 0's weights
                tier = replica_sync.common_tier(tier)
                if not self.options.compile_only:
                    replica_sync.broadcast_model_state(traced.state)
            cache = open_cache(self.options.compile_dir) if self.options.compile_dir else None
            executable = compile_graph(traced, batch, tier, cache, self.recompiles, label=_name(self._fn),
                                       cuda_graphs=self.options.cuda_graphs, steps_left=self._steps_left)
        if stale:
            self._executables.clear()
        self._executables[sig] = (traced, executable)
        return traced, executable


def _meta_outputs(traced: TracedStep) -> Any:
    nodes = [n for n in traced.gm.graph.nodes if n.op == "output"][0].args[0]
    leaves = []
    for x in traced.out_leaves:
        if isinstance(x, OutputRef):
            val = nodes[x.index].meta.get("val") if isinstance(nodes[x.index], torch.fx.Node) else None
            leaves.append(torch.empty(val.shape, dtype=val.dtype, device="meta") if val is not None else None)
        else:
            leaves.append(x)
    return pytree.tree_unflatten(leaves, traced.out_spec)


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
