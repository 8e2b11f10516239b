"""Replay a compiled step as one CUDA graph (docs/architecture.md#cuda-graphs).

A replayed whole step is the natural fit for a CUDA graph: the same kernels on the same state tensors
every step, only the batch changes. ``GraphedStep`` wraps an executable (either tier): its first call
runs it as is (a real step that also warms up lazy initialisation), its second captures one graph
(``torch.cuda.CUDAGraph``) whose batch inputs are *static buffers* that every later batch is copied
into, then replays it for this and every later step. The state tensors are the graph's own inputs
(the engine keeps their identity), so they are checked, not copied.

Where a graph cannot be replayed, the step runs without one and the log says why, once:
``capture_blocker`` refuses graphs with host syncs, data-dependent shapes, host tensors, symbolic
shapes or collectives before anything runs; a capture that fails, or state tensors that moved, fall
back at run time. Every output but the rebound state is cloned after a replay, because the graph
writes the same memory at the next one.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch

from cs_run.batches import compile_time

__all__ = ["GraphedStep", "capture_blocker", "cuda_capture"]

logger = logging.getLogger(__name__)

# ops that read a value on the host or whose output shape depends on values: not capturable
_HOST_SYNC_OPS = {"_local_scalar_dense", "item", "nonzero", "nonzero_static_cpu", "masked_select", "unique",
                  "_unique", "_unique2", "unique_consecutive", "unique_dim", "repeat_interleave",
                  "_assert_scalar", "equal", "is_nonzero"}
_COLLECTIVE_NAMESPACES = {"_c10d_functional", "c10d", "_c10d_functional_autograd"}


def capture_blocker(gm: torch.fx.GraphModule, inputs: Sequence[Any], device: torch.device) -> str:
    """Why the step graph ``gm`` cannot be replayed as a CUDA graph on ``device`` ('' when it can).

    ``inputs`` are the graph's inputs in order (state, then batch). Checked: every input is a tensor
    on ``device``; no op syncs with the host or makes a value-dependent shape (``.item()``,
    ``nonzero``, boolean-mask indexing); no op computes on another device; no symbolic shapes; no
    collectives (their capture is not tested here).
    """
    for index, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor):
            return f"graph input {index} is a {type(t).__name__}, not a tensor"
        if t.device != device:
            return f"graph input {index} (shape {tuple(t.shape)}) is on {t.device}, not {device}"
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = _op_name(node.target)
        namespace = name.split(".", 1)[0]
        base = name.split(".")[1] if "." in name else name
        if namespace in _COLLECTIVE_NAMESPACES:
            return f"the step has collective op {name} (collectives are not captured)"
        if base in _HOST_SYNC_OPS:
            return f"op {name} reads a value on the host or has a value-dependent shape"
        if base in ("index", "index_put", "index_put_", "_index_put_impl_") and _has_bool_index(node):
            return f"op {name} indexes with a boolean mask (its output shape depends on values)"
        val = node.meta.get("val")
        for v in val if isinstance(val, (list, tuple)) else [val]:
            if not isinstance(v, torch.Tensor):
                continue
            if v.device != device:
                return f"op {name} computes on {v.device}, not {device}"
            if any(not isinstance(s, int) for s in v.shape):
                return f"op {name} has a symbolic shape {tuple(v.shape)}"
    return ""


def _op_name(target: Any) -> str:
    name = getattr(target, "_name", None) or getattr(target, "__name__", None) or str(target)
    return name.replace("::", ".")


def _has_bool_index(node: torch.fx.Node) -> bool:
    indices = node.args[1] if len(node.args) > 1 else ()
    for idx in indices if isinstance(indices, (list, tuple)) else [indices]:
        val = idx.meta.get("val") if isinstance(idx, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and val.dtype in (torch.bool, torch.uint8):
            return True
    return False


def cuda_capture(fn: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
    """Captures ``fn`` (nothing runs yet) into a CUDA graph; returns its replay and static outputs."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph.replay, outputs


class GraphedStep:
    """Runs like ``executable(*state, *batch)``; from the second call on, as one replayed CUDA graph.

    Args:
        executable: The compiled step (fx or inductor tier).
        num_state: How many leading inputs are state tensors (their identity must stay fixed).
        keep: Output positions that need no clone (rebound state: replay copies them at once).
        capture: ``fn -> (replay, static outputs)``; ``cuda_capture`` by default (tests inject one).
        label: Names the step in the log.
    """

    def __init__(self, executable: Callable[..., Any], num_state: int, *, keep: Sequence[int] = (),
                 capture: Callable[[Callable[[], Any]], tuple[Callable[[], None], Any]] = cuda_capture,
                 label: str = "step") -> None:
        self.executable = executable
        self.num_state = num_state
        self.keep = frozenset(keep)
        self.capture = capture
        self.label = label
        self.calls = 0
        self.fallback = ""  # why this step runs without a graph ('' while it may use one)
        self._replay: Callable[[], None] | None = None
        self._outputs: Any = None
        self._static: list[torch.Tensor] = []
        self._state_ptrs: list[int] = []

    @property
    def graphed(self) -> bool:
        return self._replay is not None and not self.fallback

    def __call__(self, *inputs: torch.Tensor) -> Any:
        self.calls += 1
        if self.fallback or self.calls == 1:  # the first call is a plain step: it warms up lazy init
            return self.executable(*inputs)
        state, batch = inputs[:self.num_state], inputs[self.num_state:]
        if self._replay is None:
            self._static = [t.clone() for t in batch]  # the static input buffers
            self._state_ptrs = [t.data_ptr() for t in state]
            try:
                with compile_time():  # left out of the throughput, as the trace and compile are
                    self._replay, self._outputs = self.capture(lambda: self.executable(*state, *self._static))
            except Exception as exc:  # noqa: BLE001  (any capture failure: the step still runs)
                self._fall_back(f"the capture failed ({type(exc).__name__}: {str(exc).splitlines()[0]})"
                                if str(exc) else f"the capture failed ({type(exc).__name__})")
                return self.executable(*inputs)
            logger.info("%s: replaying the step as one CUDA graph (%d batch tensors copied into static "
                        "buffers per step)", self.label, len(self._static))
        elif [t.data_ptr() for t in state] != self._state_ptrs:
            self._fall_back("a state tensor was reallocated after the capture (e.g. a checkpoint load "
                            "replaced it)")
            return self.executable(*inputs)
        for buffer, t in zip(self._static, batch):
            buffer.copy_(t, non_blocking=True)
        self._replay()
        return [o if k in self.keep or not isinstance(o, torch.Tensor) else o.clone()
                for k, o in enumerate(self._outputs)]

    def _fall_back(self, reason: str) -> None:
        self.fallback = reason
        self._replay, self._outputs, self._static = None, None, []
        logger.warning("%s: no CUDA graph, the step runs without one: %s", self.label, reason)
