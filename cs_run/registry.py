"""Where models and data come from: a registry of names, or ``module:attr`` strings.

A model function takes the ``model`` section's own keys as keyword arguments and returns a
``torch.nn.Module`` whose ``forward(batch)`` returns the loss. A data function takes the input
section's keys plus ``split`` ("train" or "eval") and returns a ``torch.utils.data.DataLoader``.
Their signatures are the schema of those keys: unknown keys and wrong types are reported by key path.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable, Optional

from cs_run import params
from cs_run._checks import check_value, unknown_key_error
from cs_run.errors import ParamsError

__all__ = ["ModelSpec", "register_model", "get_model_spec", "resolve_object", "registered_models"]


@dataclass(frozen=True)
class ModelSpec:
    """A registered model: how to build it and where its data comes from by default."""

    name: str
    model_fn: str
    """``module:function`` returning the nn.Module (imported only when used)."""
    data_fn: Optional[str] = None
    """``module:function`` returning a split's DataLoader."""


_MODELS: dict[str, ModelSpec] = {}


def register_model(name: str, model_fn: str, data_fn: Optional[str] = None) -> None:
    """Make ``model.name: <name>`` resolve to ``model_fn`` (and ``data_fn`` for its inputs)."""
    _MODELS[name] = ModelSpec(name, model_fn, data_fn)


def registered_models() -> list[str]:
    return sorted(_MODELS)


def get_model_spec(name: str) -> ModelSpec:
    """A registered name, or a ``module:function`` string taken as the model function itself."""
    if name in _MODELS:
        return _MODELS[name]
    if ":" in name:
        return ModelSpec(name, name, None)
    known = ", ".join(registered_models())
    raise ParamsError(f"params: model.name: unknown model {name!r}; registered models: {known} "
                      "(or give a 'module:function' that returns a torch.nn.Module)")


def resolve_object(spec: str, *, key: str = "") -> Any:
    """Import ``module:attr`` (attr may be dotted). Errors name the params key that held it."""
    where = f"{key}: " if key else ""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ParamsError(f"params: {where}expected 'module:attribute', got {spec!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ParamsError(f"params: {where}cannot import module {module_name!r} ({e}); is it on "
                          "PYTHONPATH (or --python_paths)?") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ParamsError(f"params: {where}module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def check_function_keys(fn: Callable, values: dict, section: str, reserved: set[str], locate) -> None:
    """Validate a section's extra keys against ``fn``'s signature: names, required ones, types."""

    sig = inspect.signature(fn)
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    named = {n: p for n, p in sig.parameters.items()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in reserved}
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations: skip type checks, keep name checks
        hints = {}
    for key, value in values.items():
        key_path = f"{section}.{key}"
        if key not in named:
            if accepts_any:
                continue
            raise unknown_key_error(key_path, key, list(named) + list(_section_keys(section)), locate(key_path))
        if key in hints and value is not None:
            check_value(key_path, value, hints[key], where=locate(key_path))
    for name, p in named.items():
        if p.default is p.empty and name not in values:
            raise ParamsError(f"params: missing required key {section}.{name} "
                              f"(needed by {fn.__module__}.{fn.__qualname__}){locate(section)}")


def _section_keys(section: str) -> list[str]:
    cls = {"model": params.ModelParams, "train_input": params.InputParams,
           "eval_input": params.InputParams}.get(section)
    return [f.name for f in dataclasses.fields(cls) if f.name != "extra"] if cls else []


# Built-in models. Imported lazily so `import cs_run` stays cheap.
register_model("fc_mnist", "cs_run.examples.fc_mnist.model:build_model",
               "cs_run.examples.fc_mnist.data:build_dataloader")
