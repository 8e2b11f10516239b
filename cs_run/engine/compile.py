"""Lower a traced step to an executable (docs/architecture.md#the-csx-engine-cs_runengine).

Tiers:

* ``"fx"`` — the fx GraphModule's own generated Python: one aten call per op, no autograd, no module
  or optimizer Python. Builds in milliseconds; bit-identical to eager PyTorch.
* ``"inductor"`` — inductor's compile of the aten graph. It functionalizes the graph itself
  (AOTAutograd) and writes the in-place updates of the state back into the input tensors, so the
  mutating graph can be handed over as is. Fuses elementwise work (the whole optimizer update becomes
  a few loops), so it is the fast tier for overhead-bound steps; a cold build takes seconds to tens of
  seconds, and fusion may change the last bits of results. On CPU the step is built ahead of time into
  one library with a C++ wrapper (``aot.py``: no Python between kernels, and a warm process loads it
  without importing inductor's compiler); on CUDA it is inductor's standalone compile with its
  Python wrapper. With a compile cache the build is saved under the
  graph's key, and a later process loads it instead of compiling (``COUNTS``).
* ``"auto"`` (the default) — builds both and lets the first real steps decide (``trial.TierTrial``):
  it never keeps a tier that its own trial measured slower. Without a C++ compiler (CPU) or triton
  (CUDA) it is fx, and says why. Where inductor's build is not saved in the compile cache and the run
  says how many steps are left (``steps_left``), it runs fx first and builds inductor only if those
  steps could win the build back (``trial.PayoffGate``; the build's cost from :func:`estimate_inductor_seconds`).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from cs_run import _torch_compat
from cs_run.batches import compile_time
from cs_run.engine import aot, passes, replica_sync
from cs_run.engine.cache import CompileCache, graph_key
from cs_run.engine.cudagraph import GraphedStep, capture_blocker
from cs_run.engine.progress import compiling
from cs_run.engine.trace import TracedStep
from cs_run.engine.trial import PayoffGate, TierTrial
from cs_run.params import CompileTier

__all__ = ["COUNTS", "DEFAULT_TIER", "compile_graph", "estimate_inductor_seconds", "inductor_cache_dir",
           "resolve_tier"]

logger = logging.getLogger(__name__)
DEFAULT_TIER = CompileTier.AUTO
_INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
# What this process really did, for tests and the bench: "inductor_compile" (a lowering ran),
# "inductor_load" (a saved artifact was loaded instead). Counted, not parsed from logs.
COUNTS: collections.Counter[str] = collections.Counter()


def resolve_tier(compile_tier: CompileTier | None, device: torch.device) -> str:
    """The tier a step is built with: ``compile_tier`` (checked where it was given, see
    :class:`~cs_run.params.CompileTier`; None -> ``DEFAULT_TIER``), ``auto`` becoming fx where inductor
    cannot build (logged)."""
    tier = str(DEFAULT_TIER if compile_tier is None else compile_tier)
    if tier != CompileTier.AUTO:
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


# A cold inductor build on CPU: seconds ~ _BUILD_BASE + _BUILD_PER_OP x graph ops, fitted on a shared 2-core
# host (fc_mnist's train step, 65 ops: 23-62 s, the first build of a process; its eval step, 24 ops: 11-12 s
# after it). The compile cache's record of the builds this host made scales it (estimate_inductor_seconds).
_BUILD_BASE, _BUILD_PER_OP = 12.0, 0.2
PAYOFF_SAMPLES = 5  # timed fx steps before the auto tier decides whether inductor can pay


def estimate_inductor_seconds(num_ops: int, cache: CompileCache | None) -> float:
    """What a cold inductor build of a graph of ``num_ops`` ops costs here: the size model above, scaled
    by how this host's recorded builds (the compile cache's, newest first) compared with the model."""
    model = _BUILD_BASE + _BUILD_PER_OP * num_ops
    history = cache.inductor_builds() if cache is not None else []
    if not history:
        return model
    return model * statistics.median(seconds / (_BUILD_BASE + _BUILD_PER_OP * ops) for ops, seconds in history)


def compile_graph(traced: TracedStep, batch: list[torch.Tensor], tier: str, cache: CompileCache | None,
                  recompiles: int = 0, label: str = "step", cuda_graphs: bool = True,
                  steps_left: Callable[[], int | None] | None = None) -> Callable[..., Any]:
    """Builds the executable for ``traced`` (``tier`` already resolved) and logs what it did.

    On a CUDA device (and ``cuda_graphs``) each executable replays as one CUDA graph where the graph
    allows it (``cudagraph.py``; otherwise the reason is logged and it runs without one). ``steps_left``
    (the steps the run still takes, this one included; None or returning None: unknown) lets tier auto
    skip an inductor build the run cannot win back (see the module docstring).
    """
    device = traced.state.tensors[0].device if traced.state.tensors else None
    graphed = _graph_wrapper(traced, batch, device, label) if cuda_graphs else None
    if tier != "auto":
        executable = _build(traced, batch, tier, cache, recompiles, label)
        return graphed(executable) if graphed else executable
    left = steps_left() if steps_left is not None else None
    if left is not None and not _inductor_saved(traced, batch, cache, device):
        fx = graphed(traced.gm) if graphed else traced.gm
        agree = replica_sync.agree_choice if traced.replicas is not None else None
        if left <= PAYOFF_SAMPLES + 1:  # shorter than the timing itself: nothing to decide (same on every replica)
            logger.info("compile_tier auto: %s runs on tier fx (%d steps left: too few to time, let alone win "
                        "back an inductor build)", label, left)
            return fx
        _build(traced, batch, "fx", cache, recompiles, label)  # the fx build's log line and cache record

        def build() -> Callable[..., Any]:
            with compile_time():  # a compile inside a step: left out of the throughput, as the trace's
                return _auto(traced, batch, cache, recompiles, label, graphed)

        return PayoffGate(fx, build, steps_left=steps_left, samples=PAYOFF_SAMPLES, device=device, label=label,
                          compile_seconds=estimate_inductor_seconds(traced.summary.num_ops, cache), agree=agree)
    return _auto(traced, batch, cache, recompiles, label, graphed)


def _inductor_saved(traced: TracedStep, batch: list[torch.Tensor], cache: CompileCache | None,
                    device: torch.device | None) -> bool:
    """Whether inductor's build of this step is in the cache (loading it costs about nothing); with
    replicas, ordinal 0's answer (a replica that lacks it builds it, the others wait)."""
    saved = cache is not None and cache.inductor_saved(graph_key(traced, batch, "inductor"),
                                                       device or torch.device("cpu"))
    if traced.replicas is not None:
        saved = replica_sync.agree_choice("saved" if saved else "") == "saved"
    return saved


def _auto(traced: TracedStep, batch: list[torch.Tensor], cache: CompileCache | None, recompiles: int, label: str,
          graphed: Callable[[Callable[..., Any]], Callable[..., Any]] | None) -> Callable[..., Any]:
    """Both tiers built and the trial between them (``trial.TierTrial``); fx alone if inductor's build failed."""
    executables: dict[str, Callable[..., Any]] = {"fx": traced.gm}
    failed = ""
    try:
        executables["inductor"] = _build(traced, batch, "inductor", cache, recompiles, label)
    except Exception as exc:  # noqa: BLE001  (any lowering failure: fx still runs the step)
        failed = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if traced.replicas is not None:  # replicas must run the same tier: one failure -> fx everywhere
        failed = replica_sync.first_failure(failed)
    if failed:
        logger.warning("compile_tier auto: %s runs on tier fx: the inductor build failed (%s)", label, failed)
        return graphed(traced.gm) if graphed else traced.gm
    if graphed:
        executables = {k: graphed(v) for k, v in executables.items()}
    agree = replica_sync.agree_choice if traced.replicas is not None else None
    return TierTrial(executables, device=traced.state.tensors[0].device if traced.state.tensors else None,
                     label=label, agree=agree)


def _graph_wrapper(traced: TracedStep, batch: list[torch.Tensor], device: torch.device | None,
                   label: str) -> Callable[[Callable[..., Any]], Callable[..., Any]] | None:
    """``executable -> GraphedStep`` where this step can replay as a CUDA graph; None elsewhere (logged)."""
    if device is None or device.type != "cuda":
        return None
    reason = capture_blocker(traced.gm, [*traced.state.tensors, *batch], device)
    if reason:
        logger.warning("%s: no CUDA graph, the step runs without one: %s", label, reason)
        return None
    n, keep = len(traced.state.tensors), tuple(traced.layout.rebinds)
    return lambda executable: GraphedStep(executable, n, keep=keep, label=label)


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
        cache.store(key, traced, tier, seconds, how)
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
    """Loads the saved artifact for ``key`` or compiles (and saves) one; returns it and what happened.

    On CPU the step is compiled ahead of time into one library (``aot.py``; replicas' all-reduce runs
    inside it too, called with the GIL released); CUDA steps take inductor's Python-wrapper artifact (``standalone_compile``, whose
    kernels the CUDA-graph wrapper captures), as does a CPU step whose AOT build fails (logged).
    """
    device = traced.state.tensors[0].device if traced.state.tensors else torch.device("cpu")
    if device.type == "cpu":
        try:
            return _inductor_aot(traced, batch, cache, key, label)
        except Exception as exc:  # noqa: BLE001  (any AOT lowering failure: the wrapper path may still build)
            logger.warning("%s: the ahead-of-time build failed (%s: %s); building inductor's Python-wrapper "
                           "form instead", label, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    return _inductor_wrapper(traced, batch, cache, key, label)


def _inductor_aot(traced: TracedStep, batch: list[torch.Tensor], cache: CompileCache | None, key: str,
                  label: str) -> tuple[Callable[..., Any], str]:
    num_state, collectives_inside = len(traced.state.tensors), traced.replicas is not None
    if cache is not None:
        found = aot.find_artifact(cache.artifacts_dir, key)
        if found is not None:
            try:
                loaded = aot.load(found, num_state, batch, release_gil=collectives_inside)
                COUNTS["inductor_load"] += 1
                return loaded, "loaded"
            except Exception as exc:  # noqa: BLE001  (a foreign or stale library: compile afresh)
                logger.warning("compile cache: could not load %s (%s); compiling again", found, exc)
    where = cache.artifacts_dir if cache is not None else Path(tempfile.mkdtemp(prefix="cs_run_aot_"))
    try:
        with compiling(f"{label} (tier inductor, ahead of time)"), torch.no_grad(), _inductor_scope(cache):
            path = aot.build(_rewritten(traced, label), [*traced.state.tensors, *batch], where, key)
        COUNTS["inductor_compile"] += 1
        return aot.load(path, num_state, batch, release_gil=collectives_inside), "compiled"
    finally:
        if cache is None:  # the loaded library stays mapped; the file is not needed any more
            shutil.rmtree(where, ignore_errors=True)


@contextlib.contextmanager
def _inductor_scope(cache: CompileCache | None) -> Iterator[None]:
    """Around an inductor build or load: its kernels and caches in ``compile_dir/inductor`` and its
    CPU-ISA probes answered from ``compile_dir/artifacts/vec_isa.json`` (nothing changed without a cache),
    with the running torch's workarounds (``_torch_compat.inductor_build_fixes``)."""
    with _torch_compat.inductor_build_fixes():
        if cache is None:
            yield
            return
        with inductor_cache_dir(cache.inductor_dir), isa_probe_cache(cache.artifacts_dir / "vec_isa.json"):
            yield



def _rewritten(traced: TracedStep, label: str) -> torch.fx.GraphModule:
    """The graph inductor compiles: a copy rewritten by ``passes.py`` (the fx tier keeps ``traced.gm``)."""
    gm, rewrites = passes.run_passes(traced.gm)
    if passes.scale_before_add(gm):  # a torch bug's workaround, on every device (see its docstring)
        gm.graph.lint()
        gm.recompile()
    logger.debug("%s: graph passes before inductor: %s", label, rewrites)
    return gm


def _inductor_wrapper(traced: TracedStep, batch: list[torch.Tensor], cache: CompileCache | None, key: str,
                      label: str) -> tuple[Callable[..., Any], str]:
    if cache is not None:
        artifact = cache.artifact_path(key)
        if artifact.is_file():
            try:
                with compiling(f"{label} (loading tier inductor from the compile cache)"), _inductor_scope(cache):
                    loaded = _torch_compat.load_compiled_artifact(artifact)
                COUNTS["inductor_load"] += 1
                return loaded, "loaded"
            except Exception as exc:  # noqa: BLE001  (a stale or foreign artifact: compile afresh)
                logger.warning("compile cache: could not load %s (%s); compiling again", artifact, exc)
    example = [t.detach() for t in traced.state.tensors] + [t.detach() for t in batch]
    with compiling(f"{label} (tier inductor)"), torch.no_grad(), _inductor_scope(cache):
        compiled = _torch_compat.standalone_compile(_rewritten(traced, label), example)
        COUNTS["inductor_compile"] += 1
        if cache is not None and compiled.is_saveable():
            cache.save_artifact(key, compiled)
    return compiled, "compiled"


def _isa_host_key() -> str:
    """What inductor's CPU-ISA probes depend on: torch, the CPU's flags and the C++ compiler binary."""
    from torch._inductor.cpp_builder import get_cpp_compiler  # noqa: PLC0415, TID253  (heavy)

    compiler = os.path.realpath(shutil.which(get_cpp_compiler()) or get_cpp_compiler())
    stamp = os.stat(compiler).st_mtime_ns if os.path.exists(compiler) else 0
    return json.dumps([torch.__version__, os.uname().machine, _torch_compat.cpu_isa_flags(), compiler, stamp])


@contextlib.contextmanager
def isa_probe_cache(path: Path) -> Iterator[None]:
    """During the block, inductor's CPU-ISA probes (each a dry compile plus a child Python that dlopens
    the result, about a second each) answer from ``path`` when it holds a verdict from this host (same
    torch, CPU flags and compiler) for the same ISA, flags and probe code; new verdicts are added to it."""
    try:
        host = _isa_host_key()
    except Exception as exc:  # noqa: BLE001  (changed torch internals: probe as usual, and say so)
        _torch_compat.warn_degraded("the compile cache's CPU-ISA probe verdicts", f"{type(exc).__name__}: {exc}",
                                    "every compile probes the CPU's vector ISAs again")
        yield
        return
    try:
        record = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as exc:  # an unreadable record is rewritten below
        logger.debug("compile cache: ISA probe verdicts not used (%s)", exc)
        record = {}
    verdicts: dict[str, bool] = dict(record.get("verdicts", {})) if record.get("host") == host else {}
    added = False

    def wrap(original: Callable[[Any, str], bool]) -> Callable[[Any, str], bool]:
        def check_build(isa: Any, code: str) -> bool:
            nonlocal added
            key = f"{isa}|{isa.build_arch_flags()}|{hashlib.sha256(code.encode()).hexdigest()[:16]}"
            if key not in verdicts:
                verdicts[key], added = bool(original(isa, code)), True
            return verdicts[key]
        return check_build

    try:
        with _torch_compat.patched_isa_check_build(wrap):
            yield
    finally:
        if added:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps({"host": host, "verdicts": verdicts}, indent=1))
                os.replace(tmp, path)
            except OSError as exc:  # an optimisation only: the next process probes again
                logger.debug("compile cache: ISA probe verdicts not saved (%s)", exc)
