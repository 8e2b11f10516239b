"""The factories a runner builds its parts with, each in one place: model, data, optimizer, schedule."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from typing import Any, Callable, Optional

import torch

from cs_run import optim, sparse
from cs_run.amp import build_grad_scaler as build
from cs_run.amp import resolve_mixed_precision
from cs_run.errors import ParamsError
from cs_run.lora_params import check_lora_params
from cs_run.metrics.metric import Metric, MetricSet, discarded_registrations, register_metric
from cs_run.models.common.lora import apply_lora
from cs_run.optim.factory import PARAM_GROUP_KEYS
from cs_run.parallel import DATA_PARALLEL, Layout, Sharding
from cs_run.params import InputParams, ModelParams, OptimizerParams, Params
from cs_run.resolve import LEARNING_RATE, SCHEDULERS, data_function, model_function, params_error
from cs_run.runners._step import StepConfig
from cs_run.sparsity_params import check_sparsity
from cs_run.utils.streaming import StreamingLoader

__all__ = ["ModelBuild", "build_model", "build_dataloader", "build_optimizer", "build_lr_scheduler",
           "build_grad_scaler", "build_sparsity", "build_training_parts", "build_step_config",
           "resolve_autocast_dtype"]

logger = logging.getLogger("cs_run.runners")


def build_model(params: Params, model_fn: Optional[Callable[[dict], torch.nn.Module]] = None) -> torch.nn.Module:
    """From the registry / ``module:function`` name, or from ``model_fn(params_dict)`` (Model Zoo run())."""
    try:
        model = model_fn(params.to_dict()) if model_fn else model_function(params)(**params.model.extra)
    except ParamsError:
        raise  # already names its key (a model that checks its nested sections, as dpo's policy_model)
    except (TypeError, ValueError) as e:
        raise ParamsError(f"params: model: {e}") from None
    if not isinstance(model, torch.nn.Module):
        raise ParamsError(f"params: model.name: {params.model.name!r} returned {type(model).__name__}, "
                          "expected a torch.nn.Module whose forward(batch) returns the loss")
    if params.model.lora_params is not None:  # the vendor's Lora callback wraps the model function the same way
        apply_lora(model, check_lora_params(params.model.lora_params))
    return model


class ModelBuild:
    """The run's model build for :meth:`~cs_run.parallel.strategy.Strategy.build`: whole (real storage) or on
    the meta device (shapes only, no storage; a sharded replica that gets its values from ordinal 0). Each
    returns the model and the metrics its build made (registered as the run's, in registration order)."""

    def __init__(self, params: Params, model_fn: Optional[Callable] = None) -> None:
        self.params, self.model_fn = params, model_fn

    def whole(self) -> tuple[torch.nn.Module, list[Metric]]:
        made = MetricSet()
        with made.collecting():
            model = build_model(self.params, self.model_fn)
        return model, list(made.metrics().values())

    def on_meta(self) -> tuple[Optional[torch.nn.Module], list[Metric], Optional[str]]:
        """``(model, metrics, None)``, or ``(None, [], why not)`` when the model's code cannot run without
        values (``.item()``, data-dependent shapes), makes tensors off the meta device or keeps a tensor
        outside its parameters and buffers. A model built before (the Trainer's module) comes back as it is.
        A failed build leaves no metric registered."""
        made = MetricSet()
        try:
            with discarded_registrations(), made.collecting(), torch.device("meta"):
                model = build_model(self.params, self.model_fn)
        except Exception as exc:  # noqa: BLE001  (the whole build reports its own errors)
            return None, [], f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
        metrics = list(made.metrics().values())
        why = _not_meta(model, metrics)
        if why is None:
            for metric in metrics:
                register_metric(metric)  # the run's metrics, as a whole build's
        return (None, [], why) if why else (model, metrics, None)


def _not_meta(model: torch.nn.Module, metrics: list[Metric]) -> Optional[str]:
    """Why ``model`` (built on meta) cannot take its values from ordinal 0's, or None."""
    tensors = {id(t): (n, t) for n, t in [*model.named_parameters(), *model.named_buffers()]}.values()
    real = [n for n, t in tensors if not t.is_meta]
    if real and len(real) < len(tensors):
        return f"'{real[0]}' was made off the meta device"
    skip = {id(m) for m in metrics}  # their tensors come from ordinal 0 whole
    for name, module in model.named_modules():
        if id(module) in skip:
            continue
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and value.is_meta:
                return f"module '{name or type(model).__name__}' keeps tensor '{attr}' outside its parameters and buffers"
    return None


def build_dataloader(params: Params, split: str,
                     data_fn: Optional[Callable[[dict], Any]] = None) -> torch.utils.data.DataLoader | StreamingLoader:
    """The split's DataLoader: its data function called with the section's keys it accepts, or
    ``data_fn(params_dict)`` (Model Zoo run()). With ``runconfig.num_workers_per_csx > 1`` a
    :class:`~cs_run.utils.streaming.StreamingLoader`: each input worker process calls the data function."""
    name = "train_input" if split == "train" else "eval_input"
    section: Optional[InputParams] = getattr(params, name)
    if section is None:
        raise ParamsError(f"params: missing section {name} (needed to {split})")
    build = functools.partial(_call_data_function, params, split, name, section, data_fn)
    rc = params.runconfig
    if rc.num_workers_per_csx == 1:
        return build()
    # a stuck data function fails the run like a silent replica does, instead of hanging it
    return StreamingLoader(build, rc.num_workers_per_csx, timeout=rc.collective_timeout)


def _call_data_function(params: Params, split: str, name: str, section: InputParams,
                        data_fn: Optional[Callable[[dict], Any]]) -> torch.utils.data.DataLoader:
    if data_fn is not None:
        return _checked_loader(data_fn(params.to_dict()), name)
    fn = data_function(params, name)
    accepted = inspect.signature(fn).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    kwargs = {k: v for k, v in dataclasses.asdict(section).items()
              if k not in ("extra", "data_fn") and (takes_any or k in accepted)}
    if section.shuffle_seed is None:
        kwargs.pop("shuffle_seed", None)
    kwargs.update(section.extra)
    try:
        loader = fn(split=split, **kwargs)
    except ParamsError:
        raise  # already names its key
    except (TypeError, ValueError) as e:
        raise ParamsError(f"params: {name}: {e}") from None
    return _checked_loader(loader, name)


def _checked_loader(loader: Any, name: str) -> torch.utils.data.DataLoader:
    if not isinstance(loader, torch.utils.data.DataLoader):
        raise ParamsError(f"params: {name}: the data function returned {type(loader).__name__}, expected a "
                          "torch.utils.data.DataLoader")
    return loader


def build_optimizer(opt: OptimizerParams, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimizer block's class and keyword arguments (runner-only keys removed) over the model's
    parameters, in the Model Zoo's param groups (:func:`cs_run.optim.configure_param_groups`), as the vendor's
    trainer groups every model (Release 2.3+ ``common/optim_utils.py``): biases and normalization layers
    without weight decay, ``params`` tags, ``adjust_learning_rate`` and the model's own muP learning-rate
    groups. Frozen parameters (LoRA's base weights) are left out, as the vendor's trainer leaves them out:
    no optimizer state for weights that never step."""

    kwargs = dict(opt.extra)
    grouping = {key: kwargs.pop(key) for key in PARAM_GROUP_KEYS if key in kwargs}
    try:
        params = optim.configure_param_groups(model, {**grouping, **kwargs})
        return optim.configure_optimizer(opt.optimizer_type, params, **kwargs)
    except (TypeError, ValueError) as e:
        raise params_error(e) from None


def build_sparsity(params: Params, model: torch.nn.Module,
                   sparsity_fn: Optional[Callable] = None, layout: Layout = DATA_PARALLEL
                   ) -> Optional[sparse.SparsityAlgorithm]:
    """The ``sparsity`` section's algorithm (or ``sparsity_fn()``'s, the Trainer's ``sparsity=``) applied to
    the model (masks made, pruned weights zeroed), or None.

    Applied to the unwrapped model, before a strategy shards it: the filters match the model's own names."""
    if params.sparsity is None and sparsity_fn is None:
        return None
    given = "Trainer: sparsity" if sparsity_fn is not None else "params: sparsity"
    if layout.sharding is not Sharding.NONE:
        raise ParamsError(f"{given}: sparse weights with runconfig.sharding={layout.sharding} are "
                          f"not supported (the masks are whole tensors); use sharding none{params.where('sparsity')}")
    if sparsity_fn is not None:
        return _apply_given_sparsity(sparsity_fn(), model)
    sparsity = sparse.configure(params.sparsity, locate=params.where)
    if sparsity is None:
        return None
    try:
        model.apply(sparsity)
    except ValueError as e:  # a weight the section's algorithm cannot mask (its shape), named in the message
        raise ParamsError(f"params: sparsity: {e}{params.where('sparsity')}") from None
    if not sparsity.num_sparse_params:
        raise ParamsError(f"params: sparsity: the parameter filters match no parameter of the model (names such as "
                          f"{next(iter(dict(model.named_parameters())), '?')}){params.where('sparsity')}")
    for index, (key, _) in enumerate(check_sparsity(params.sparsity)):  # the entries, in the group's order
        if not sparsity[index].num_sparse_params:  # the vendor's run fails at its first optimizer step
            raise ParamsError(f"params: {key}: no weight is left for this entry: its param_filter matches none that "
                              f"an earlier entry did not take (a weight goes to the first entry whose filter "
                              f"matches it){params.where(key)}")
    logger.info("Sparsity: %d weights masked (%s)", sparsity.num_sparse_params,
                ", ".join(f"{type(sparsity[i]).__name__} {sparsity[i].num_sparse_params}" for i in range(len(sparsity))))
    return sparsity


def _apply_given_sparsity(sparsity: Any, model: torch.nn.Module) -> Optional[sparse.SparsityAlgorithm]:
    """The Trainer's algorithm object (or its callable's) applied to this run's model."""
    if sparsity is None:  # the vendor's callable may decide on no sparsity
        return None
    if not isinstance(sparsity, sparse.SparsityAlgorithm):
        raise ParamsError(f"Trainer: sparsity: expected a cstorch.sparse.SparsityAlgorithm (or a callable returning "
                          f"one), got {type(sparsity).__name__}")
    modules = {id(m) for m in model.modules()}
    if any(id(s.module) not in modules for s in sparsity.sparse_params.values()):
        raise ParamsError("Trainer: sparsity: this algorithm already sparsified another model (an earlier fit or "
                          "validate of a Trainer that builds its model per run); pass a callable that returns a new "
                          "algorithm, or a sparsity section")
    try:
        model.apply(sparsity)
    except ValueError as e:
        raise ParamsError(f"Trainer: sparsity: {e}") from None
    if not sparsity.num_sparse_params:
        raise ParamsError(f"Trainer: sparsity: the algorithm sparsified no parameter of the model (names such as "
                          f"{next(iter(dict(model.named_parameters())), '?')})")
    logger.info("Sparsity: %d weights masked (%s)", sparsity.num_sparse_params, type(sparsity).__name__)
    return sparsity


def build_lr_scheduler(opt: OptimizerParams, optimizer: torch.optim.Optimizer):
    """The block's ``learning_rate`` schedule (ScalePerParamLR-wrapped for muP groups, as the Model Zoo), or
    its ``schedulers`` side by side (the trainer form's list, one object that steps them all)."""
    if opt.schedulers is not None:
        return optim.configure_schedulers(optimizer, opt.schedulers, where=SCHEDULERS)
    return optim.configure_lr_scheduler(optimizer, opt.learning_rate, where=LEARNING_RATE)


def build_grad_scaler(opt: OptimizerParams):
    """A GradScaler when the block asks for loss scaling (dynamic, or a static factor other than 1)."""

    return build({k: v for k, v in dataclasses.asdict(opt).items() if v is not None})


def build_training_parts(params: Params, model: torch.nn.Module, optimizer_fn: Optional[Callable] = None,
                         lr_scheduler_fn: Optional[Callable] = None) -> tuple[Any, Any, Any]:
    """``(optimizer, lr_scheduler, grad_scaler)`` over ``model``'s parameters (all None without an optimizer
    block): the caller's ``optimizer_fn`` and ``lr_scheduler_fn`` (Trainer, run()) when given, else the params'."""
    if params.optimizer is None:
        return None, None, None
    if optimizer_fn is not None:  # built by the caller (Trainer); its schedule too, if any
        optimizer = optimizer_fn(model)
        lr_scheduler = lr_scheduler_fn(optimizer) if lr_scheduler_fn else None
    else:
        optimizer = build_optimizer(params.optimizer, model)
        lr_scheduler = build_lr_scheduler(params.optimizer, optimizer)
    return optimizer, lr_scheduler, build_grad_scaler(params.optimizer)


def build_step_config(params: Params, torch_device: torch.device, device_type: str) -> StepConfig:
    """What a train step needs of the params: clipping and the autocast dtype on this device."""
    opt = params.optimizer
    config = StepConfig(
        max_gradient_norm=opt.max_gradient_norm if opt else None,
        max_gradient_value=opt.max_gradient_value if opt else None,
        autocast_dtype=resolve_autocast_dtype(params.model, torch_device.type, device_type),
        device_type=torch_device.type,
    )
    if config.autocast_dtype is not None:
        logger.info("Mixed precision: %s autocast on %s", config.autocast_dtype, torch_device.type)
    return config


def resolve_autocast_dtype(model: ModelParams, device_type: str, backend_type: str = "GPU") -> Optional[torch.dtype]:
    """The vendor's rule per device: ``mixed_precision`` autocasts on GPU and CSX. On the CPU device it
    autocasts only with an explicit bfloat16 (``use_bfloat16`` / ``fp16_type: bfloat16``, the vendor's
    2.x CPU autocast); with the default float16 half type the CPU runs float32, as the vendor's CPU
    runner does ("autocast has no effect"), logged once."""
    explicit_bf16 = model.use_bfloat16 or model.fp16_type in ("bfloat16", "cbfloat16")
    if backend_type.upper() == "CPU" and model.mixed_precision and not explicit_bf16:
        logger.info("model.mixed_precision with the float16 half type: no effect on the CPU device (the vendor's "
                    "CPU runner runs float32); set model.use_bfloat16 for bfloat16 autocast on the CPU")
        return None
    return resolve_mixed_precision(dataclasses.asdict(model), device_type)
