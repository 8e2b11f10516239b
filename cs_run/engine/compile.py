"""Lower a traced step to an executable (DESIGN §4.4).

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
import logging
import os
import shutil
import time
from typing import Any, Callable

import torch

from cs_run.engine.cache import CompileCache, graph_key
from cs_run.engine.progress import compiling
from cs_run.engine.trace import TracedStep
from cs_run.engine.trial import TierTrial

__all__ = ["COUNTS", "DEFAULT_TIER", "TIERS", "compile_graph", "resolve_tier"]

logger = logging.getLogger(__name__)
TIERS = ("auto", "fx", "inductor")
DEFAULT_TIER = "auto"
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
        try:
            executables["inductor"] = _build(traced, batch, "inductor", cache, recompiles, label)
        except Exception as exc:  # noqa: BLE001  (any lowering failure: fx still runs the step)
            logger.warning("compile_tier auto: %s runs on tier fx: the inductor build failed (%s: %s)",
                           label, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            return traced.gm
        device = traced.state.tensors[0].device if traced.state.tensors else None
        return TierTrial(executables, device=device, label=label)
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


def _inductor(traced: TracedStep, batch: list[torch.Tensor], cache: CompileCache | None, key: str,
              label: str) -> tuple[Callable[..., Any], str]:
    """Loads the saved artifact for ``key`` or compiles (and saves) one; returns it and what happened."""
    from torch._inductor import CompiledArtifact, standalone_compile  # noqa: PLC0415, TID253  (heavy)

    if cache is not None:
        # Inductor's kernels and its FX graph cache live in compile_dir too (read on each lookup).
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache.inductor_dir)
        artifact = cache.artifact_path(key)
        if artifact.is_file():
            try:
                with compiling(f"{label} (loading tier inductor from the compile cache)"):
                    loaded = CompiledArtifact.load(path=str(artifact), format="binary")
                COUNTS["inductor_load"] += 1
                return loaded, "loaded"
            except Exception as exc:  # noqa: BLE001  (a stale or foreign artifact: compile afresh)
                logger.warning("compile cache: could not load %s (%s); compiling again", artifact, exc)
    example = [t.detach() for t in traced.state.tensors] + [t.detach() for t in batch]
    with compiling(f"{label} (tier inductor)"), torch.no_grad():
        compiled = standalone_compile(traced.gm, example, dynamic_shapes="from_example_inputs")
    COUNTS["inductor_compile"] += 1
    if cache is not None and compiled.is_saveable():
        cache.save_artifact(key, compiled)
    return compiled, "compiled"
