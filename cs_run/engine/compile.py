"""Lower a traced step to an executable (DESIGN §4.4).

Two tiers:

* ``"fx"`` — the fx GraphModule's own generated Python: one aten call per op, no autograd, no module
  or optimizer Python. Builds in milliseconds; bit-identical to eager PyTorch.
* ``"inductor"`` — ``torch._inductor.compile_fx`` of the aten graph. It functionalizes the graph
  itself (AOTAutograd) and writes the in-place updates of the state back into the input tensors, so
  the mutating graph can be handed over as is. Fuses elementwise work (the whole optimizer update
  becomes a few loops), so it is the fast tier for overhead-bound steps; it takes seconds to tens of
  seconds to build (cached, see ``cache.py``), and fusion may change the last bits of results.

``"auto"`` picks inductor when a C++ compiler (CPU) or triton (CUDA) is available, else fx.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any, Callable

import torch
from torch._guards import TracingContext, tracing
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from cs_run.engine.cache import CompileCache, graph_key
from cs_run.engine.trace import TracedStep

__all__ = ["TIERS", "compile_graph", "resolve_tier"]

logger = logging.getLogger(__name__)
TIERS = ("auto", "fx", "inductor")


def resolve_tier(tier: str, device: torch.device) -> str:
    """``auto`` -> inductor where its toolchain exists, else fx; others are checked and returned."""
    if tier not in TIERS:
        raise ValueError(f"Invalid compile tier {tier!r}; must be one of {', '.join(TIERS)}")
    if tier != "auto":
        return tier
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "fx"
        return "inductor"
    return "inductor" if (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")) else "fx"


def compile_graph(traced: TracedStep, batch: list[torch.Tensor], tier: str, cache: CompileCache | None,
                  recompiles: int = 0) -> Callable[..., Any]:
    """Builds the executable for ``traced`` and logs one line: size, tier, cache hit/miss, time."""
    key = graph_key(traced, batch, tier)
    hit = cache is not None and cache.has(key)
    t0 = time.perf_counter()
    if tier == "fx":
        executable: Callable[..., Any] = traced.gm
    else:
        executable = _compile_inductor(traced, batch, cache)
    seconds = time.perf_counter() - t0
    if cache is not None:
        cache.store(key, traced, tier, seconds)
    logger.info("compile cache %s: %d ops, %d state tensors, tier %s, compiled in %.2fs, recompiles %d (key %s)",
                "hit" if hit else "miss", traced.summary.num_ops, traced.summary.num_state_tensors, tier,
                seconds, recompiles, key[:12])
    return executable


def _compile_inductor(traced: TracedStep, batch: list[torch.Tensor], cache: CompileCache | None) -> Callable:
    if cache is not None:
        # Inductor reads the variable on each cache lookup; pointing it into compile_dir lets a second
        # process reuse the kernels. Process-wide by design: one backend per process.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache.inductor_dir)
    from torch._inductor.compile_fx import compile_fx

    example = [t.detach() for t in traced.state.tensors] + [t.detach() for t in batch]
    # A tracing context with a ShapeEnv lets AOTAutograd's and inductor's FX graph caches key the graph;
    # without one both bypass their caches and every new process recompiles from scratch.
    context = TracingContext(FakeTensorMode(shape_env=ShapeEnv()))
    with torch.no_grad(), tracing(context):
        return compile_fx(traced.gm, example)
