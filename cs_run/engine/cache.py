"""The record of compiled steps under ``compile_dir`` (docs/architecture.md#contracts).

The default compile_dir is one per user, shared by every model_dir (:func:`default_cache_dir`, as
torch.compile's cache is), so the same graph compiles once on a host, not once per run folder. That is
safe because a compiled step is keyed by everything it depends on: a hash of the graph's generated code,
the bytes of every constant it embeds, the input signature (shapes, strides, dtypes, devices of state
and batch), the data-parallel replicas (world size and backend: the graph's all-reduce depends on
them), the tier, the torch and cs-run versions; for inductor also the host's CPU flags (or the CUDA
device's name and capability), torch's thread count and the source of the engine's lowering (graph
passes, AOT build, torch shims). Writers never expose a partial file (temp + rename), so concurrent
runs can share the folder.
Each entry is a folder holding ``graph.py`` (the fx code, for reading) and ``summary.json`` (which
names its key: an entry under another name is not a hit); an entry's presence is what the log's
"compile cache hit" means: this graph was compiled into this compile_dir before. For the inductor
tier, ``artifacts/`` holds the saved build a later process loads instead of compiling (the trace still
runs: it gives the key): on CPU the step's library ``<key>.<sha256>.aoti.so`` (``aot.py``), elsewhere
inductor's artifact ``<key>.inductor.bin``.
Inductor's own caches live in ``compile_dir/inductor``; the fx tier rebuilds in milliseconds.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
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
from cs_run.engine import aot, passes
from cs_run.engine.replica_sync import cache_key as replicas_key
from cs_run.engine.trace import TracedStep

__all__ = ["CACHE_DIR_ENV", "CompileCache", "default_cache_dir", "graph_key", "open_cache"]

logger = logging.getLogger(__name__)
CACHE_DIR_ENV = "CS_RUN_CACHE_DIR"


def default_cache_dir() -> str:
    """The per-user compile cache every run shares unless given a compile_dir: ``$CS_RUN_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/cs-run``, else ``~/.cache/cs-run`` (the XDG rule torch.compile's cache follows too)."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cs-run")


def graph_key(traced: TracedStep, batch: list[torch.Tensor], tier: str) -> str:
    """Hash of graph code + constants + input signature + replicas + tier + torch and cs-run versions
    (+ for inductor: the host's CPU or CUDA device, threads, the lowering's source)."""
    h = hashlib.sha256()
    h.update(traced.gm.code.encode())
    for name, buf in sorted(traced.gm.named_buffers()) + sorted(
        (n, getattr(traced.gm, n)) for n in dir(traced.gm) if n.startswith("_tensor_constant")
    ):
        h.update(name.encode())
        if isinstance(buf, torch.Tensor):  # every byte: a compiled library embeds its constants' values
            h.update(f"{tuple(buf.shape)}|{buf.dtype}".encode())
            if buf.numel():
                h.update(buf.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    for t in traced.state.tensors + batch:
        h.update(f"{tuple(t.shape)}|{tuple(t.stride())}|{t.dtype}|{t.device.type}|{t.requires_grad};".encode())
    h.update(f"{replicas_key(traced.replicas)}|{tier}|{torch.__version__}|cs-run {_cs_run_version()}".encode())
    if tier != "fx":  # inductor's kernels use the CPU (or GPU) they were built on (and parallelise for the thread
        # count of the building process: built with one thread they are serial); it compiles the rewritten graph
        devices = {t.device for t in traced.state.tensors + batch}
        h.update(f"{_host_cpu()}|{_isa_override()}|{_cuda_devices(devices)}|{torch.get_num_threads()}|"
                 f"{_lowering_digest()}".encode())
    return h.hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def _cs_run_version() -> str:
    try:
        return importlib.metadata.version("cs-run")
    except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path: the sources' digest still counts
        return "unknown"


def _cuda_devices(devices: set[torch.device]) -> str:
    """The name and compute capability of each CUDA device the step uses (its kernels are built for them)."""
    return ",".join(f"{torch.cuda.get_device_name(d)}:{torch.cuda.get_device_capability(d)}"
                    for d in sorted(devices, key=str) if d.type == "cuda")


@functools.lru_cache(maxsize=1)
def _lowering_digest() -> str:
    """The source of what turns a traced graph into an inductor build: the graph passes (inductor compiles
    the graph as they rewrite it), the AOT build and torch's shims; a development tree changes them
    without a new version number."""
    h = hashlib.sha256()
    for module in (passes, aot, _torch_compat):
        h.update(Path(module.__file__).read_bytes())
    return h.hexdigest()[:16]


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


def _isa_override() -> str:
    """``ATEN_CPU_CAPABILITY``, which makes inductor build its CPU kernels for another vector ISA than the
    host's. Inductor's own cache does not tell them apart: a build under ``avx2`` over a cache filled by the
    host's (AVX-512) build returned losses of 1e36, and one under ``default`` did not compile (torch 2.13).
    So the override is part of the key and has its own inductor folder (:attr:`CompileCache.inductor_dir`)."""
    return os.environ.get("ATEN_CPU_CAPABILITY", "")


_WARNED: set[tuple[str, str]] = set()


def open_cache(compile_dir: str | os.PathLike) -> CompileCache | None:
    """The cache in ``compile_dir``, or None where it cannot be used: one of its folders is a file, or
    cannot be made or written (a read-only compile_dir). A cache is an optimisation, so that costs a
    compile without it (warned once per folder and reason), never the run."""
    cache = CompileCache(compile_dir)
    problem = cache.problem()
    if not problem:
        try:  # a new (per-user) cache folder is the user's alone: others cannot plant libraries to load
            cache.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            problem = f"cannot make {cache.root} ({exc.strerror})"
    if not problem:
        return cache
    if (str(cache.root), problem) not in _WARNED:
        _WARNED.add((str(cache.root), problem))
        logger.warning("compile cache: %s; compiling without the cache in %s (nothing is reused or saved); "
                       "give --compile_dir a writable folder (or set %s)", problem, cache.root, CACHE_DIR_ENV)
    return None


class CompileCache:
    """Entries under ``<compile_dir>/cs_run_cache/<key>/``; writes are atomic (temp dir + rename)."""

    def __init__(self, compile_dir: str | os.PathLike) -> None:
        self.root = Path(compile_dir)
        self.entries = self.root / "cs_run_cache"

    @property
    def inductor_dir(self) -> Path:
        """Inductor's own caches; a vector-ISA override (:func:`_isa_override`) gets a folder of its own."""
        override = _isa_override()
        return self.root / "inductor" / f"aten-{override}" if override else self.root / "inductor"

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
        """Whether ``key``'s graph was compiled here before: its entry names that key."""
        try:
            return json.loads((self.entries / key / "summary.json").read_text()).get("key") == key
        except (OSError, ValueError, AttributeError):  # missing, unreadable, or not this cache's record
            return False

    def store(self, key: str, traced: TracedStep, tier: str, compile_seconds: float, how: str = "compiled") -> Path:
        final = self.entries / key
        if self.has(key):
            return final
        try:
            self.entries.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.entries))
        except OSError as exc:  # the disk filled or turned read-only since open_cache: the next run compiles
            logger.warning("compile cache: could not record %s (%s)", final, exc)
            return final
        try:
            (tmp / "graph.py").write_text(traced.gm.code)
            record = asdict(traced.summary) | {"key": key, "tier": tier, "how": how, "compile_seconds": compile_seconds,
                                               "torch": torch.__version__, "cs_run": _cs_run_version()}
            (tmp / "summary.json").write_text(json.dumps(record, indent=1, default=str))
            if final.exists() and not self.has(key):  # a stale or foreign entry under this name: replaced
                shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
        except OSError:  # another process stored it first, or the disk is full
            shutil.rmtree(tmp, ignore_errors=True)
        return final

    def inductor_builds(self, newest: int = 20) -> list[tuple[int, float]]:
        """``(graph ops, seconds)`` of the inductor builds recorded here (compiled, not loaded), newest first:
        what this host's builds cost (``compile.estimate_inductor_seconds``)."""
        try:
            entries = sorted(self.entries.glob("*/summary.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        except OSError:
            return []
        builds = []
        for path in entries:
            try:
                record = json.loads(path.read_text())
                if record.get("tier") == "inductor" and record.get("how") == "compiled":
                    builds.append((int(record["num_ops"]), float(record["compile_seconds"])))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):  # a damaged record: not evidence
                continue
            if len(builds) >= newest:
                break
        return builds

    def inductor_saved(self, key: str, device: torch.device) -> bool:
        """Whether an inductor build of ``key`` is saved here (loading it costs about nothing): on CPU a
        library whose digest checks (``aot.find_artifact``), elsewhere inductor's artifact file."""
        if device.type == "cpu":
            return aot.find_artifact(self.artifacts_dir, key) is not None
        return self.artifact_path(key).is_file()
