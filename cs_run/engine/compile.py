"""Lower a traced step to an executable (docs/architecture.md#the-csx-engine-cs_runengine).

Tiers:

* ``"fx"`` — the fx GraphModule's own generated Python: one aten call per op, no autograd, no module
  or optimizer Python. Builds in milliseconds; bit-identical to eager PyTorch.
* ``"inductor"`` — inductor's standalone compile of the aten graph. It functionalizes the graph itself
  (AOTAutograd) and writes the in-place updates of the state back into the input tensors, so the
  mutating graph can be handed over as is. Fuses elementwise work (the whole optimizer update becomes
  a few loops), so it is the fast tier for overhead-bound steps; a cold build takes seconds to tens of
  seconds, and fusion may change the last bits of results. With a compile cache the compiled artifact
  is saved under the graph's key, and a later process loads it instead of compiling (``COUNTS``).
* ``"auto"`` (the default) — builds both and lets the first real steps decide (``trial.TierTrial``):
  it never keeps a tier that its own trial measured slower. Without a C++ compiler (CPU) or triton
  (CUDA) it is fx, and says why.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import time
from typing import Any, Callable, Iterator

import torch

from cs_run.engine import collectives
from cs_run.engine.cache import CompileCache, graph_key
from cs_run.engine.progress import compiling
from cs_run.engine.trace import TracedStep
from cs_run.engine.trial import TierTrial

__all__ = ["COUNTS", "DEFAULT_TIER", "TIERS", "compile_graph", "inductor_cache_dir", "resolve_tier"]

logger = logging.getLogger(__name__)
TIERS = ("auto", "fx", "inductor")
DEFAULT_TIER = "auto"
_INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
# What this process really did, for tests and the bench: "inductor_compile" (a lowering ran),
# "inductor_load" (a saved artifact was loaded instead). Counted, not parsed from logs.
COUNTS: collections.Counter[str] = collections.Counter()


def resolve_tier(tier: str | None, device: torch.device) -> str:
    """Checks ``tier`` (None -> ``DEFAULT_TIER``); ``auto`` becomes fx where inductor cannot build (logged)."""
    tier = DEFAULT_TIER if tier is None else tier
    if tier not in TIERS:
        raise ValueError(f"Invalid compile tier {tier!r}; must be one of {', '.join(TIERS)}")
    if tier != "auto":
        return tier
    missing = _inductor_missing(device)
    if missing:
        logger.info("compile_tier auto: tier fx (%s)", missing)
        return "fx"
    return "auto"


def _inductor_missing(device: torch.device) -> str:
    if device.type == "cuda":
        try:
            import triton  # noqa: F401, PLC0415, TID253  (optional, heavy)
        except ImportError:
            return "triton is not installed, inductor cannot build CUDA kernels"
        return ""
    if not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        return "no C++ compiler on PATH, inductor cannot build CPU kernels"
    return ""


def compile_graph(traced: TracedStep, batch: list[torch.Tensor], tier: str, cache: CompileCache | None,
                  recompiles: int = 0, label: str = "step") -> Callable[..., Any]:
    """Builds the executable for ``traced`` (``tier`` already resolved) and logs what it did."""
    if tier == "auto":
        executables: dict[str, Callable[..., Any]] = {"fx": traced.gm}
        failed = ""
        try:
            executables["inductor"] = _build(traced, batch, "inductor", cache, recompiles, label)
        except Exception as exc:  # noqa: BLE001  (any lowering failure: fx still runs the step)
            failed = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if traced.replicas is not None:  # replicas must run the same tier: one failure -> fx everywhere
            failed = collectives.first_failure(failed)
        if failed:
            logger.warning("compile_tier auto: %s runs on tier fx: the inductor build failed (%s)", label, failed)
            return traced.gm
        device = traced.state.tensors[0].device if traced.state.tensors else None
        agree = collectives.agree_choice if traced.replicas is not None else None
        return TierTrial(executables, device=device, label=label, agree=agree)
    return _build(traced, batch, tier, cache, recompiles, label)


def _build(traced: TracedStep, batch: list[torch.Tensor], tier: str, cache: CompileCache | None,
           recompiles: int, label: str) -> Callable[..., Any]:
    key = graph_key(traced, batch, tier)
    hit = cache is not None and cache.has(key)
    t0 = time.perf_counter()
    how = "compiled"
    if tier == "fx":
        executable: Callable[..., Any] = traced.gm
    else:
        executable, how = _inductor(traced, batch, cache, key, label)
    seconds = time.perf_counter() - t0
    if cache is not None:
        cache.store(key, traced, tier, seconds)
    logger.info("compile cache %s: %d ops, %d state tensors, tier %s, %s in %.2fs, recompiles %d (key %s)",
                "hit" if hit else "miss", traced.summary.num_ops, traced.summary.num_state_tensors, tier, how,
                seconds, recompiles, key[:12])
    return executable


@contextlib.contextmanager
def inductor_cache_dir(path: str | os.PathLike | None) -> Iterator[None]:
    """Inductor's cache (its FX graph and kernel caches) in ``path`` during the block, then as it was.

    Inductor reads ``TORCHINDUCTOR_CACHE_DIR`` on each cache lookup, and the compiled kernels are loaded
    before the compile (or load) returns, so the variable is needed for the compile call only.
    """
    if path is None:
        yield
        return
    old = os.environ.get(_INDUCTOR_ENV)
    os.environ[_INDUCTOR_ENV] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(_INDUCTOR_ENV, None)
        else:
            os.environ[_INDUCTOR_ENV] = old


def _inductor(traced: TracedStep, batch: list[torch.Tensor], cache: CompileCache | None, key: str,
              label: str) -> tuple[Callable[..., Any], str]:
    """Loads the saved artifact for ``key`` or compiles (and saves) one; returns it and what happened."""
    from torch._inductor import CompiledArtifact, standalone_compile  # noqa: PLC0415, TID253  (heavy)

    def scope() -> contextlib.AbstractContextManager:  # inductor's kernels and caches into compile_dir
        return inductor_cache_dir(cache.inductor_dir if cache is not None else None)

    if cache is not None:
        artifact = cache.artifact_path(key)
        if artifact.is_file():
            try:
                with compiling(f"{label} (loading tier inductor from the compile cache)"), scope():
                    loaded = CompiledArtifact.load(path=str(artifact), format="binary")
                COUNTS["inductor_load"] += 1
                return loaded, "loaded"
            except Exception as exc:  # noqa: BLE001  (a stale or foreign artifact: compile afresh)
                logger.warning("compile cache: could not load %s (%s); compiling again", artifact, exc)
    example = [t.detach() for t in traced.state.tensors] + [t.detach() for t in batch]
    with compiling(f"{label} (tier inductor)"), torch.no_grad(), scope():
        compiled = standalone_compile(traced.gm, example, dynamic_shapes="from_example_inputs")
        COUNTS["inductor_compile"] += 1
        if cache is not None and compiled.is_saveable():
            cache.save_artifact(key, compiled)
    return compiled, "compiled"
