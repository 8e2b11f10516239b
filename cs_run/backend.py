"""The backend: which device a run uses and how the CSX engine compiles (``cstorch.backend``).

One backend *type* per process (the vendor's rule): a second backend of another type raises the
vendor's ``RuntimeError``; another backend of the same type replaces the current one (its options may
differ). ``"CPU"`` and ``"GPU"`` run steps eagerly; ``"CSX"`` runs the whole-step engine on CUDA when
present, else on the CPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from typing import Any, Iterator

import torch

from cs_run import replicas
from cs_run.distributed import ClusterConfig, set_num_workers_per_csx
from cs_run.engine.cache import default_cache_dir
from cs_run.engine.step import EngineOptions
from cs_run.errors import BackendError, ParamsError
from cs_run.params import CompileTier

__all__ = ["BACKEND_TYPES", "Backend", "BackendType", "backend", "configure", "current_backend", "current_torch_device",
           "resolve_backend", "use_cs"]

logger = logging.getLogger(__name__)
BACKEND_TYPES = ("CPU", "GPU", "CSX")
_ALIASES = {"WSE_WS": "CSX", "WSE_PIPELINE": "CSX", "WSE": "CSX", "CUDA": "GPU"}
_CURRENT: Backend | None = None


class BackendType(str):
    """A backend type: compares equal to its name ("CSX"), and has the vendor enum's ``name`` and
    ``is_cpu`` / ``is_gpu`` / ``is_csx``."""

    @property
    def name(self) -> str:
        return str(self)

    is_cpu = property(lambda self: self == "CPU")
    is_gpu = property(lambda self: self == "GPU")
    is_csx = property(lambda self: self == "CSX")

    @staticmethod
    def from_str(backend_type: str) -> BackendType:
        return BackendType(_normalize_type(backend_type))


class _Device:
    """``backend.device``: the device type, and a context manager making it the default device."""

    def __init__(self, type_: str, torch_device: torch.device) -> None:
        self.type, self.torch_device = type_, torch_device
        self._stack: list[Any] = []

    def __enter__(self) -> _Device:
        ctx = torch.device(self.torch_device)
        ctx.__enter__()
        self._stack.append(ctx)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.pop().__exit__(*exc)

    def __repr__(self) -> str:
        return f"device(type={self.type!r}, torch_device={str(self.torch_device)!r})"


class Backend:
    """A configured backend. Build it with :func:`backend` (or :func:`configure`), not directly.

    Args:
        backend_type: ``"CPU"``, ``"GPU"`` or ``"CSX"``.
        artifact_dir: Where run artifacts go (default ``./cerebras_logs``).
        compile_dir: Compile cache (default: the per-user cache every run shares,
            ``engine.cache.default_cache_dir()``: ``$CS_RUN_CACHE_DIR`` or ``~/.cache/cs-run``).
        compile_only: CSX steps are traced and compiled into the cache, never executed.
        validate_only: CSX steps are only traced (compliance checked, graph reported).
        cluster_config: A :class:`~cs_run.distributed.ClusterConfig` (or a dict of its fields).
        compile_tier: a :class:`~cs_run.params.CompileTier` or its string: ``"auto"`` (default: builds fx
            and inductor and keeps the one the first steps measure faster), ``"fx"`` (bit-identical to eager,
            builds instantly) or ``"inductor"`` (fused kernels; slower to build, cached). None means the
            engine's default (``engine.compile.DEFAULT_TIER``).
        allow_recompile: A changed input signature retraces with a warning (default) instead of failing.
        checkpoint_steps: Default checkpoint interval for :class:`~cs_run.utils.data.DataExecutor`.
    """

    def __init__(self, backend_type: str, *, artifact_dir: str | os.PathLike = "./cerebras_logs",
                 compile_dir: str | os.PathLike | None = None, compile_only: bool = False,
                 validate_only: bool = False, cluster_config: ClusterConfig | dict | None = None,
                 compile_tier: str | None = None, allow_recompile: bool = True, checkpoint_steps: int | None = None,
                 **unknown: Any) -> None:
        if unknown:
            raise ParamsError(f"backend(): unknown option(s) {', '.join(sorted(unknown))}; valid options are "
                              "artifact_dir, compile_dir, compile_only, validate_only, cluster_config, "
                              "compile_tier, allow_recompile, checkpoint_steps")
        if compile_tier is not None and not isinstance(compile_tier, CompileTier):  # the API's string: checked here
            compile_tier = CompileTier.parse(compile_tier)
        if compile_only and validate_only:
            raise ParamsError("compile_only and validate_only are mutually exclusive; set at most one")
        self.backend_type = BackendType(_normalize_type(backend_type))
        self.artifact_dir = str(artifact_dir)
        self.compile_dir = str(compile_dir) if compile_dir is not None else default_cache_dir()
        self.compile_only, self.validate_only = bool(compile_only), bool(validate_only)
        if isinstance(cluster_config, dict):
            cluster_config = ClusterConfig(**cluster_config)
        self.cluster_config = cluster_config or ClusterConfig()
        set_num_workers_per_csx(self.cluster_config.num_workers_per_csx)  # the input workers of every DataLoader
        self.compile_tier, self.allow_recompile = compile_tier, allow_recompile
        self.checkpoint_steps = checkpoint_steps
        self.torch_device = _torch_device_for(self.backend_type)
        self.device = _Device(self.backend_type, self.torch_device)
        self.models: list[torch.nn.Module] = []

    is_cpu = property(lambda self: self.backend_type == "CPU")
    is_gpu = property(lambda self: self.backend_type == "GPU")
    is_csx = property(lambda self: self.backend_type == "CSX")

    def engine_options(self) -> EngineOptions:
        """The :class:`~cs_run.engine.EngineOptions` a CSX step runs with."""
        return EngineOptions(compile_tier=self.compile_tier, compile_dir=self.compile_dir, validate_only=self.validate_only,
                             compile_only=self.compile_only, allow_recompile=self.allow_recompile,
                             device=self.torch_device)

    def __repr__(self) -> str:
        return (f"Backend(backend_type={self.backend_type!r}, device={self.torch_device}, "
                f"compile_dir={self.compile_dir!r}, compile_only={self.compile_only}, "
                f"validate_only={self.validate_only})")


def _normalize_type(backend_type: str) -> str:
    if not isinstance(backend_type, str):
        raise ParamsError(f"Invalid backend type {backend_type!r}; must be one of {', '.join(BACKEND_TYPES)}")
    t = _ALIASES.get(backend_type.upper(), backend_type.upper())
    if t not in BACKEND_TYPES:
        raise ParamsError(f"Invalid backend type {backend_type!r}; must be one of {', '.join(BACKEND_TYPES)}")
    return t


def _torch_device_for(backend_type: str) -> torch.device:
    if backend_type == "CPU":
        return torch.device("cpu")
    if backend_type == "GPU":
        if not torch.cuda.is_available():
            raise BackendError("backend 'GPU' needs CUDA, which this torch/machine does not have; use 'CPU' or "
                               "'CSX' (the CSX engine runs on the CPU when there is no GPU)")
        return torch.device("cuda", replicas.cuda_index())
    return torch.device("cuda", replicas.cuda_index()) if torch.cuda.is_available() else torch.device("cpu")


def backend(backend_type: str | None = None, *args: Any, **options: Any) -> Backend | None:
    """Creates the process's backend (see :class:`Backend` for the options); with no arguments, returns
    the current backend (None before one exists), as the vendor's 2.x ``cstorch.backend()`` does.

    Raises:
        RuntimeError: a backend of another type already exists in this process (vendor rule).
        TypeError: options without a backend type.
    """
    global _CURRENT
    if backend_type is None:
        if args or options:
            raise TypeError("Expected backend_type when constructing a backend. Either provide one of \"CSX\", "
                            "\"CPU\", \"GPU\" to create a new backend, or call with no arguments to get the "
                            "instance of the current backend, if it exists.")
        return _CURRENT
    if args:
        raise TypeError(f"backend(): options are keyword-only, got {len(args)} positional argument(s)")
    t = _normalize_type(backend_type)
    if _CURRENT is not None and _CURRENT.backend_type != t:
        raise BackendError("Cannot instantiate multiple backends. A backend with type "
                           f"{_CURRENT.backend_type} has already been instantiated.")
    _CURRENT = Backend(t, **options)
    logger.debug("backend: %r", _CURRENT)
    return _CURRENT


def configure(model_dir: str = "./", compile_dir: str | None = None, compile_only: bool = False,
              validate_only: bool = False, checkpoint_steps: int = 0, **cluster: Any) -> Backend:
    """The older flat API (the vendor's cstorch porting guide): a CSX backend from run options plus ClusterConfig fields."""
    fields = set(ClusterConfig.__dataclass_fields__)
    unknown = sorted(set(cluster) - fields)
    if unknown:
        raise ParamsError(f"configure(): unknown option(s) {', '.join(unknown)}; valid cluster options are "
                          f"{', '.join(sorted(fields))}")
    return backend("CSX", artifact_dir=model_dir, compile_dir=compile_dir, compile_only=compile_only,
                   validate_only=validate_only, checkpoint_steps=checkpoint_steps or None,
                   cluster_config=ClusterConfig(**{k: v for k, v in cluster.items() if v is not None}))


def current_backend(raise_exception: bool = True, raise_warning: bool = True) -> Backend | None:
    """The process's backend (deprecated by the vendor in favour of ``cstorch.backend()``).

    Args:
        raise_exception: raise when no backend exists yet; otherwise return None.
        raise_warning: emit the vendor's DeprecationWarning.
    """
    if raise_warning:
        warnings.warn("cstorch.current_backend() is deprecated and will be removed in a future release. Use "
                      "cstorch.backend() instead to access the current backend.", DeprecationWarning, stacklevel=2)
    if _CURRENT is None and raise_exception:
        raise BackendError("No active Cerebras backend found. Create one first, e.g. cstorch.backend(\"CPU\") or "
                           "cstorch.compile(model, backend=...)")
    return _CURRENT


def current_torch_device() -> torch.device:
    """The torch device of the current backend; the CPU before one exists."""
    return _CURRENT.torch_device if _CURRENT is not None else torch.device("cpu")


def use_cs() -> bool:
    """True when the current backend is CSX (the Model Zoo's most-called check)."""
    return _CURRENT is not None and _CURRENT.is_csx


def resolve_backend(device: str | None = None, backend: Backend | dict | str | None = None) -> Backend:
    """Trainer-style resolution: exactly one of ``device`` / ``backend``, else the current (or CPU) one.

    Raises:
        ValueError: both are given (the vendor's message).
    """
    if device is not None and backend is not None:
        raise ParamsError("backend and device are mutually exclusive arguments of Trainer. "
                          "Please only provide one or the other")
    if isinstance(backend, Backend):
        return backend
    if isinstance(backend, dict):
        opts = dict(backend)
        return globals()["backend"](opts.pop("backend_type", "CPU"), **opts)
    if backend is not None or device is not None:
        return globals()["backend"](backend or device)
    return _CURRENT if _CURRENT is not None else globals()["backend"]("CPU")


@contextlib.contextmanager
def _reset_for_tests() -> Iterator[None]:
    """Test-only: forget the process's backend before and after the block (one type per process)."""
    global _CURRENT
    _CURRENT = None
    try:
        yield
    finally:
        _CURRENT = None
