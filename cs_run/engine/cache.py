"""The record of compiled steps under ``compile_dir`` (docs/architecture.md#contracts).

A compiled step is keyed by a hash of the graph's generated code, the values of the small constants
it embeds, the input signature (shapes, dtypes, devices of state and batch), the data-parallel replicas
(world size and backend: the graph's all-reduce depends on them), the tier and the torch version;
for inductor also the host's CPU flags, torch's thread count and the source of the graph passes.
Each entry is a folder holding ``graph.py`` (the fx code, for reading) and ``summary.json``; an entry's
presence is what the log's "compile cache hit" means: this graph was compiled into this
compile_dir before. For the inductor tier, ``artifacts/`` holds the saved build a later process loads
instead of compiling (the trace still runs: it gives the key): on CPU the step's library
``<key>.<sha256>.aoti.so`` (``aot.py``), elsewhere inductor's artifact ``<key>.inductor.bin``.
Inductor's own caches live in ``compile_dir/inductor``; the fx tier rebuilds in milliseconds.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from cs_run import _torch_compat
from cs_run.engine import passes
from cs_run.engine.collectives import cache_key as replicas_key
from cs_run.engine.trace import TracedStep

__all__ = ["CompileCache", "graph_key", "open_cache"]

logger = logging.getLogger(__name__)


def graph_key(traced: TracedStep, batch: list[torch.Tensor], tier: str) -> str:
    """Hash of graph code + constants + input signature + replicas + tier + torch version."""
    h = hashlib.sha256()
    h.update(traced.gm.code.encode())
    for name, buf in sorted(traced.gm.named_buffers()) + sorted(
        (n, getattr(traced.gm, n)) for n in dir(traced.gm) if n.startswith("_tensor_constant")
    ):
        h.update(name.encode())
        if isinstance(buf, torch.Tensor) and buf.numel() <= 4096:
            h.update(buf.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes() if buf.numel() else b"")  # 0-d too
    for t in traced.state.tensors + batch:
        h.update(f"{tuple(t.shape)}|{tuple(t.stride())}|{t.dtype}|{t.device.type}|{t.requires_grad};".encode())
    h.update(f"{replicas_key(traced.replicas)}|{tier}|{torch.__version__}".encode())
    if tier != "fx":  # inductor's kernels use the CPU they were built on (and parallelise for the thread
        # count of the building process: built with one thread they are serial); it compiles the rewritten graph
        h.update(f"{_host_cpu()}|{torch.get_num_threads()}|{_passes_digest()}".encode())
    return h.hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def _passes_digest() -> str:
    """The graph passes' source: inductor compiles the traced graph as they rewrite it (``passes.py``)."""
    return hashlib.sha256(Path(passes.__file__).read_bytes()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _host_cpu() -> str:
    """The machine and its CPU feature flags (Linux's /proc/cpuinfo; the machine alone elsewhere)."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].strip() for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()}|{' '.join(sorted(flags.split()))}"


_WARNED: set[tuple[str, str]] = set()


def open_cache(compile_dir: str | os.PathLike) -> CompileCache | None:
    """The cache in ``compile_dir``, or None where it cannot be used: one of its folders is a file, or
    cannot be made or written (a read-only compile_dir). A cache is an optimisation, so that costs a
    compile without it (warned once per folder and reason), never the run."""
    cache = CompileCache(compile_dir)
    problem = cache.problem()
    if not problem:
        return cache
    if (str(cache.root), problem) not in _WARNED:
        _WARNED.add((str(cache.root), problem))
        logger.warning("compile cache: %s; compiling without the cache in %s (nothing is reused or saved); "
                       "give --compile_dir a writable folder", problem, cache.root)
    return None


class CompileCache:
    """Entries under ``<compile_dir>/cs_run_cache/<key>/``; writes are atomic (temp dir + rename)."""

    def __init__(self, compile_dir: str | os.PathLike) -> None:
        self.root = Path(compile_dir)
        self.entries = self.root / "cs_run_cache"

    @property
    def inductor_dir(self) -> Path:
        return self.root / "inductor"

    @property
    def artifacts_dir(self) -> Path:
        return self.root / "artifacts"

    def artifact_path(self, key: str) -> Path:
        return self.artifacts_dir / f"{key}.inductor.bin"

    def save_artifact(self, key: str, artifact: Any) -> None:
        """Saves an inductor ``CompiledArtifact`` for ``key`` (temp file + rename: never half-written)."""
        final = self.artifact_path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{key}.{os.getpid()}.tmp")
        try:
            _torch_compat.save_compiled_artifact(artifact, tmp)
            os.replace(tmp, final)
        except OSError as exc:  # a full or read-only disk costs the next process a compile, not this run
            logger.warning("compile cache: could not save %s (%s)", final, exc)
            tmp.unlink(missing_ok=True)

    def problem(self) -> str:
        """Why the cache cannot be used here ("" when it can): each of its folders must be a folder, or
        be creatable, in a writable place."""
        for path in (self.root, self.entries, self.artifacts_dir, self.inductor_dir):
            existing = path
            while not existing.exists() and existing.parent != existing:  # the nearest part that exists
                existing = existing.parent
            if not existing.is_dir():
                return f"{existing} is not a folder"
            if not os.access(existing, os.W_OK | os.X_OK):
                return f"{existing} is not writable"
        return ""

    def has(self, key: str) -> bool:
        return (self.entries / key / "summary.json").is_file()

    def store(self, key: str, traced: TracedStep, tier: str, compile_seconds: float) -> Path:
        final = self.entries / key
        if final.exists():
            return final
        try:
            self.entries.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.entries))
        except OSError as exc:  # the disk filled or turned read-only since open_cache: the next run compiles
            logger.warning("compile cache: could not record %s (%s)", final, exc)
            return final
        try:
            (tmp / "graph.py").write_text(traced.gm.code)
            record = asdict(traced.summary) | {"tier": tier, "compile_seconds": compile_seconds,
                                               "torch": torch.__version__}
            (tmp / "summary.json").write_text(json.dumps(record, indent=1, default=str))
            os.rename(tmp, final)
        except OSError:  # another process stored it first, or the disk is full
            shutil.rmtree(tmp, ignore_errors=True)
        return final
