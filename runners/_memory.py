"""The memory a run's model needs, known before a byte of it is allocated, against the memory there is
(docs/architecture.md#a-runs-files-and-its-end).

The model is built once on the meta device (shapes and dtypes, no storage; initializers skipped, as
they would write nothing): its parameters and buffers, their gradients when training, and the
optimizer's state (built on those meta parameters: cs-run's optimizers create all their state up
front) are what the weights alone take, before any activation. The build is stopped as soon as its
running total passes the memory there is, so a million-layer model is refused after the layers that
fill the memory, each built without storage (a build that takes longer than ``SLOW_S`` says so).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Optional

import torch
from torch.overrides import TorchFunctionMode

from cs_run import replicas
from cs_run.errors import ParamsError
from cs_run.metrics.metric import discarded_registrations
from cs_run.optim import Optimizer
from cs_run.parallel import DATA_PARALLEL, Layout, Offload
from cs_run.params import Params
from cs_run.runners import _build
from cs_run.runners._rng import preserved_rng

__all__ = ["ModelSize", "NegativeSize", "available_memory", "check_model_fits", "format_bytes", "measure_model"]

logger = logging.getLogger("cs_run.runners")

SLOW_S = 10.0
"""A meta build that takes longer logs that it is checking the model's size (and its module count)."""
ASSUMED_STATE_FACTOR = 2
"""Optimizer state per trainable parameter byte when the optimizer's state cannot be built up front:
Adam's two moments (the largest of the common rules; SGD with momentum keeps one)."""


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """Bytes of one replica's model state (``exceeded``: the meta build stopped once it passed the limit,
    so the sizes are what was built until then)."""

    weights: int
    gradients: int = 0
    optimizer: int = 0
    optimizer_assumed: bool = False
    exceeded: bool = False

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer

    def describe(self) -> str:
        parts = [f"parameters and buffers {format_bytes(self.weights)}"]
        if self.gradients:
            parts.append(f"gradients {format_bytes(self.gradients)}")
        if self.optimizer:
            assumed = f", assumed {ASSUMED_STATE_FACTOR} x the parameters" if self.optimizer_assumed else ""
            parts.append(f"optimizer state {format_bytes(self.optimizer)}{assumed}")
        return ", ".join(parts)


class NegativeSize(ValueError):
    """The model asked for a tensor with a negative dimension (a size key below 0)."""


class _Stop(BaseException):
    """Ends the meta build once it passes the limit; a BaseException so that a model's own
    ``except Exception`` lets it pass."""


def measure_model(build: Callable[[], Any], build_optimizer: Optional[Callable[[torch.nn.Module], Any]],
                  *, training: bool, limit: Optional[int]) -> Optional[ModelSize]:
    """The bytes ``build()`` (and ``build_optimizer(model)``'s state) would allocate, from a build on the
    meta device; None when that is unknown (the build fails there, or returns a model built earlier).
    ``training``: the trainable parameters' gradients count too. ``limit``: stop as soon as the weights
    (and gradients) pass it. The build leaves nothing behind: no metric registered, no random stream
    advanced, no log line or warning.

    Raises:
        NegativeSize: the model asked for a tensor with a negative dimension.
    """
    counter = _Counter(training, limit, time.monotonic() + SLOW_S)
    with _trial_build(), counter.counting():
        try:
            model = build()
        except _Stop:
            return ModelSize(counter.weights, counter.gradients, exceeded=True)
        except Exception as exc:  # noqa: BLE001  (any failure here is the real build's to report)
            if isinstance(exc, RuntimeError) and "overflow" in str(exc).lower():
                return ModelSize(2 ** 63 - 1, exceeded=True)  # more elements than an int64 counts
            if isinstance(exc, RuntimeError) and "negative dimension" in str(exc):
                raise NegativeSize(str(exc).splitlines()[0]) from None  # the real build fails the same way
            logger.debug("model size not checked against memory: %s: %s", type(exc).__name__, exc)
            return None
    if not isinstance(model, torch.nn.Module):
        return None
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
    if not any(t.is_meta for t in tensors):  # built before (the Trainer's module): its memory is in use already
        return None
    trainable = sum(_nbytes(p) for p in model.parameters() if p.requires_grad)
    state, assumed = _optimizer_bytes(build_optimizer, model, trainable) if build_optimizer else (0, False)
    return ModelSize(sum(_nbytes(t) for t in tensors), trainable if training else 0, state, assumed)


class _Counter:
    """Running totals of the tensors modules register while the meta build runs."""

    def __init__(self, training: bool, limit: Optional[int], slow_at: float) -> None:
        self.training, self.limit, self.slow_at = training, limit, slow_at
        self.weights = self.gradients = self.registrations = 0
        self._seen: dict[int, int] = {}

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        hooks = [torch.nn.modules.module.register_module_parameter_registration_hook(self._parameter),
                 torch.nn.modules.module.register_module_buffer_registration_hook(self._buffer),
                 torch.nn.modules.module.register_module_module_registration_hook(self._module)]
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()

    def _parameter(self, module: torch.nn.Module, name: str, param: Optional[torch.Tensor]) -> None:
        replaced = module._parameters.get(name)
        if replaced is not None and replaced is not param:  # a tied weight replacing a fresh one
            self._add(replaced, -1, replaced.requires_grad)
        if param is not None:
            self._add(param, 1, param.requires_grad)

    def _buffer(self, module: torch.nn.Module, name: str, buffer: Optional[torch.Tensor]) -> None:
        if buffer is not None:
            self._add(buffer, 1, False)

    def _module(self, *_: Any) -> None:
        self._tick()

    def _tick(self) -> None:
        """Says once, after ``SLOW_S``, why nothing else happens yet (checked every 1000 registrations)."""
        self.registrations += 1
        if self.registrations % 1000 == 0 and time.monotonic() > self.slow_at:
            self.slow_at = float("inf")
            with _logging_enabled():
                logger.info("checking the model's size against memory before building it (a build on the meta device: "
                            "%d tensors so far, %s)", len(self._seen), format_bytes(self.weights))

    def _add(self, tensor: torch.Tensor, sign: int, trainable: bool) -> None:
        if (id(tensor) in self._seen) == (sign > 0):
            return
        if sign > 0:
            self._seen[id(tensor)] = 1
        else:
            del self._seen[id(tensor)]
        size = sign * _nbytes(tensor)
        self.weights += size
        self.gradients += size if trainable and self.training else 0
        if self.limit is not None and self.weights + self.gradients > self.limit:
            raise _Stop
        self._tick()


@contextlib.contextmanager
def _trial_build() -> Iterator[None]:
    """A build the run does not keep: on the meta device, quiet, its metrics and random draws undone."""
    disabled = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with preserved_rng(), discarded_registrations(), warnings.catch_warnings(), torch.device("meta"), \
                _SkipInit():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(disabled)


@contextlib.contextmanager
def _logging_enabled() -> Iterator[None]:
    disabled = logging.root.manager.disable
    logging.disable(logging.NOTSET)
    try:
        yield
    finally:
        logging.disable(disabled)


_INITIALIZERS = frozenset(name for name in dir(torch.nn.init) if name.endswith("_") and not name.startswith("_")) | {
    "uniform_", "normal_", "zero_", "fill_", "random_", "bernoulli_", "exponential_", "geometric_", "log_normal_",
    "cauchy_"}


class _SkipInit(TorchFunctionMode):
    """Initializers of meta tensors return at once: they write nothing there, and their decompositions
    are most of a meta build's time (half of an ``nn.Linear``'s)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in _INITIALIZERS:
            target = args[0] if args else kwargs.get("tensor")
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


def check_model_fits(params: Params, device: torch.device, layout: Layout = DATA_PARALLEL, *, training: bool,
                     model_fn: Optional[Callable] = None, optimizer_fn: Optional[Callable] = None) -> None:
    """Refuse, before the model is built, a model whose weights (with gradients when ``training``, and the
    optimizer's state) do not fit: ``runconfig.num_csx`` replicas of it in the host's memory, or one in
    the free memory of its CUDA device (``layout``: sharded, each holds 1/N). A launched replica checks its
    own device only: the launcher checked the host for all of them.

    Raises:
        ParamsError: naming the model's largest size keys (or num_csx), the bytes needed and available.
    """
    n = params.runconfig.num_csx
    launched = replicas.in_replica_env() and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if device.type == "cuda" and device.index is None:  # a replica's own device (replicas.start sets it later)
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) if launched else
                              torch.cuda.current_device())
    host = None if launched else available_memory(torch.device("cpu"))
    gpu = available_memory(device) if device.type == "cuda" and (n == 1 or launched) else None
    if host is None and gpu is None:
        return
    build_optimizer = optimizer_fn or (lambda model: _build.build_optimizer(params.optimizer, model))
    try:
        size = measure_model(lambda: _build.build_model(params, model_fn),
                             build_optimizer if params.optimizer is not None or optimizer_fn else None,
                             training=training, limit=min(a for a, _ in filter(None, (host, gpu))))
    except NegativeSize as e:
        keys = [(k, v) for k, v in _size_keys(params) if _smallest(v) < 0] or [("model", None)]
        raise ParamsError(f"{params.head}{params.name(keys[0][0])}: a size is negative ({e}); sizes are positive "
                          f"integers{params.where(keys[0][0])}") from None
    if size is None:
        return
    on_host = size.weights if device.type == "cuda" else size.total  # a CUDA model is built on the host first
    on_device = size.total
    if layout.sharded:
        # Each replica builds the whole model, then keeps 1/N of it (cs_run.parallel.fsdp): its peak is the
        # larger of the whole weights and its shard of weights, gradients and optimizer state.
        on_host = on_device = max(size.weights, -(-size.total // n))
        if layout.offload is not Offload.NONE:
            on_device = size.weights  # built there whole before it is sharded and offloaded
    process = _resident_bytes() if n > 1 else 0  # each replica is a new process like this one, plus its model
    for copies, needed, available in ((n, on_host + process, host), (1, on_device, gpu)):
        if available is not None and copies * needed > available[0]:
            _refuse(params, size, copies, needed, available)


def _refuse(params: Params, size: ModelSize, copies: int, needed: int, available: tuple[int, str]) -> NoReturn:
    if copies > 1 and needed <= available[0]:  # one fits: the number of replicas is the problem
        key = "runconfig.num_csx"
        raise ParamsError(f"{params.head}{params.name(key)}: {copies} replicas need {format_bytes(copies * needed)} of "
                          f"memory, {format_bytes(needed)} each (a process the size of this one, "
                          f"{format_bytes(needed - size.total)}, and a model of {format_bytes(size.total)}: "
                          f"{size.describe()}), but there is {format_bytes(available[0])} ({available[1]}); run "
                          f"fewer replicas, at most {available[0] // needed}{params.where(key)}")
    keys = _size_keys(params)[:3]
    key = keys[0][0] if keys else "model"
    largest = f" (the largest: {', '.join(f'{params.name(k)}={v}' for k, v in keys)})" if keys else ""
    needs = ("needs more memory than there is: its parameters alone pass the " if size.exceeded else
             f"needs at least {format_bytes(needed)} of memory ({size.describe()}), but there is ")
    raise ParamsError(f"{params.head}{params.name(key)}: the model {needs}{format_bytes(available[0])} "
                      f"({available[1]}); make its sizes smaller{largest}{params.where(key)}")


def _size_keys(params: Params) -> list[tuple[str, Any]]:
    """The model keys that hold integers (or lists of them), the largest first: the sizes a user can change."""
    found = [(f"model.{k}", v) for k, v in params.model.extra.items()
             if _is_int(v) or (isinstance(v, list) and v and all(_is_int(x) for x in v))]
    return sorted(found, key=lambda kv: -_largest(kv[1]))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _largest(v: Any) -> int:
    return max(v) if isinstance(v, list) else v


def _smallest(v: Any) -> int:
    return min(v) if isinstance(v, list) else v


def _optimizer_bytes(build_optimizer: Callable[[torch.nn.Module], Any], model: torch.nn.Module,
                     trainable: int) -> tuple[int, bool]:
    """The optimizer's state on the meta parameters; ``ASSUMED_STATE_FACTOR`` x the trainable bytes when it
    cannot be built there, or keeps its state lazily (torch.optim makes it at the first step)."""
    try:
        with _trial_build():
            optimizer = build_optimizer(model)
    except Exception as exc:  # noqa: BLE001  (the real build reports it)
        logger.debug("optimizer state not measured: %s: %s", type(exc).__name__, exc)
        return ASSUMED_STATE_FACTOR * trainable, True
    state = {id(t): t for per_param in getattr(optimizer, "state", {}).values() if isinstance(per_param, dict)
             for t in per_param.values() if isinstance(t, torch.Tensor)}
    if not state and not isinstance(optimizer, Optimizer):
        return ASSUMED_STATE_FACTOR * trainable, True
    return sum(_nbytes(t) for t in state.values()), False


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def available_memory(device: torch.device) -> Optional[tuple[int, str]]:
    """Bytes free for a new process's tensors on ``device``, and where the number comes from; None when
    unknown. The host's is the smallest of the kernel's MemAvailable and the room left under this
    process's cgroup limit (a container's)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, f"free on {device}, {torch.cuda.get_device_name(device)}"
    found = []
    meminfo = _read("/proc/meminfo")
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            found.append((int(line.split()[1]) * 1024, "the host's MemAvailable"))
    for limit, usage in (("memory.max", "memory.current"), ("memory/memory.limit_in_bytes",
                                                             "memory/memory.usage_in_bytes")):
        cap, used = _read(f"/sys/fs/cgroup/{limit}").strip(), _read(f"/sys/fs/cgroup/{usage}").strip()
        if cap.isdigit() and used.isdigit() and int(cap) < 2 ** 60:
            found.append((max(0, int(cap) - int(used)), "left under this container's memory limit"))
    if not found and hasattr(os, "sysconf"):
        with contextlib.suppress(ValueError, OSError):
            found.append((os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "the host's free pages"))
    return min(found) if found else None


def _resident_bytes() -> int:
    """This process's resident memory (Linux's /proc/self/statm; 0 elsewhere): what a replica process,
    which imports the same modules, takes before its model."""
    fields = _read("/proc/self/statm").split()
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE") if len(fields) > 1 else 0


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def format_bytes(n: int) -> str:
    """``n`` bytes in the largest binary unit that keeps the number at 1 or more (one decimal)."""
    if n < 1024:
        return f"{n} B"
    units = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    power = min(len(units), (n.bit_length() - 1) // 10)
    return f"{n / 1024 ** power:.1f} {units[power - 1]}"
