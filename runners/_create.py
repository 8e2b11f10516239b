"""How a run's runner is made (``PyTorchBaseRunner.create``): the device's runner or the user's, and what
is refused before any of the user's code runs or anything is written.

Next to :mod:`cs_run.runners._build`, which builds the runner's parts; the loop itself is
:mod:`cs_run.runners.base`. The base class is passed in, so this module does not import it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from cs_run import parallel, replicas
from cs_run._logging import held_records
from cs_run.backend import BACKEND_TYPES, Backend
from cs_run.errors import ParamsError
from cs_run.metrics import MetricSet
from cs_run.params import Params
from cs_run.registry import resolve_object
from cs_run.resolve import data_function, model_function, resolve_params
from cs_run.runners import _checkpoint_files, _memory, _model_dir
from cs_run.runners._run_options import RunOptions

if TYPE_CHECKING:
    from cs_run.runners.base import PyTorchBaseRunner

__all__ = ["create", "check_batch_split", "held_for_run_log", "resolve_torch_device"]


def create(base: type["PyTorchBaseRunner"], params: Params, device: str, runner: Optional[str], mode: Optional[str],
           backend: Optional[Backend], builders: dict[str, Optional[Callable]]) -> "PyTorchBaseRunner":
    """``base.create``'s work (see :meth:`PyTorchBaseRunner.create`): the runner, with the log lines of
    its creation held for its first run's run.log and the metrics its user modules register its own."""
    device = device.upper()
    collected = MetricSet()  # the run's metrics include those its user modules register when imported
    with held_for_run_log(params) as created, collected.collecting():  # run.log begins with the creation's lines
        built = _create(base, params, device, runner, mode, backend, builders)
    built._created_records = created
    built.evaluator.metrics.update(collected)
    built.evaluator.metrics.add_imported(_code_modules(built, builders))  # also when imported by an earlier run
    return built


def _code_modules(runner: "PyTorchBaseRunner", builders: dict[str, Optional[Callable]]) -> set[str]:
    """The modules of the run's own code: its model's and its runner's classes, the functions that
    build its model and data (whose module-level metrics are the run's: docs/architecture.md)."""
    params = runner.params
    fns = [fn for fn in builders.values() if fn is not None]
    if builders.get("model_fn") is None:
        fns.append(model_function(params))
    for split, name in (("train", "train_input"), ("eval", "eval_input")):
        if getattr(params, name) is not None and builders.get(f"{split}_data_fn") is None:
            fns.append(data_function(params, name))
    names = {type(m).__module__ for m in runner.model.modules()} | {c.__module__ for c in type(runner).__mro__}
    return names | {fn.__module__ for fn in fns if isinstance(getattr(fn, "__module__", None), str)}


def _create(base: type["PyTorchBaseRunner"], params: Params, device: str, runner: Optional[str],
            mode: Optional[str], backend: Optional[Backend],
            builders: dict[str, Optional[Callable]]) -> "PyTorchBaseRunner":
    rc = params.runconfig
    # The device's runner among the package's own subclasses (cs_run.runners imports them all).
    found = [c for c in base.__subclasses__() if device in c.devices and c.__module__.startswith("cs_run.runners.")]
    if not found:
        raise ParamsError(f"--device: {device!r} is not one of {', '.join(BACKEND_TYPES)}")
    expected: type = found[0]
    try:
        options = RunOptions.resolve(params, device)  # each run option, checked once and carried typed
        strategy = parallel.build_strategy(options.layout)  # to start the replicas; the runner builds its own
        if mode != "eval_all" and not options.trace_only:  # the modes that load it
            _checkpoint_files.check_start_checkpoint(params, options.checkpoint_path)  # before anything is written
        _model_dir.check_model_dir(rc.model_dir)  # before any user code runs or anything is written
        if strategy.writes:  # ordinal 0 holds model_dir's lock (docs/architecture.md#replicas)
            _model_dir.check_not_locked(rc.model_dir)
        data_fns = {"train": builders.get("train_data_fn"), "eval": builders.get("eval_data_fn")}
        if mode is not None and not options.trace_only:
            options = options.for_mode(mode, params, data_fns)
        resolve_params(params, model_fn=builders.get("model_fn"), optimizer_fn=builders.get("optimizer_fn"),
                       data_fns=data_fns)
        spec = runner or rc.runner
        cls = expected
        if spec:
            cls = spec if isinstance(spec, type) else resolve_object(spec, key="runconfig.runner")
            cls = _runner_for_device(base, cls, expected, spec, device)
        target = backend.torch_device if backend is not None else torch.device(
            "cuda" if device in ("GPU", "CSX") and torch.cuda.is_available() else "cpu")
        _memory.check_model_fits(params, target, options.layout, training=options.training or (
            mode is None and params.optimizer is not None), model_fn=builders.get("model_fn"),
            optimizer_fn=builders.get("optimizer_fn"))  # before a byte of the model is allocated
        if not options.trace_only:  # N replicas: launch or join them (never returns in a launcher)
            check_batch_split(params, rc.num_csx)
            strategy.start(rc.num_csx, device, rc.collective_timeout)
        return cls(params, device=device, backend=backend, options=options, **builders)
    except ParamsError as e:  # a value in the params file: name its file:line
        raise params.locate_error(e) from e.__cause__


def _runner_for_device(base: type, cls: Any, expected: type, spec: Any, device: str) -> type:
    """The user's runner class for ``device``: a subclass of the device's runner as it is, a subclass of
    PyTorchBaseRunner (hooks only, one class for every device) combined with the device's runner."""
    name = spec if isinstance(spec, str) else getattr(spec, "__qualname__", spec)
    if isinstance(cls, type) and issubclass(cls, expected):
        return cls
    device_runners = [c for c in base.__subclasses__() if c.__module__.startswith("cs_run.runners.")]
    if not (isinstance(cls, type) and issubclass(cls, base)) or issubclass(cls, tuple(device_runners)):
        raise ParamsError(f"params: runconfig.runner: {name!r} must be a subclass of cs_run.runners.{expected.__name__} "
                          f"for --device {device}, or of cs_run.runners.PyTorchBaseRunner alone (one class for "
                          "every device)")
    key = (cls, expected)
    if key not in _COMBINED:
        _COMBINED[key] = type(cls.__name__, (cls, expected), {"__module__": cls.__module__,
                                                              "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
    return _COMBINED[key]


_COMBINED: dict[tuple[type, type], type] = {}


def check_batch_split(params: Params, num_replicas: int) -> None:
    """The params' batch sizes are global batches: each must split evenly over the replicas."""
    for name in ("train_input", "eval_input"):
        section = getattr(params, name)
        if num_replicas > 1 and section is not None:
            try:
                replicas.split_batch(section.batch_size, num_replicas)
            except ValueError as e:
                raise ParamsError(f"params: {name}.batch_size: {e}") from None


def resolve_torch_device(device: str) -> torch.device:
    """The torch device of ``--device`` CPU or GPU (a CSX runner's backend names its own)."""
    if device == "GPU":
        if not torch.cuda.is_available():
            raise ParamsError("--device GPU: no CUDA device is visible (torch.cuda.is_available() is False); "
                              "use --device CPU")
        return torch.device("cuda")
    return torch.device("cpu")


def held_for_run_log(params: Params) -> contextlib.AbstractContextManager[list[logging.LogRecord]]:
    """The log records of the block, kept for run.log on ordinal 0 (its one writer); none elsewhere."""
    return held_records(params.runconfig.logging) if parallel.current().writes else contextlib.nullcontext([])
