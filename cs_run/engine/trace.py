"""Trace a whole step once into an aten-level fx graph with fake tensors (docs/architecture.md#the-csx-engine-cs_runengine).

``trace_step`` binds the state to fake inputs, runs the user's step under
``make_fx(tracing_mode="fake")`` (no compute, no memory: validate-only is cheap) and returns a
:class:`TracedStep`. Autograd runs *during* the trace, so ``loss.backward()`` and the optimizer's
in-place updates are recorded as aten ops; replaying the graph needs no autograd and mutates the
real state tensors in place.

Graph outputs, in order (:class:`OutputLayout`): the user's tensor outputs, new values of rebound
state slots, gradients the step leaves on parameters, then the (cloned) tensor arguments of step
closures called in the step. See docs/architecture.md#contracts.

With data-parallel replicas the function mode also hands every torch call to a
``replica_sync.TraceSync``, which traces the gradient all-reduce into the graph
(docs/architecture.md#replicas-on-csx).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from cs_run import parallel
from cs_run._torch_compat import FakeTensor, is_data_dependent_error, make_fx, proxy_node, pytree
from cs_run.engine import closures, dtype_rules, replica_sync
from cs_run.engine.compliance import compliance_error, is_value_read, library_hint, user_frame_location
from cs_run.engine.state import Slot, StateSet, optimizer_state_rebinds
from cs_run.errors import ComplianceError
from cs_run.parallel.strategy import ReplicaGroup

__all__ = ["GraphSummary", "OutputLayout", "OutputRef", "TracedStep", "flat_signature", "input_signature",
           "trace_step"]

logger = logging.getLogger(__name__)


@dataclass
class GraphSummary:
    """What validate-only reports about a traced step."""

    num_ops: int
    op_counts: dict[str, int]
    num_parameters: int  # parameter elements
    num_state_tensors: int
    state_bytes: int
    input_signature: list[str]
    estimated_memory_bytes: int  # state + batch + every intermediate (an upper bound of the peak)
    trace_seconds: float
    state_names: list[str] = field(default_factory=list)

    def format(self) -> str:
        top = ", ".join(f"{k}×{v}" for k, v in sorted(self.op_counts.items(), key=lambda kv: -kv[1])[:8])
        return (f"graph: {self.num_ops} ops ({top}); {self.num_parameters:,} parameter elements; "
                f"{self.num_state_tensors} state tensors ({self.state_bytes / 2**20:.2f} MiB); inputs "
                f"{'; '.join(self.input_signature)}; est. memory {self.estimated_memory_bytes / 2**20:.2f} MiB; "
                f"traced in {self.trace_seconds:.2f}s")


@dataclass(frozen=True)
class OutputRef:
    """A user-output leaf that is a tensor: graph output ``index``."""

    index: int


@dataclass(frozen=True)
class OutputLayout:
    """Where each kind of value sits among the graph's outputs (they come in this order).

    Attributes:
        num_user: the user's tensor outputs, graph outputs ``0 .. num_user - 1``.
        rebind_slots: the state slots the step rebound; their new values follow the user outputs.
        grad_slots: the parameter slots whose gradients the step left; they follow the rebinds.
        num_closure_values: the closures' cloned tensor arguments, last.
    """

    num_user: int
    rebind_slots: tuple[int, ...]
    grad_slots: tuple[int, ...]
    num_closure_values: int = 0

    @property
    def rebinds(self) -> range:
        return range(self.num_user, self.num_user + len(self.rebind_slots))

    @property
    def grads(self) -> range:
        return range(self.rebinds.stop, self.rebinds.stop + len(self.grad_slots))

    @property
    def closure_values(self) -> range:
        return range(self.grads.stop, self.grads.stop + self.num_closure_values)

    @property
    def num_outputs(self) -> int:
        return self.closure_values.stop


@dataclass
class TracedStep:
    """A captured step: the graph plus how to map its inputs and outputs back to Python."""

    gm: torch.fx.GraphModule
    state: StateSet
    in_spec: pytree.TreeSpec
    frozen_inputs: dict[int, Any]  # non-tensor input leaves (position -> first value)
    out_spec: pytree.TreeSpec
    out_leaves: list[Any]  # per user-output leaf: an OutputRef, or a frozen non-tensor value
    layout: OutputLayout
    closure_calls: list[closures.RecordedClosure]
    summary: GraphSummary
    replicas: ReplicaGroup | None = None  # data-parallel replicas the graph all-reduces over


@dataclass
class _Capture:
    """What the traced run hands back besides the graph (filled while make_fx runs the step)."""

    stray_nodes: dict[int, torch.fx.Node] = field(default_factory=dict)
    out_spec: pytree.TreeSpec | None = None
    out_leaves: list[Any] = field(default_factory=list)
    layout: OutputLayout | None = None
    closure_calls: list[closures.RecordedClosure] = field(default_factory=list)


def input_signature(args: tuple, kwargs: dict) -> tuple:
    """Hashable structure + shapes/dtypes/devices of a step's inputs; non-tensor leaves by value."""
    return flat_signature(*pytree.tree_flatten((args, kwargs)))


def flat_signature(leaves: list[Any], spec: pytree.TreeSpec) -> tuple:
    """``input_signature`` of inputs already flattened (replay flattens each batch once)."""
    return spec, tuple((x.shape, x.dtype, x.device, x.requires_grad) if isinstance(x, torch.Tensor)
                       else ("py", _hashable(x)) for x in leaves)


def _hashable(x: Any) -> Any:
    try:
        hash(x)
        return x
    except TypeError:
        return repr(x)


class _TraceMode(TorchFunctionMode):
    """Inside the trace: value reads -> ComplianceError; stray real tensors -> bound fakes or lifted;
    with replicas, the gradient all-reduce where the gradients are first read (``replica_sync.TraceSync``)."""

    def __init__(self, mapping: dict[int, torch.Tensor], strays: dict[int, torch.Tensor],
                 sync: replica_sync.TraceSync | None = None) -> None:
        super().__init__()
        self.mapping, self.strays, self.sync = mapping, strays, sync
        self.placeholders: dict[int, torch.Tensor] = {}
        self.nodes: dict[int, torch.fx.Node] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        what = is_value_read(func)
        if what is not None:
            frame = sys._getframe(1)
            raise compliance_error(what, user_frame_location(frame), library_hint(frame))
        args, kwargs = pytree.tree_map_only(torch.Tensor, self._substitute, (args, kwargs))
        args, kwargs = dtype_rules.apply(func, args, kwargs)
        if self.sync is None:
            return func(*args, **kwargs)
        self.sync.before(func, args)
        out = func(*args, **kwargs)
        self.sync.after(func)
        return out

    def _substitute(self, t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, FakeTensor):
            return t
        if id(t) in self.mapping:
            return self.mapping[id(t)]
        # A real tensor the discovery did not find: trace on with a stand-in op whose graph node
        # trace_step later turns into a new input (so the user's Python still runs only once).
        if id(t) not in self.placeholders:
            self.strays[id(t)] = t
            # (the mode is not active inside its own handler, so this is a plain traced op)
            stand_in = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device,
                                           requires_grad=t.requires_grad)
            self.placeholders[id(t)] = stand_in
            self.nodes[id(t)] = proxy_node(stand_in)
        return self.placeholders[id(t)]


def trace_step(fn: Callable, state: StateSet, args: tuple, kwargs: dict) -> TracedStep:
    """Traces ``fn(*args, **kwargs)`` once with fake tensors; the user's Python runs here only.

    Raises:
        ComplianceError: the step reads a tensor value, initialises optimizer state lazily, or hits a
            data-dependent operation; the message names the user's file:line.
    """
    t0 = time.perf_counter()
    leaves, in_spec = pytree.tree_flatten((args, kwargs))
    batch_pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    frozen = {i: x for i, x in enumerate(leaves) if not isinstance(x, torch.Tensor)}
    strays: dict[int, torch.Tensor] = {}
    capture = _Capture()
    replicas = parallel.current().traced_group()  # the run's strategy says who all-reduces
    runner = _make_runner(fn, state, in_spec, len(leaves), batch_pos, frozen, strays, capture, replicas)
    inputs = [_as_input(s) for s in state.slots] + [leaves[i] for i in batch_pos]
    gm = _run_make_fx(runner, inputs)
    _lift_strays(gm, state, strays, capture.stray_nodes)
    _drop_replay_noops(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    summary = summarize(gm, state, [leaves[i] for i in batch_pos], time.perf_counter() - t0)
    assert capture.out_spec is not None and capture.layout is not None
    return TracedStep(gm, state, in_spec, frozen, capture.out_spec, capture.out_leaves, capture.layout,
                      capture.closure_calls, summary, replicas)


def _lift_strays(gm: torch.fx.GraphModule, state: StateSet, strays: dict, nodes: dict) -> None:
    """Turns each stray tensor's stand-in node into a graph input placed after the state inputs."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    anchor = placeholders[len(state.slots)] if len(placeholders) > len(state.slots) else None
    for key, t in strays.items():
        node = nodes[key]
        ctx = gm.graph.inserting_before(anchor) if anchor is not None else gm.graph.inserting_after(placeholders[-1])
        with ctx:
            ph = gm.graph.placeholder(f"lifted_{len(state.slots)}")
        ph.meta = dict(node.meta)
        node.replace_all_uses_with(ph)
        gm.graph.erase_node(node)
        if anchor is None:
            placeholders.append(ph)
        logger.debug("lifted a tensor the step uses into the graph's inputs: %s %s", tuple(t.shape), t.dtype)
        state.slots.append(Slot(f"lifted.{len(state.slots)}", None, None, t, "lifted"))
        state._index[id(t)] = len(state.slots) - 1


def _drop_replay_noops(gm: torch.fx.GraphModule) -> None:
    """Drops ops that mean nothing at replay (which runs under no_grad) but cost a dispatch each:
    record_function markers (torch.optim adds them) and ``detach`` (autograd bookkeeping)."""
    for node in reversed(list(gm.graph.nodes)):
        if node.op != "call_function":
            continue
        if node.target is torch.ops.aten.detach.default:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
        elif getattr(node.target, "namespace", "") == "profiler" and not node.users:
            gm.graph.erase_node(node)


def _as_input(slot: Slot) -> torch.Tensor:
    t = slot.tensor.detach()
    return t.requires_grad_(True) if slot.tensor.requires_grad else t


def _run_make_fx(runner: Callable, inputs: list[torch.Tensor]) -> torch.fx.GraphModule:
    """make_fx with torch's data-dependent errors turned into ComplianceErrors at the user's line."""
    try:
        return make_fx(runner, tracing_mode="fake")(*inputs)
    except ComplianceError:
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is a data-dependent read
        if not is_data_dependent_error(exc):
            raise
        where = user_frame_location(tb=exc.__traceback__)
        raise compliance_error(f"a data-dependent operation ({type(exc).__name__})", where) from exc


def _make_runner(fn, state, in_spec, n_leaves, batch_pos, frozen, strays, capture: _Capture,
                 replicas: ReplicaGroup | None) -> Callable:
    n_state = len(state.slots)

    def runner(*flat: torch.Tensor):
        leaves = [frozen.get(i) for i in range(n_leaves)]
        for pos, t in zip(batch_pos, flat[n_state:]):
            leaves[pos] = t
        args, kwargs = pytree.tree_unflatten(leaves, in_spec)
        with contextlib.ExitStack() as stack:
            mapping = stack.enter_context(state.bind(list(flat[:n_state])))
            for s, f in zip(state.slots, flat[:n_state]):  # lifted tensors: substituted by the mode
                mapping[id(s.tensor)] = f
            recorder = stack.enter_context(closures.recording())
            sync = replica_sync.TraceSync(replicas, state, flat[:n_state]) if replicas is not None else None
            mode = stack.enter_context(_TraceMode(mapping, strays, sync))
            capture.stray_nodes = mode.nodes
            out = fn(*args, **kwargs)
            if sync is not None:
                sync.finish()
            return _collect_outputs(out, state, mapping, recorder, capture)

    return runner


def _collect_outputs(out, state: StateSet, mapping, recorder, capture: _Capture) -> list[torch.Tensor]:
    """Runs while the state is still bound: gathers the graph outputs (see module docstring)."""
    out_leaves, out_spec = pytree.tree_flatten(out)
    graph_outs: list[torch.Tensor] = []
    kinds: list[Any] = []
    for x in out_leaves:
        if isinstance(x, torch.Tensor):
            kinds.append(OutputRef(len(graph_outs)))
            graph_outs.append(x)
        else:
            kinds.append(x)
    changed, created = optimizer_state_rebinds(state, mapping)
    if created:
        raise ComplianceError(
            f"{user_frame_location()}: the optimizer created state inside the traced step ({', '.join(created)}); "
            "a compliant optimizer creates all state up front in preinitialize() (use cs_run.optim)")
    rebinds = []
    for idx, value in state.rebound(mapping) + changed:
        if isinstance(value, torch.Tensor):
            rebinds.append(idx)
            graph_outs.append(value)
        else:
            logger.warning("state %s was set to a non-tensor (%r) inside the step; its tensor is kept",
                           state.slots[idx].name, value)
    grads = []
    for i, slot in enumerate(state.slots):
        g = mapping[id(slot.tensor)].grad if slot.kind == "parameter" else None
        if g is not None:
            grads.append(i)
            graph_outs.append(g)
    recorded = recorder.finish()
    closure_values = [t for call in recorded for t in call.tensors]
    graph_outs.extend(closure_values)
    capture.out_spec, capture.out_leaves, capture.closure_calls = out_spec, kinds, recorded
    capture.layout = OutputLayout(num_user=sum(isinstance(k, OutputRef) for k in kinds), rebind_slots=tuple(rebinds),
                                  grad_slots=tuple(grads), num_closure_values=len(closure_values))
    assert capture.layout.num_outputs == len(graph_outs)
    return graph_outs


def summarize(gm: torch.fx.GraphModule, state: StateSet, batch: list[torch.Tensor], seconds: float) -> GraphSummary:
    ops: Counter = Counter()
    inter = 0
    for node in gm.graph.nodes:
        if node.op == "call_function":
            ops[_op_name(node.target)] += 1
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                inter += val.numel() * val.element_size()
    state_bytes = sum(t.numel() * t.element_size() for t in state.tensors)
    batch_bytes = sum(t.numel() * t.element_size() for t in batch)
    params = sum(s.tensor.numel() for s in state.slots if s.kind == "parameter")
    sig = [f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')} {t.device}" for t in batch]
    return GraphSummary(sum(ops.values()), dict(ops), params, len(state.slots), state_bytes, sig,
                        state_bytes + batch_bytes + inter, seconds, [s.name for s in state.slots])


def _op_name(target: Any) -> str:
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0] if name else str(target)
