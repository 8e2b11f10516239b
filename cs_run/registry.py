"""Where models and data come from: a registry of names, or ``module:attr`` strings.

Models register by name (``model.name``), data functions by the Model Zoo data processor class names
they serve (``data_processor``, :func:`register_data_processor`, next to each function in ``cs_run.data``).

A model function takes the ``model`` section's own keys as keyword arguments and returns a
``torch.nn.Module`` whose ``forward(batch)`` returns the loss. A data function takes the input
section's keys plus ``split`` ("train" or "eval") and returns a ``torch.utils.data.DataLoader``.
A registered family declares its ``model`` keys once, as a config dataclass (:attr:`ModelSpec.config_class`),
which is their schema; a function's signature is the schema of the keys of a model or data function
named by ``module:function``. Unknown keys and wrong types are reported by key path.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import traceback
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from cs_run._checks import check_value, unknown_key_error
from cs_run._frames import is_user_file, own_roots
from cs_run.errors import CsRunError, ParamsError

__all__ = ["ModelSpec", "register_model", "apply_model_defaults", "get_model_spec", "hf_converter", "resolve_object",
           "registered_models", "check_model_keys", "check_config_keys", "check_function_keys",
           "register_data_processor", "data_processor_function", "registered_data_processors"]


@dataclass(frozen=True)
class ModelSpec:
    """A registered model family (after torchtitan's ModelSpec): its typed config, its builder, its Hugging Face
    adapter, the data it reads and, later, its tensor-parallel plan. Every part is a ``module:attr`` string,
    imported only when used, so the registry (a shared-rules module) imports no model code."""

    name: str
    model_fn: str
    """``module:function`` taking the ``model`` keys as keywords and returning the nn.Module: a family's is its
    builder applied to ``config_class(**keys)``; a ``module:function`` model name is its own."""
    data_fn: Optional[str] = None
    """A registered data processor's name, or a ``module:function``, returning a split's DataLoader (a model
    with ``data_processors`` reads the one its input names)."""
    data_processors: tuple = ()
    """Model Zoo ``data_processor`` names of its inputs (registered data processors, the first the default):
    an input reads the one it names, and a params file without model.name that names one of them is this
    model's (a Model Zoo run.py is per model, so its files name no model)."""
    defaults_fn: Optional[str] = None
    """``module:function`` filling the model's Model Zoo defaults into the raw ``model`` dict."""
    hf_converter: Optional[str] = None
    """Module converting this model's checkpoints to and from a Hugging Face folder (``checkpoint convert
    --to hf / --from hf``): ``to_hf(checkpoint, out_dir, model_keys) -> out_dir`` and ``from_hf(hf_dir,
    dst) -> (checkpoint, params)``. A folder's ``config.json`` ``model_type`` names the model to read it."""
    input_keys: tuple = ()
    """``model`` keys its ``data_fn`` also takes, copied into each input section that reads through it (as the
    Model Zoo's ``set_defaults`` passes model.vocab_size to the data loader): gpt2's data checks token ids."""
    hf_model_types: tuple = ()
    """Hugging Face ``config.json`` ``model_type`` values (beside ``name``) that ``hf_converter`` reads."""
    config_class: Optional[str] = None
    """``module:Class``, the family's ``model`` keys declared once as a dataclass (types, defaults, the release
    that introduced each, their meaning): the params check, the builder and docs/models.md read it. None: the
    keys of ``model_fn``'s signature."""
    builder: Optional[str] = None
    """``module:function`` building the nn.Module from one ``config_class`` object (no keywords)."""
    parallelize: Optional[str] = None
    """Where a family's tensor-parallel plan goes: a ``module:function`` that applies it to a built model and
    returns the model, as torchtitan's ``parallelize_fn`` (model, parallel dims, job config). None for every
    family today: the run's ``Strategy`` (data parallel, FSDP2) needs no per-family plan."""
    keys_from_input: tuple = ()
    """``(model key, train_input key)`` pairs: a model key the file leaves out takes the input's value, as the
    Model Zoo's own set_defaults copied it (t5's src/tgt_max_position_embeddings, R_1.6-2.2 t5/utils.py)."""
    refused_processors: tuple = ()
    """``(data_processor, why)`` pairs: a Model Zoo processor of the family that is not built here, refused with
    what is missing and why rather than as an unknown name."""


logger = logging.getLogger(__name__)

_MODELS: dict[str, ModelSpec] = {}
MODEL_PACKAGES = ("cs_run.models",)
"""Packages whose import registers models (cs-run's own model home); imported on the first lookup."""

_DATA: dict[str, Callable[..., Any]] = {}
DATA_PACKAGES = ("cs_run.data.processors",)
"""Packages whose import registers data processors (cs-run's data home); imported on the first lookup."""
_imported_homes: set[str] = set()


def _import_homes(packages: tuple[str, ...]) -> None:
    """Import each of ``packages`` once (MODEL_PACKAGES, DATA_PACKAGES), so that their families or processors
    register themselves; the core names none. Marked before the import, so a lookup while it runs does not
    import it again."""
    for package in packages:
        if package not in _imported_homes:
            _imported_homes.add(package)
            importlib.import_module(package)


def register_model(name: str, model_fn: str, data_fn: Optional[str] = None, data_processors: tuple = (),
                   defaults_fn: Optional[str] = None, hf_converter: Optional[str] = None,
                   input_keys: tuple = (), hf_model_types: tuple = (), config_class: Optional[str] = None,
                   builder: Optional[str] = None, parallelize: Optional[str] = None,
                   keys_from_input: tuple = (), refused_processors: tuple = ()) -> None:
    """Make ``model.name: <name>`` resolve to ``model_fn`` (and ``data_fn`` for its inputs); see :class:`ModelSpec`."""
    _MODELS[name] = ModelSpec(name, model_fn, data_fn, tuple(data_processors), defaults_fn, hf_converter,
                              tuple(input_keys), tuple(hf_model_types), config_class, builder, parallelize,
                              keys_from_input=tuple(keys_from_input), refused_processors=tuple(refused_processors))


def register_data_processor(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the data function is the one of the Model Zoo data processor classes ``names`` (an input's
    ``data_processor``). The function is returned unchanged: its signature is its section's schema."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            if _DATA.get(name, fn) is not fn:
                raise ValueError(f"data processor {name!r} is registered twice: {_DATA[name].__module__} and "
                                 f"{fn.__module__}")
            _DATA[name] = fn
        return fn

    return register


def registered_data_processors() -> list[str]:
    _import_homes(DATA_PACKAGES)
    return sorted(_DATA)


def data_processor_function(name: str, where: str) -> Callable[..., Any]:
    """The data function registered for data processor ``name``.

    Raises:
        ParamsError: none is; ``where`` says where the name came from.
    """
    _import_homes(DATA_PACKAGES)
    if name not in _DATA:
        raise ParamsError(f"{where}: no data processor {name!r} is registered; registered: "
                          f"{', '.join(sorted(_DATA)) or 'none'}")
    return _DATA[name]


def hf_converter(name: Optional[str], where: str) -> Any:
    """The Hugging Face converter module of model ``name`` (see :attr:`ModelSpec.hf_converter`).

    Raises:
        ParamsError: the model is unknown or has no converter; ``where`` says where the name came from.
    """
    _import_homes(MODEL_PACKAGES)
    spec = _MODELS.get(name) if isinstance(name, str) else None
    if spec is None or not spec.hf_converter:  # an HF model_type another model reads (gpt_neox -> gpt-neox)
        spec = next((s for s in _MODELS.values() if s.hf_converter and name in s.hf_model_types), spec)
    if spec is None or not spec.hf_converter:
        have = ", ".join(n + (f" (model_type {', '.join(s.hf_model_types)})" if s.hf_model_types else "")
                         for n, s in sorted(_MODELS.items()) if s.hf_converter) or "none"
        raise ParamsError(f"{where}: {name!r} has no Hugging Face converter (models with one: {have})")
    return importlib.import_module(spec.hf_converter)


def apply_model_defaults(raw: dict, locate=lambda key: "") -> dict:
    """Before validation: name the model of a Model Zoo file by its data_processor when model.name is
    absent, check that an input's data_processor is one the model's data reads, pass it the model keys
    its data takes (``input_keys``), take the model keys left out from train_input (``keys_from_input``), then
    fill that registered model's own defaults (its ``defaults_fn``)."""
    model = raw.get("model")
    if not isinstance(model, dict):
        return raw
    _import_homes(MODEL_PACKAGES)
    if "name" not in model:
        named = {section.get("data_processor") for section in (raw.get("train_input"), raw.get("eval_input"))
                 if isinstance(section, dict)}
        owners = [spec.name for spec in _MODELS.values() if named & set(spec.data_processors)]
        if owners:  # several families read the same LM data: the first registered is the files' model
            model["name"] = owners[0]
    spec = _MODELS.get(model.get("name"))
    for name in ("train_input", "eval_input"):
        section = raw.get(name)
        if spec is None or not spec.data_processors or not isinstance(section, dict) or section.get("data_fn"):
            continue
        processor = section.get("data_processor")
        why = dict(spec.refused_processors).get(processor)
        if why:
            raise ParamsError(f"params: {name}.data_processor: {processor!r} is not built here: {why}"
                              f"{locate(f'{name}.data_processor')}")
        if processor is not None and processor not in spec.data_processors:
            raise ParamsError(f"params: {name}.data_processor: {processor!r} is not one {spec.name}'s data reads; "
                              f"expected one of {', '.join(spec.data_processors)} (or set {name}.data_fn)"
                              f"{locate(f'{name}.data_processor')}")
        for key in spec.input_keys:
            if key not in model:
                continue
            if section.setdefault(key, model[key]) != model[key]:
                # The Model Zoo's data processors take the input's own copy and ignore it (deprecated there), so a
                # file whose copy disagrees trains in the vendor's stack: the model's value is the one that counts.
                logger.info("%s.%s=%r differs from model.%s=%r; the data is checked against the model's value (the "
                            "Model Zoo's data processors ignore %s.%s)", name, key, section[key], key, model[key],
                            name, key)
                section[key] = model[key]
    train = raw.get("train_input")
    for key, input_key in (spec.keys_from_input if spec is not None and isinstance(train, dict) else ()):
        if model.get(key) is None and train.get(input_key) is not None:
            model[key] = train[input_key]
    if spec is not None and spec.defaults_fn:
        resolve_object(spec.defaults_fn, key="model.name")(model)
    return raw


def sections_reading_data_processor(raw: dict) -> frozenset[str]:
    """The input sections whose loader is the named model's own data, which reads ``data_processor`` (the GPT
    data: GptHDF5DataProcessor or GptHDF5MapDataProcessor, with its mixture, data_subset, ...): there the key
    is passed on to the data function, elsewhere it is the vendor's class name with no effect here."""
    model = raw.get("model")
    if not isinstance(model, dict):
        return frozenset()
    _import_homes(MODEL_PACKAGES)
    spec = _MODELS.get(model.get("name"))
    if spec is None or not spec.data_processors:
        return frozenset()
    return frozenset(name for name in ("train_input", "eval_input")
                     if isinstance(raw.get(name), dict) and not raw[name].get("data_fn"))


def registered_models() -> list[str]:
    _import_homes(MODEL_PACKAGES)
    return sorted(_MODELS)


def get_model_spec(name: str) -> ModelSpec:
    """A registered name, or a ``module:function`` string taken as the model function itself."""
    _import_homes(MODEL_PACKAGES)
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
    obj: Any = _import_module(module_name, where)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ParamsError(f"params: {where}module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _import_module(name: str, where: str) -> Any:
    """Import module ``name`` for a params key. Not found: a ParamsError asking for the path. Found, but its
    code failed (a SyntaxError, an import inside it, a NameError at module level, ...): a ParamsError
    naming the error and the file:line it is at, unless that line is cs-run's own (then it propagates)."""
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - the module's own code failed while it was imported
        if isinstance(e, CsRunError):
            raise  # already one line about the user's input
        if isinstance(e, ModuleNotFoundError) and e.name and (name == e.name or name.startswith(e.name + ".")):
            raise ParamsError(f"params: {where}cannot import module {name!r} ({e}); is it on PYTHONPATH (or "
                              "--python_paths)?") from None
        failed = _import_failure(name, e, where)
        if failed is None:
            raise
        raise failed from e


def _import_failure(name: str, e: BaseException, where: str) -> Optional[ParamsError]:
    """The ParamsError of module ``name`` failing at import, at the line it failed in: a SyntaxError's own
    line, else the deepest line of the user's files, else the deepest line outside the import machinery.
    None when that line is in cs-run's own packages (cs-run's error, reported as such)."""
    if isinstance(e, SyntaxError) and e.filename:
        filename, line, message = e.filename, e.lineno, e.msg
    else:
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if not f.filename.startswith("<") and Path(f.filename).parent.name != "importlib"]
        site = ([f for f in frames if is_user_file(f.filename)] or frames[1:] or [None])[-1]  # [0]: this module
        if site is None:
            return None
        filename, line, message = site.filename, site.lineno, str(e)
    if str(Path(filename).resolve()).startswith(own_roots()):
        return None
    text = f"{type(e).__name__}: {message}" if message else type(e).__name__
    return ParamsError(f"params: {where}importing {name!r} failed at {filename}:{line}: {text}")


def check_model_keys(spec: ModelSpec, values: dict, locate, section_keys: Iterable[str] = ()) -> None:
    """Validate the ``model`` section's extra keys against the family's config class, or, for a model without
    one (a ``module:function`` name), against its function's signature."""
    if spec.config_class:
        check_config_keys(resolve_object(spec.config_class, key="model.name"), values, "model", locate, section_keys)
    else:
        check_function_keys(resolve_object(spec.model_fn, key="model.name"), values, "model", set(), locate,
                            section_keys)


def check_config_keys(config_class: type, values: dict, section: str, locate, section_keys: Iterable[str] = ()) -> None:
    """Validate a section's extra keys against a config dataclass's fields: names and types (every field has a
    default). ``section_keys`` are listed with the fields among the valid ones when a key is unknown."""
    hints = typing.get_type_hints(config_class)
    _check_keys({f.name: f for f in fields(config_class)}, hints, False, values, section, locate, section_keys)


def _check_keys(named: dict, hints: dict, accepts_any: bool, values: dict, section: str, locate,
                section_keys: Iterable[str]) -> None:
    """Each key of ``values`` is one of ``named`` (unless ``accepts_any``) and of its type in ``hints``."""
    for key, value in values.items():
        key_path = f"{section}.{key}"
        if key not in named:
            if accepts_any:
                continue
            raise unknown_key_error(key_path, key, list(named) + list(section_keys), locate(key_path))
        if key in hints and value is not None:
            check_value(key_path, value, hints[key], where=locate(key_path))


def check_function_keys(fn: Callable, values: dict, section: str, reserved: set[str], locate,
                        section_keys: Iterable[str] = ()) -> None:
    """Validate a section's extra keys against ``fn``'s signature: names, required ones, types.

    ``section_keys`` (the section's own keys) are listed with ``fn``'s among the valid ones when a key is unknown.
    """

    sig = inspect.signature(fn)
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    named = {n: p for n, p in sig.parameters.items()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in reserved}
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations: skip type checks, keep name checks
        hints = {}
    _check_keys(named, hints, accepts_any, values, section, locate, section_keys)
    for name, p in named.items():
        if p.default is p.empty and name not in values:
            raise ParamsError(f"params: missing required key {section}.{name} "
                              f"(needed by {fn.__module__}.{fn.__qualname__}){locate(section)}")
