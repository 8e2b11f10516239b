"""``cs_run.Trainer``: the programmatic face of the runners (the Model Zoo Trainer's shape).

::

    trainer = cstorch.Trainer(device="CSX", model_dir="model_dir", model=model, optimizer=optimizer,
                              loop={"num_steps": 100, "eval_steps": 10}, checkpoint={"steps": 50})
    trainer.fit(train_dataloader, val_dataloader)
    trainer.validate(val_dataloader)

``device`` and ``backend`` are mutually exclusive; once a backend type is set in a process, every other
Trainer must use the same type (its other backend options may differ). :func:`trainers_from_config`
builds Trainers from the ``trainer: {init: ..., fit: ...}`` YAML form.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from dataclasses import fields
from typing import Any, Callable, Optional, Union

import torch

from cs_run import parallel
from cs_run._checks import unknown_key_error
from cs_run._logging import setup_console_logging
from cs_run.backend import Backend, resolve_backend
from cs_run.errors import ParamsError
from cs_run.frontends.flags import cluster_keys, trainer_keys
from cs_run.optim import ParallelSchedulers
from cs_run.params import InputParams, ModelParams, OptimizerParams, Params, RunConfig, build_section, check_runconfig
from cs_run.runners import PyTorchBaseRunner, latest_checkpoint
from cs_run.sparse import SparsityAlgorithm
from cs_run.sparsity_params import check_sparsity
from cs_run.utils.data import DataLoader as CsDataLoader

__all__ = ["Trainer", "trainers_from_config"]

logger = logging.getLogger(__name__)

# Trainer key -> runconfig key of the loop, checkpoint and logging arguments: from RunConfig's declaration.
_LOOP_KEYS = trainer_keys("loop")
_CHECKPOINT_KEYS = trainer_keys("checkpoint")
_LOGGING_KEYS = trainer_keys("logging")
_NAMES = {f"runconfig.{key}": f"{argument}.{name}" for argument, keys in
          (("loop", _LOOP_KEYS), ("checkpoint", _CHECKPOINT_KEYS), ("logging", _LOGGING_KEYS))
          for name, key in keys.items()} | {"optimizer.grad_accum_steps": "loop.grad_accum_steps",
                                            "train_input": "train_dataloader", "eval_input": "val_dataloader",
                                            "runconfig.sharding": "sharding", "runconfig.offload": "offload"}
"""The key paths the Trainer's arguments set, as the user wrote them (``loop.num_steps``, ``train_dataloader``
for a dict input's section): messages about their values name these, also a data function's refusal of a
dict input (:attr:`cs_run.params.Params.names`, :meth:`cs_run.params.Params.named`)."""
_HEAD = "Trainer: "
_PRECISION_KEYS = {"mixed_precision", "use_bfloat16", "fp16_type", "loss_scaling_factor", "initial_loss_scale",
                   "steps_per_increase", "min_loss_scale", "max_loss_scale", "overflow_tolerance",
                   "max_gradient_norm", "max_gradient_value"}


_ARGUMENT_FORMS = {"loop": "a dict such as {'num_steps': 100, 'eval_frequency': 10}",
                   "checkpoint": "a dict such as {'steps': 50, 'max_checkpoints': 3}",
                   "precision": "a dict such as {'mixed_precision': True, 'max_gradient_norm': 1.0}",
                   "logging": "a dict such as {'log_steps': 10, 'log_level': 'INFO'} or an int (log_steps)",
                   "runner": "a runner class or 'module:Class'"}
"""What each dict-like Trainer argument takes, for the message when it gets something else."""


class Trainer:
    """Train and validate a model on CPU, GPU or CSX with the runners' loop, checkpoints and logs.

    Args:
        device: "CPU", "GPU" or "CSX" (a backend with default settings). Exclusive with ``backend``.
        backend: A :class:`~cs_run.backend.Backend` (or a dict of its options, with ``backend_type``).
        model_dir: Output folder (checkpoints, summaries, run log).
        model: A ``torch.nn.Module`` whose ``forward(batch)`` returns the loss, a callable returning one,
            or a params ``model`` section (``{"name": "fc_mnist", ...}``).
        optimizer: A ``torch.optim.Optimizer`` over the model's parameters, a callable ``(model) ->
            optimizer``, or a params ``optimizer`` section (``{"optimizer_type": "SGD", ...}``).
        schedulers: An LR or weight-decay scheduler, a callable ``(optimizer) -> scheduler``, or a list of
            them (with an optimizer object): the vendor Trainer's list, every one stepped after each optimizer
            step, side by side (each sets its ``param_group_key`` of the groups its ``param_group_tags``
            name; two of one key may not set one group), checkpointed as a list, as the params form's
            ``optimizer.schedulers`` (:class:`cs_run.optim.ParallelSchedulers`). An empty list is none. With an
            optimizer params section, the list is of the YAML form's ``{"CosineDecayLR": {...}}`` mappings
            (the section's ``schedulers``).
        precision: Mixed precision and step numerics: mixed_precision, use_bfloat16, loss_scaling_factor,
            max_gradient_norm, ... (the params keys of the same names).
        loop: num_steps / max_steps / num_epochs / steps_per_epoch / eval_steps / eval_frequency, and
            early stopping: early_stopping_metric (e.g. "eval/loss"), early_stopping_mode,
            early_stopping_patience, early_stopping_min_delta (the runconfig keys of the same names).
        checkpoint: steps, max_checkpoints, save_initial_checkpoint, autoload.
        logging: ``{"log_steps": N, "log_level": "INFO", "disable_progress_bar": False}`` (or N). The log
            lines go to model_dir/run.log and to the console, unless the program configured logging
            itself (a handler on the root or the ``cs_run`` logger): then they go where it says.
        sparsity: Sparse weights, as the vendor Trainer's ``sparsity``: a
            :class:`cs_run.sparse.SparsityAlgorithm` (applied as it is; it serves one model, so a Trainer
            that builds its model per run needs one of the other forms), a callable returning one (or
            None; called once per run), or a params ``sparsity`` section (a level, a mapping or a list of
            them, as the YAML form gives it; built per run by :func:`cs_run.sparse.configure`).
        sharding: How the ``num_csx`` replicas of ``backend``'s cluster_config hold the model: "none"
            (data parallel) or "fsdp" (torch FSDP2, 1/N of the parameters, gradients and optimizer state
            per replica; CPU and GPU): ``runconfig.sharding``.
        offload: "cpu" keeps the sharded state in host memory (``runconfig.offload``); "none" by default.
        seed: Seeds every RNG before the model is built.
        runner: A runner class (or "module:Class") with hooks, e.g. ``on_eval_metrics``: a subclass of
            :class:`~cs_run.runners.PyTorchBaseRunner` serves every device.

    Raises:
        ValueError: both ``device`` and ``backend`` are given.
        RuntimeError: a backend of another type was already created in this process.
    """

    def __init__(self, device: Optional[str] = None, backend: Union[Backend, dict, None] = None,
                 model_dir: str = "./model_dir", model: Any = None, optimizer: Any = None,
                 schedulers: Any = None, precision: Optional[dict] = None, loop: Optional[dict] = None,
                 checkpoint: Optional[dict] = None, logging: Union[dict, int, None] = None,
                 seed: Optional[int] = None, runner: Union[str, type, None] = None, sparsity: Any = None,
                 sharding: str = "none", offload: str = "none") -> None:
        self.backend = resolve_backend(device=device, backend=backend)
        if model is None:
            raise ParamsError("Trainer: model is required (an nn.Module, a callable returning one, or a model "
                              "params section)")
        for what, value, forms in (("loop", loop, dict), ("checkpoint", checkpoint, dict), ("precision", precision, dict),
                                   ("logging", logging, (dict, int)), ("runner", runner, (str, type))):
            if value is not None and (not isinstance(value, forms) or isinstance(value, bool)):
                raise ParamsError(f"Trainer: {what} must be {_ARGUMENT_FORMS[what]}, got {type(value).__name__} "
                                  f"{value!r:.40}")
        _check_schedulers(schedulers)
        if isinstance(model_dir, (str, os.PathLike)) and not os.fspath(model_dir).strip():
            raise ParamsError("Trainer: model_dir: an empty path (it would be the current folder); give a folder name "
                              "such as './model_dir'")
        self.model_dir = model_dir
        self._runconfig = _runconfig(model_dir, self.backend, loop or {}, checkpoint or {}, logging, seed,
                                     {"sharding": sharding, "offload": offload})
        _check_strategy(self._runconfig, self.backend)
        _console_logging(self._runconfig.logging)
        self._runner_class = runner
        precision = dict(precision or {})
        _reject_unknown("precision", precision, _PRECISION_KEYS)
        self._model_section, self._model_fn = _model_parts(model, precision)
        self._optimizer_section, self._optimizer_fn, self._scheduler_fn = _optimizer_parts(
            optimizer, schedulers, precision, (loop or {}).get("grad_accum_steps"))
        self._sparsity_section, self._sparsity_fn = _sparsity_parts(sparsity)
        self.runner = None

    def fit(self, train_dataloader: Any, val_dataloader: Any = None, ckpt_path: Optional[str] = None) -> dict:
        """Train, then validate on ``val_dataloader`` when given. Returns the validation results (empty
        without one).

        ``ckpt_path``: a checkpoint file to start from; ``"last"``: the newest checkpoint in model_dir
        (a warning when there is none); None: the newest one when ``checkpoint={"autoload": True}`` (the
        default), else none. A Ctrl-C ends training after the step in flight with a checkpoint of it
        (docs/architecture.md#interrupts): ``fit(ckpt_path="last")`` continues from there.
        """
        if self._optimizer_section is None:
            raise ParamsError("Trainer.fit: an optimizer is required to train")
        _check_loader("Trainer.fit: train_dataloader", train_dataloader, required=True)
        _check_loader("Trainer.fit: val_dataloader", val_dataloader)
        runner = self._build_runner(train_dataloader, val_dataloader, ckpt_path, "fit")
        if self.backend.compile_only or self.backend.validate_only:
            return runner.run("train")  # the compiler traces the train step and runs nothing
        return runner.run("train_and_eval" if val_dataloader is not None else "train")

    def validate(self, val_dataloader: Any, ckpt_path: Optional[str] = None) -> dict:
        """Evaluate the model (after loading ``ckpt_path``, ``"last"`` or by default model_dir's newest
        checkpoint, if any)."""
        _check_loader("Trainer.validate: val_dataloader", val_dataloader, required=True)
        return self._build_runner(None, val_dataloader, ckpt_path, "validate").run("eval")

    def _build_runner(self, train_dataloader: Any, val_dataloader: Any, ckpt_path: Optional[str], verb: str):
        if ckpt_path == "last":
            rc = dataclasses.replace(self._runconfig, checkpoint_path=None, autoload_checkpoint=True)
            if latest_checkpoint(rc.model_dir) is None:
                logger.warning('ckpt_path="last": no checkpoint in %s; starting from the initial weights',
                               rc.model_dir)
        else:
            rc = dataclasses.replace(self._runconfig, checkpoint_path=ckpt_path)
        params = Params(model=self._model_section, optimizer=self._optimizer_section, runconfig=rc,
                        sparsity=self._sparsity_section,
                        train_input=_input_section("train_input", train_dataloader),
                        eval_input=_input_section("eval_input", val_dataloader),
                        given_by={"runconfig.checkpoint_path": f"Trainer.{verb}: ckpt_path"}, names=_NAMES, head=_HEAD)
        self.runner = PyTorchBaseRunner.create(
            params, device=self.backend.backend_type, backend=self.backend, runner=self._runner_class,
            model_fn=self._model_fn,
            train_data_fn=_data_fn(train_dataloader), eval_data_fn=_data_fn(val_dataloader),
            optimizer_fn=self._optimizer_fn, lr_scheduler_fn=self._scheduler_fn, sparsity_fn=self._sparsity_fn)
        return self.runner


def trainers_from_config(config: Union[dict, list]) -> list[tuple[Trainer, dict]]:
    """Trainers from the YAML form: ``{"trainer": {"init": {...}, "fit": {...}}}`` or a list of those.

    ``init`` takes the Trainer's arguments (``model`` and ``optimizer`` as params sections); ``fit`` /
    ``validate`` take dataloader sections (input keys of the model's data function). Returns each
    Trainer with its ``fit`` / ``validate`` sections, the keyword arguments of :meth:`Trainer.fit` /
    :meth:`Trainer.validate` (``{"train_dataloader": {...}, "val_dataloader": {...}}``).
    """
    entries = config if isinstance(config, list) else [config]
    out = []
    for i, entry in enumerate(entries):
        section = entry.get("trainer") if isinstance(entry, dict) else None
        if not isinstance(section, dict) or "init" not in section:
            raise ParamsError(f"trainer[{i}]: expected a mapping 'trainer: {{init: ..., fit: ...}}'")
        _reject_unknown(f"trainer[{i}]", section, {"init", "fit", "validate"})
        for key, value in section.items():
            if not isinstance(value, dict):
                raise ParamsError(f"trainer[{i}].{key}: expected a mapping of "
                                  f"{'Trainer arguments' if key == 'init' else 'dataloader sections'}, got "
                                  f"{type(value).__name__}")
        _reject_unknown(f"trainer[{i}].init", section["init"], set(inspect.signature(Trainer).parameters))
        out.append((Trainer(**section["init"]), {k: v for k, v in section.items() if k != "init"}))
    return out


def _console_logging(level: str) -> None:
    """The Trainer's log lines on the console, as Lightning's and Hugging Face's trainers print theirs,
    unless the program set up logging (a handler on the root or the cs_run logger decides then)."""
    if logging.getLogger().handlers or logging.getLogger("cs_run").handlers:
        return
    setup_console_logging(level)


def _runconfig(model_dir: str, backend: Backend, loop: dict, checkpoint: dict, logging: Any,
               seed: Optional[int], strategy: dict) -> RunConfig:
    _reject_unknown("loop", loop, set(_LOOP_KEYS) | {"grad_accum_steps"})
    _reject_unknown("checkpoint", checkpoint, set(_CHECKPOINT_KEYS))
    log = {"log_steps": logging} if isinstance(logging, int) else dict(logging or {})
    _reject_unknown("logging", log, set(_LOGGING_KEYS))
    rc: dict[str, Any] = {"model_dir": model_dir, "seed": seed, **strategy}
    for given, keys in ((loop, _LOOP_KEYS), (checkpoint, _CHECKPOINT_KEYS), (log, _LOGGING_KEYS)):
        rc.update({keys[k]: v for k, v in given.items() if k in keys})
    cc = backend.cluster_config  # num_csx replicas on every device
    rc.update({key: getattr(cc, key) for key in cluster_keys()})
    if backend.is_csx:  # the backend's own options drive the CS runner's backend
        rc.update(compile_dir=backend.compile_dir, compile_only=backend.compile_only,
                  validate_only=backend.validate_only,
                  compile_tier=None if backend.compile_tier is None else backend.compile_tier.value)  # checked by backend()
    built = build_section(RunConfig, "runconfig", rc, lambda key: "" if key in _NAMES else " (Trainer arguments)",
                          names=_NAMES, head=_HEAD)
    check_runconfig(built, names=_NAMES, head=_HEAD)
    return built


_WORDS = parallel.Words(head=_HEAD, key="", device="device", set_fsdp="")
"""How the Trainer's arguments are named in the sharding / offload check's messages."""


def _check_strategy(rc: RunConfig, backend: Backend) -> None:
    """sharding / offload against the backend (CSX traces data-parallel steps only), refused in the Trainer's
    words when it is constructed rather than at fit (the run resolves the same check again)."""
    parallel.resolve_layout(rc.sharding, rc.offload, rc.num_csx, backend.backend_type.name, _WORDS)


def _model_parts(model: Any, precision: dict) -> tuple[ModelParams, Optional[Callable]]:
    keys = {k: precision[k] for k in ("mixed_precision", "use_bfloat16", "fp16_type") if k in precision}
    if isinstance(model, dict):
        model = dict(model)
        name = model.pop("name", None)
        if not name:
            raise ParamsError("Trainer: model section needs 'name' (a registered model or 'module:function')")
        return ModelParams(name=name, extra=model, **keys), None
    if isinstance(model, torch.nn.Module):
        return ModelParams(name=type(model).__name__, **keys), lambda _params: model
    if callable(model):
        return ModelParams(name=getattr(model, "__name__", "model"), **keys), lambda _params: model()
    raise ParamsError(f"Trainer: model must be an nn.Module, a callable or a params section, got {type(model).__name__}")


def _is_scheduler(value: Any) -> bool:
    return callable(value) or hasattr(value, "step")


def _check_schedulers(schedulers: Any) -> None:
    """``schedulers`` is a scheduler, a callable or a list of them, or of ``{SchedulerName: {...}}`` mappings
    (the YAML form's, for an optimizer params section; checked there); checked before anything is built."""
    if isinstance(schedulers, (list, tuple)):
        for index, entry in enumerate(schedulers):
            if not _is_scheduler(entry) and not isinstance(entry, dict):
                raise ParamsError(f"Trainer: schedulers[{index}] must be a scheduler or a callable (optimizer) -> "
                                  f"scheduler, got {type(entry).__name__} {entry!r:.40}")
    elif schedulers is not None and not _is_scheduler(schedulers):
        raise ParamsError(f"Trainer: schedulers must be an LR scheduler, a callable (optimizer) -> scheduler or a list "
                          f"of them, got {type(schedulers).__name__} {schedulers!r:.40}")


def _built(entry: Any, optimizer: torch.optim.Optimizer) -> Any:
    """A scheduler object as it is, a callable's scheduler of ``optimizer`` (as the vendor's SchedulersCallback)."""
    return entry if hasattr(entry, "step") and not isinstance(entry, type) else entry(optimizer)


def _schedulers_fn(schedulers: Any) -> Optional[Callable]:
    """``(optimizer) -> the run's schedule``: one scheduler, or a list's as ParallelSchedulers (side by side)."""
    if isinstance(schedulers, (list, tuple)):
        if not schedulers:
            return None
        entries = list(schedulers)

        def side_by_side(optimizer):
            built = [_built(entry, optimizer) for entry in entries]
            try:
                return ParallelSchedulers(built, [f"schedulers[{i}]" for i in range(len(built))])
            except ValueError as err:
                raise ParamsError(f"Trainer: {err}") from err
        return side_by_side
    return schedulers if callable(schedulers) and not hasattr(schedulers, "state_dict") \
        else (lambda _opt: schedulers)


def _optimizer_parts(optimizer: Any, schedulers: Any, precision: dict, grad_accum: Optional[int]):
    numerics = {k: v for k, v in precision.items() if k in {f.name for f in fields(OptimizerParams)}}
    if grad_accum is not None:
        numerics["grad_accum_steps"] = grad_accum
    if optimizer is None:
        return None, None, None
    mappings = isinstance(schedulers, (list, tuple)) and any(isinstance(entry, dict) for entry in schedulers)
    if isinstance(optimizer, dict):
        section = dict(optimizer)
        if mappings and all(isinstance(entry, dict) for entry in schedulers) and "schedulers" not in section:
            section["schedulers"] = list(schedulers)  # the YAML form's trainer.init.schedulers: the section's
        elif schedulers is not None:  # a scheduler object needs the optimizer object, which the section builds later
            raise ParamsError("Trainer: schedulers with an optimizer params section: give them as "
                              "[{'CosineDecayLR': {...}}, ...] mappings (or in the section: 'learning_rate': "
                              "{'scheduler': ...} or 'schedulers'), or pass an optimizer object")
        known = {f.name for f in fields(OptimizerParams)} - {"extra"}
        base = {k: section.pop(k) for k in list(section) if k in known}
        if "optimizer_type" not in base:
            raise ParamsError("Trainer: optimizer section needs 'optimizer_type' (e.g. SGD, AdamW)")
        if "learning_rate" not in base and "schedulers" not in base:  # never a silent 0: nothing would learn
            raise ParamsError("Trainer: optimizer section needs 'learning_rate' (a number such as 0.01, or a "
                              "scheduler dict)")
        values = {**base, **numerics, **section}  # checked as a params file's section is (types, ranges)
        return build_section(OptimizerParams, "optimizer", values, lambda key: " (Trainer arguments)"), None, None
    if not (isinstance(optimizer, torch.optim.Optimizer) or callable(optimizer)):
        raise ParamsError(f"Trainer: optimizer must be a torch.optim.Optimizer, a callable (model) -> optimizer or "
                          f"an optimizer params section ({{'optimizer_type': 'SGD', 'learning_rate': 0.01}}), got "
                          f"{type(optimizer).__name__} {optimizer!r:.40}")
    if mappings:
        index = next(i for i, entry in enumerate(schedulers) if isinstance(entry, dict))
        raise ParamsError(f"Trainer: schedulers[{index}] is a params mapping {schedulers[index]!r:.40}, which an "
                          "optimizer params section builds; give a scheduler or a callable (optimizer) -> scheduler "
                          "with an optimizer object")
    section = OptimizerParams(optimizer_type=type(optimizer).__name__, **numerics)
    optimizer_fn = optimizer if callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer) \
        else (lambda _model: optimizer)
    return section, optimizer_fn, _schedulers_fn(schedulers) if schedulers is not None else None


def _sparsity_parts(sparsity: Any) -> tuple[Any, Optional[Callable]]:
    """(a params ``sparsity`` section, checked now; or a callable giving the run's algorithm)."""
    if sparsity is None:
        return None, None
    if isinstance(sparsity, SparsityAlgorithm):
        return None, lambda: sparsity
    if callable(sparsity):
        return None, sparsity
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float, dict, list)):
        raise ParamsError(f"Trainer: sparsity must be a cstorch.sparse.SparsityAlgorithm, a callable returning one, "
                          f"or a sparsity section (a level, a mapping or a list), got {type(sparsity).__name__} "
                          f"{sparsity!r:.40}")
    try:
        check_sparsity(sparsity, "sparsity")
    except ParamsError as e:  # the same checks as a params file's, named as the Trainer's argument
        raise ParamsError(str(e).replace("params: ", _HEAD, 1)) from None
    return sparsity, None


def _input_section(section: str, loader: Any) -> Optional[InputParams]:
    """A dict is an input params section for the model's data function, checked as a params file's is
    (types, ranges; its keys named as the Trainer's argument); a loader object needs none."""
    if loader is None:
        return None
    if not isinstance(loader, dict):
        return InputParams()
    return build_section(InputParams, section, loader, names=_NAMES, head=_HEAD)


def _check_loader(what: str, loader: Any, required: bool = False) -> None:
    """A loader argument is a torch DataLoader, a cstorch DataLoader (which builds one) or an input section
    dict for the model's data function; None only where it is optional."""
    if loader is None and not required:
        return
    if isinstance(loader, (dict, torch.utils.data.DataLoader, CsDataLoader)):  # CsDataLoader builds its loader later
        return
    raise ParamsError(f"{what}: expected a torch.utils.data.DataLoader, a cstorch.utils.data.DataLoader or an input "
                      f"section dict ({{'batch_size': 64, ...}} for the model's data function), got "
                      f"{type(loader).__name__}")


def _data_fn(loader: Any) -> Optional[Callable]:
    if loader is None or isinstance(loader, dict):
        return None
    torch_loader = getattr(loader, "loader", loader)  # a cstorch DataLoader builds its torch loader
    return lambda _params: torch_loader


def _reject_unknown(what: str, values: dict, valid: set) -> None:
    for key in values:
        if key not in valid:
            raise unknown_key_error(f"Trainer: {what}.{key}", key, sorted(valid))
