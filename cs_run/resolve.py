"""The resolve step: validated params meet the user's code.

:func:`cs_run.params.load_params` only reads and validates; this second step, run the same way by
every entry point (``cs-run``, the Model Zoo ``run()``, the Trainer: all through
``PyTorchBaseRunner.create``), puts ``runconfig.python_paths`` and the params file's folder on
``sys.path``, imports the model and data functions, checks the data functions' contract, the model keys
against the family's config class (a ``module:function`` model's against its signature), the input
sections' own keys against the signatures and the optimizer section against its classes, all before
any of the user's functions is called. Errors name file:line.

The data function contract: it is called as ``fn(split=..., **keys)`` with ``split`` ("train" or
"eval") and, by name, the keys of the ``<split>_input`` section its signature names (the section's
own keys such as ``batch_size``, ``shuffle``, ``data_dir``, and any other key written there), or all
of them when it takes ``**kwargs``; it returns a ``torch.utils.data.DataLoader``.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from cs_run import optim
from cs_run.errors import ParamsError
from cs_run.optim.factory import PARAM_GROUP_KEYS
from cs_run.params import InputParams, OptimizerParams, Params
from cs_run.registry import check_function_keys, check_model_keys, data_processor_function, get_model_spec, resolve_object

__all__ = ["resolve_params", "apply_python_paths", "model_function", "data_function", "check_data_function",
           "check_optimizer_section"]


def apply_python_paths(params: Params) -> None:
    """Put runconfig.python_paths, then the params file's folder, first on sys.path, so model and data
    functions import from there (``model.name: model:build`` finds the ``model.py`` beside the file,
    as ``python run.py`` finds the modules beside the script)."""
    folders = list(params.runconfig.python_paths)
    if params.source:
        folders.append(str(Path(params.source).resolve().parent))
    for folder in reversed(folders):
        if folder in sys.path:
            sys.path.remove(folder)
        sys.path.insert(0, folder)


def model_function(params: Params) -> Callable[..., Any]:
    """The function ``model.name`` names (a registered model or ``module:function``)."""
    return resolve_object(get_model_spec(params.model.name).model_fn, key="model.name")


def data_function(params: Params, name: str) -> Callable[..., Any]:
    """The data function of input section ``name``: its ``data_fn``, else the registered model's data (the
    data processor the section names, or the model's default)."""
    section: InputParams = getattr(params, name)
    if section.data_fn:
        return resolve_object(section.data_fn, key=f"{name}.data_fn")
    spec = get_model_spec(params.model.name)
    key = f"{name}.data_fn"
    if spec.data_processors:  # the processor the input names (checked against these at load), else the first
        processor = section.extra.get("data_processor") or spec.data_processors[0]
        return data_processor_function(processor, f"params: {name}.data_processor")
    if spec.data_fn is None:
        raise ParamsError(f"params: {key}: model {params.model.name!r} has no default data; set "
                          f"{key} to a 'module:function' returning a torch DataLoader")
    if ":" not in spec.data_fn:
        return data_processor_function(spec.data_fn, f"params: {key}")
    return resolve_object(spec.data_fn, key=key)


def check_data_function(fn: Any, name: str, section: InputParams, locate: Callable[[str], str] = lambda key: "") -> None:
    """The data function of input section ``name`` can be called the way it will be: ``fn(split=...,
    **keys)`` (see the module docstring), else a ParamsError showing the signature it needs.

    Runs before any work: a wrong signature is a params error, not a TypeError after the model was built.
    """
    where = f"params: {name}.data_fn"
    if not callable(fn):
        raise ParamsError(f"{where}: {type(fn).__name__} is not callable; expected a function "
                          f"def build(split, batch_size) returning a torch.utils.data.DataLoader{locate(f'{name}.data_fn')}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return
    try:  # annotations as the user wrote them (not strings under `from __future__ import annotations`)
        sig = inspect.signature(fn, eval_str=True)
    except Exception:  # noqa: BLE001 - an annotation that does not evaluate: keep the strings
        pass
    by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = list(sig.parameters.values())
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
    own = {f.name for f in dataclasses.fields(section)} - {"extra", "data_fn"}  # other keys: check_function_keys
    given = {"split"} | own | set(section.extra)
    if section.shuffle_seed is None:
        given.discard("shuffle_seed")
    problems = []
    if "split" not in sig.parameters and not takes_any:
        problems.append("it does not take split")
    for p in parameters:
        if p.kind is p.POSITIONAL_ONLY and (p.default is p.empty or p.name == "split"):
            problems.append(f"{p.name} is positional-only (every argument is passed by name)")
        elif p.kind in by_name and p.default is p.empty and p.name in own and p.name not in given:
            problems.append(f"{p.name} has no default and is not a key of {name}")
    if not problems:
        return
    keep = [p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in parameters
            if p.kind in (*by_name, p.POSITIONAL_ONLY) and p.name != "split"
            and (p.name in given or p.default is not p.empty)]
    keep.sort(key=lambda p: p.default is not p.empty)  # required ones first
    expected = inspect.Signature([inspect.Parameter("split", inspect.Parameter.POSITIONAL_OR_KEYWORD), *keep,
                                  *[p for p in parameters if p.kind is p.VAR_KEYWORD]])
    label = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}{sig}"
    raise ParamsError(f"{where}: {label} cannot be called as a data function ({'; '.join(problems)}): it is called "
                      f"with split (\"train\" or \"eval\") and the keys of {name} it names, all by name, and returns a "
                      f"torch.utils.data.DataLoader; expected def {getattr(fn, '__name__', 'build')}{expected}"
                      f"{locate(f'{name}.data_fn')}")


LEARNING_RATE = "params: optimizer.learning_rate"
"""How messages about the schedule name ``optimizer.learning_rate`` (its key paths follow it)."""
SCHEDULERS = "params: optimizer.schedulers"
"""How messages about the side-by-side schedules name ``optimizer.schedulers`` (the trainer's list)."""


def params_error(e: Exception) -> ParamsError:
    """``e`` (the optimizer factory's, a class's ValueError) as a params error: ``params: `` and its key."""
    message = str(e)
    if message.startswith("params: "):
        return e if isinstance(e, ParamsError) else ParamsError(message)
    return ParamsError(f"params: {message}" if message.startswith("optimizer") else f"params: optimizer: {message}")


def check_optimizer_section(section: OptimizerParams) -> None:
    """Build the optimizer and its schedule on a one-element stand-in parameter, so every key and value
    their classes judge (unknown kwargs, ranges, scheduler keys) fails before the model is built. The
    param-group keys are checked for their form here and against the model when it is built."""

    probe = torch.nn.Parameter(torch.zeros(1))
    kwargs = dict(section.extra)
    grouping = {key: kwargs.pop(key) for key in PARAM_GROUP_KEYS if key in kwargs}
    scales = grouping.get("adjust_learning_rate")
    try:
        if scales is not None and (not isinstance(scales, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in scales.values())):
            raise ParamsError("params: optimizer.adjust_learning_rate: expected a mapping of LR adjustment group "
                              f"names to factors (e.g. decoder_kernel: 0.25), got {scales!r}")
        mup = {"adjust_learning_rate": 1.0} if scales else {}
        groups = [{"params": [probe], **mup}] + [  # one more per tag of the params entries: what tags may name
            {"params": [torch.nn.Parameter(torch.zeros(1))], "tags": {tag}, **mup} for tag in _tags(grouping)]
        optimizer = optim.configure_optimizer(section.optimizer_type, groups, **kwargs)
        if section.schedulers is not None:
            optim.configure_schedulers(optimizer, section.schedulers, where=SCHEDULERS)
        else:
            optim.configure_lr_scheduler(optimizer, section.learning_rate, where=LEARNING_RATE)
    except (TypeError, ValueError) as e:
        raise params_error(e) from None


def _tags(grouping: dict) -> list:
    """The tags of the optimizer's ``params`` entries (their form is checked against the model later)."""
    entries = grouping.get("params")
    entries = [entries] if isinstance(entries, dict) else entries if isinstance(entries, list) else []
    tags = [entry["tag"] for entry in entries if isinstance(entry, dict) and isinstance(entry.get("tag"), str)]
    return list(dict.fromkeys(tags))


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
            check_model_keys(get_model_spec(params.model.name), params.model.extra, params.where,
                             _own_keys(params.model))
        for split, name in (("train", "train_input"), ("eval", "eval_input")):
            section = getattr(params, name)
            if section is not None and data_fns.get(split) is None:
                reserved = {"split"} | {f.name for f in dataclasses.fields(section)} - {"extra", "data_fn"}
                fn = data_function(params, name)
                check_data_function(fn, name, section, params.where)
                check_function_keys(fn, section.extra, name, reserved, params.where, _own_keys(section))
        if params.optimizer is not None and optimizer_fn is None:
            check_optimizer_section(params.optimizer)
    except ParamsError as e:
        raise params.locate_error(e) from e.__cause__  # the user code error behind it, for CS_RUN_DEBUG


def _own_keys(section: Any) -> list[str]:
    """A params section's own keys (what its dataclass declares), for unknown-key messages."""
    return [f.name for f in dataclasses.fields(section) if f.name != "extra"]
