"""The CSX whole-step engine: trace -> compile -> replay. Internal, except for the hooks below.

docs/architecture.md#the-csx-engine-cs_runengine describes the stages and their contracts.

Stages, one module each: ``state`` (discover and bind state), ``trace`` (make_fx with fake tensors),
``compliance`` (value reads -> ComplianceError), ``compile`` (fx / inductor tiers; ``passes``
rewrites the graph inductor gets), ``cache`` (compile_dir), ``replica_sync`` (data-parallel replicas:
the gradient all-reduce inside the graph),
``replay`` (run on the next batch), ``closures`` (step/checkpoint closures), and ``step.CompiledStep``
tying them together.

For other parts of cs-run (runners, amp, metrics):

* :func:`register_state` — make an object's tensor attributes state of every traced step (for objects
  a step uses without closing over them; modules, optimizers and closed-over objects need nothing).
* :func:`validate_step` / :func:`compile_step_only` — what ``validate-only`` / ``compile-only`` run.
"""

from __future__ import annotations

from typing import Any, Callable

from cs_run.engine.state import register_state as register_state
from cs_run.engine.state import unregister_state as unregister_state
from cs_run.engine.step import CompiledStep as CompiledStep
from cs_run.engine.step import EngineOptions as EngineOptions
from cs_run.engine.step import RecompileError as RecompileError
from cs_run.engine.trace import GraphSummary as GraphSummary

__all__ = ["CompiledStep", "EngineOptions", "GraphSummary", "RecompileError", "compile_step_only",
           "register_state", "unregister_state", "validate_step"]


def _user_fn(step_fn: Callable) -> Callable:
    return getattr(step_fn, "fn", step_fn)  # a cstorch.trace wrapper -> the user's function


def validate_step(step_fn: Callable, *args: Any, **kwargs: Any) -> GraphSummary:
    """Traces ``step_fn(*args, **kwargs)`` without compiling or running it; weights are untouched.

    Raises:
        ComplianceError: the step is not traceable (message names the user's file:line).
    """
    step = CompiledStep(_user_fn(step_fn), EngineOptions(validate_only=True))
    step(*args, **kwargs)
    assert step.last_summary is not None
    return step.last_summary


def compile_step_only(step_fn: Callable, *args: Any, compile_dir: str | None = None,
                      compile_tier: str | None = None, **kwargs: Any) -> GraphSummary:
    """Traces and compiles ``step_fn`` into ``compile_dir``'s cache without running it."""
    step = CompiledStep(_user_fn(step_fn), EngineOptions(compile_only=True, compile_dir=compile_dir, compile_tier=compile_tier))
    step(*args, **kwargs)
    assert step.last_summary is not None
    return step.last_summary
