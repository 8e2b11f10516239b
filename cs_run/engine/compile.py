"""Lower a traced step to an executable (docs/architecture.md#the-csx-engine-cs_runengine).

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

import contextlib
import logging
import os
import shutil
import time
from typing import Any, Callable, Iterator

import torch
from torch._guards import TracingContext, tracing
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from cs_run.engine.cache import CompileCache, graph_key
from cs_run.engine.trace import TracedStep

__all__ = ["TIERS", "compile_graph", "inductor_cache_dir", "resolve_tier"]

logger = logging.getLogger(__name__)
TIERS = ("auto", "fx", "inductor")
_INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"


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
    # "hit": this graph was compiled into compile_dir before. What that saves is inductor's: its kernels
    # come from compile_dir/inductor; the fx tier has nothing to reuse (it builds in milliseconds).
    reuse = "" if not hit else (", kernels from compile_dir/inductor" if tier == "inductor" else
                                ", nothing to reuse for the fx tier")
    logger.info("compile cache %s: %d ops, %d state tensors, tier %s, compiled in %.2fs%s, recompiles %d (key %s)",
                "hit" if hit else "miss", traced.summary.num_ops, traced.summary.num_state_tensors, tier,
                seconds, reuse, recompiles, key[:12])
    return executable


@contextlib.contextmanager
def inductor_cache_dir(path: str | os.PathLike | None) -> Iterator[None]:
    """Inductor's cache (its FX graph and kernel caches) in ``path`` during the block, then as it was.

    Inductor reads ``TORCHINDUCTOR_CACHE_DIR`` on each cache lookup, and the compiled kernels are loaded
    before ``compile_fx`` returns, so the variable is needed for the compile call only.
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


def _compile_inductor(traced: TracedStep, batch: list[torch.Tensor], cache: CompileCache | None) -> Callable:
    from torch._inductor.compile_fx import compile_fx  # heavy: loaded only when the inductor tier is used

    example = [t.detach() for t in traced.state.tensors] + [t.detach() for t in batch]
    # A tracing context with a ShapeEnv lets AOTAutograd's and inductor's FX graph caches key the graph;
    # without one both bypass their caches and every new process recompiles from scratch.
    context = TracingContext(FakeTensorMode(shape_env=ShapeEnv()))
    with torch.no_grad(), tracing(context), inductor_cache_dir(cache.inductor_dir if cache is not None else None):
        return compile_fx(traced.gm, example)
