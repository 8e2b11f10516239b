"""The resolve step: validated params meet the user's code.

:func:`cs_run.params.load_params` only reads and validates; this second step, run the same way by
every entry point (``cs-run``, the Model Zoo ``run()``, the Trainer: all through
``PyTorchBaseRunner.create``), puts ``runconfig.python_paths`` on ``sys.path``, imports the model and
data functions, checks the sections' own keys against their signatures and the optimizer section
against its classes, all before any of the user's functions is called. Errors name file:line.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable, Optional

import torch

from cs_run import optim
from cs_run.errors import ParamsError
from cs_run.params import InputParams, OptimizerParams, Params
from cs_run.registry import check_function_keys, get_model_spec, resolve_object

__all__ = ["resolve_params", "apply_python_paths", "model_function", "data_function", "check_optimizer_section"]


def apply_python_paths(params: Params) -> None:
    """Put runconfig.python_paths on sys.path (first), so model and data functions import from there."""
    for folder in reversed(params.runconfig.python_paths):
        if folder not in sys.path:
            sys.path.insert(0, folder)


def model_function(params: Params) -> Callable[..., Any]:
    """The function ``model.name`` names (a registered model or ``module:function``)."""
    return resolve_object(get_model_spec(params.model.name).model_fn, key="model.name")


def data_function(params: Params, name: str) -> Callable[..., Any]:
    """The data function of input section ``name``: its ``data_fn``, else the registered model's data."""
    section: InputParams = getattr(params, name)
    if section.data_fn:
        return resolve_object(section.data_fn, key=f"{name}.data_fn")
    spec = get_model_spec(params.model.name)
    if spec.data_fn is None:
        raise ParamsError(f"params: {name}.data_fn: model {params.model.name!r} has no default data; set "
                          f"{name}.data_fn to a 'module:function' returning a torch DataLoader")
    return resolve_object(spec.data_fn, key=f"{name}.data_fn")


def check_optimizer_section(section: OptimizerParams) -> None:
    """Build the optimizer and its schedule on a one-element stand-in parameter, so every key and value
    their classes judge (unknown kwargs, ranges, scheduler keys) fails before the model is built."""

    probe = torch.nn.Parameter(torch.zeros(1))
    try:
        optimizer = optim.configure_optimizer(section.optimizer_type, [probe], **section.extra)
        optim.configure_lr_scheduler(optimizer, section.learning_rate)
    except (TypeError, ValueError) as e:
        if isinstance(e, ParamsError):
            raise
        raise ParamsError(f"params: optimizer: {e}") from None


def resolve_params(params: Params, *, model_fn: Optional[Callable] = None,
                   data_fns: Optional[dict[str, Optional[Callable]]] = None,
                   optimizer_fn: Optional[Callable] = None) -> None:
    """python_paths, the model and data functions' keys against their signatures, the optimizer section.

    A function the caller passes itself (``model_fn``, ``data_fns["train"|"eval"]``, as the Model Zoo's
    ``run()`` does) takes the whole params dict, so its section's keys are not checked against it; with
    an ``optimizer_fn`` (the Trainer's optimizer object) the optimizer section only records it.

    Raises:
        ParamsError: an import failed, or a key is unknown, missing or of the wrong type (file:line).
    """
    apply_python_paths(params)
    data_fns = data_fns or {}
    try:
        if model_fn is None:
            check_function_keys(model_function(params), params.model.extra, "model", set(), params.where,
                                _own_keys(params.model))
        for split, name in (("train", "train_input"), ("eval", "eval_input")):
            section = getattr(params, name)
            if section is not None and data_fns.get(split) is None:
                reserved = {"split"} | {f.name for f in dataclasses.fields(section)} - {"extra", "data_fn"}
                check_function_keys(data_function(params, name), section.extra, name, reserved, params.where,
                                    _own_keys(section))
        if params.optimizer is not None and optimizer_fn is None:
            check_optimizer_section(params.optimizer)
    except ParamsError as e:
        raise params.locate_error(e) from None


def _own_keys(section: Any) -> list[str]:
    """A params section's own keys (what its dataclass declares), for unknown-key messages."""
    return [f.name for f in dataclasses.fields(section) if f.name != "extra"]
