"""Step closures and checkpoint closures (docs/architecture.md#the-csx-engine-cs_runengine).

A closure gets *materialized* values: each tensor argument is cloned where the closure is called
(inside a traced step the clone is a graph op, so it costs no host sync), so later in-place updates
(the optimizer, the next step) never leak into it. Closures run *after* the step they were called in:

* called inside a traced step on CSX: recorded at trace time, run after every replay;
* called inside an eager ``trace``d step (CPU/GPU): queued, run when the step returns;
* called outside a step: run at once (the step before it has already been issued).

A checkpoint closure runs only on checkpoint steps and the final step of the running loop: the
innermost :func:`running` context (the :class:`~cs_run.utils.data.DataExecutor` enters one while it
iterates); always, when no loop is running.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

import torch

from cs_run._torch_compat import pytree

__all__ = ["RecordedClosure", "Recorder", "recording", "deferring", "call_closure", "is_checkpoint_step",
           "make_closure", "running", "current_loop", "LoopPosition"]

logger = logging.getLogger(__name__)
_RECORDERS: list[Recorder] = []
_DEFERRED: list[list[tuple[Callable, tuple, dict]]] = []
_LOOPS: list[LoopPosition] = []


class LoopPosition(Protocol):
    """What the engine needs to know of the loop it runs in (the DataExecutor is one)."""

    @property
    def on_checkpoint_step(self) -> bool: ...


@contextlib.contextmanager
def running(loop: LoopPosition) -> Iterator[None]:
    """While ``loop`` iterates: checkpoint closures ask it whether this is a checkpoint step."""
    _LOOPS.append(loop)
    try:
        yield
    finally:
        _LOOPS.remove(loop)


def current_loop() -> Any:
    """The innermost running loop, or None."""
    return _LOOPS[-1] if _LOOPS else None


@dataclass
class RecordedClosure:
    """A closure call captured in a trace; its tensor arguments are graph outputs."""

    fn: Callable
    spec: pytree.TreeSpec
    leaves: list[Any]  # non-tensor leaves as called; tensor leaves are replaced at replay
    tensor_pos: list[int]
    checkpoint: bool
    tensors: list[torch.Tensor] = field(default_factory=list)  # fakes (trace time only)
    first_value: int = 0  # where this call's tensors start among the step's closure values

    def run(self, values: list[torch.Tensor]) -> None:
        """Call the closure with this step's values (the graph outputs of the layout's closure_values)."""
        if self.checkpoint and not is_checkpoint_step():
            return
        leaves = list(self.leaves)
        for k, pos in enumerate(self.tensor_pos):
            leaves[pos] = values[self.first_value + k]
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        self.fn(*args, **kwargs)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[RecordedClosure] = []

    def record(self, fn: Callable, args: tuple, kwargs: dict, checkpoint: bool) -> None:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        tensors = [leaves[i].detach().clone() for i in pos]  # recorded as graph ops: no sync
        frozen = [None if isinstance(x, torch.Tensor) else x for x in leaves]
        self.calls.append(RecordedClosure(fn, spec, frozen, pos, checkpoint, tensors))

    def finish(self) -> list[RecordedClosure]:
        """The recorded calls, each knowing where its tensors start among the closure values."""
        first = 0
        for call in self.calls:
            call.first_value = first
            first += len(call.tensors)
        return self.calls


@contextlib.contextmanager
def recording() -> Iterator[Recorder]:
    """While tracing: closure calls are recorded instead of run."""
    rec = Recorder()
    _RECORDERS.append(rec)
    try:
        yield rec
    finally:
        _RECORDERS.remove(rec)


@contextlib.contextmanager
def deferring() -> Iterator[None]:
    """While an eager step runs: closure calls are queued and run when the step returns."""
    queue: list[tuple[Callable, tuple, dict]] = []
    _DEFERRED.append(queue)
    ok = False
    try:
        yield
        ok = True
    finally:
        _DEFERRED.pop()
        if ok:
            for fn, args, kwargs in queue:
                fn(*args, **kwargs)


def is_checkpoint_step() -> bool:
    """True on a checkpoint step or the final step of the running loop (or with none)."""
    loop = current_loop()
    return True if loop is None else loop.on_checkpoint_step


def call_closure(fn: Callable, args: tuple, kwargs: dict, checkpoint: bool) -> None:
    """What calling a decorated closure does; see the module docstring."""
    if _RECORDERS:
        _RECORDERS[-1].record(fn, args, kwargs, checkpoint)
        return
    if checkpoint and not is_checkpoint_step():
        logger.debug("checkpoint closure %s skipped: not a checkpoint step", getattr(fn, "__name__", fn))
        return
    if _DEFERRED:
        args, kwargs = pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone(), (args, kwargs))
        _DEFERRED[-1].append((fn, args, kwargs))
        return
    fn(*args, **kwargs)


def make_closure(fn: Callable, checkpoint: bool) -> Callable[..., None]:
    """The decorator body shared by ``step_closure`` and ``checkpoint_closure``."""

    @functools.wraps(fn)
    def closure(*args: Any, **kwargs: Any) -> None:
        call_closure(fn, args, kwargs, checkpoint)

    closure.__cs_run_closure__ = True  # type: ignore[attr-defined]
    return closure
