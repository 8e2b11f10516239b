"""The ``sparsity`` section of a params file, checked and put in one form (torch-free).

The section is the cstorch sparse API's config (``cstorch.sparse.configure``): a number (static
sparsity of every parameter the default filter picks), one mapping, or a list of mappings, each one
algorithm with its parameter filter. The trainer form writes it under ``trainer.init.sparsity``
(``cs_run.vendor_params`` moves it here). :func:`check_sparsity` checks every key and value once, at
load, and returns a list of plain dicts that ``cs_run.sparse.configure`` builds from; a key or value the
vendor's API does not take is one ``params:`` error naming it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

from cs_run._checks import unknown_key_message
from cs_run.errors import ParamsError

__all__ = ["ALGORITHMS", "INIT_METHODS", "SCHEDULE_TYPES", "check_sparsity", "summaries_wanted"]

ALGORITHMS = ("static", "gmp", "set", "rigl")
"""The vendor's sparsity algorithms, by their ``algorithm`` value (the class name, lower case)."""
INIT_METHODS = ("random", "topk", "from_zeros", "checkerboard")
"""The built-in mask initializations (``init_method``), as ``cstorch.sparse.init`` names them."""
SCHEDULE_TYPES = {
    "constant": ({"value"}, set()),
    "linear": ({"init", "slope"}, set()),
    "exp": ({"init", "gamma"}, {"final"}),
    "power": ({"init", "beta"}, set()),
    "cosine": ({"init", "half_period"}, {"minimum"}),
    "cycling": ({"values"}, set()),
}
"""A step-aware hyper-parameter's ``type`` -> (required keys, optional keys), as cstorch.sparse.utils has them."""

_COMMON = ("algorithm", "sparsity", "init_method", "param_filter", "add_summaries")
_KEYS = {
    "static": _COMMON,
    "gmp": (*_COMMON, "update"),
    "set": (*_COMMON, "update", "drop_fraction"),
    "rigl": (*_COMMON, "update", "drop_fraction", "balance_in_groups", "balance_out_groups"),
}
_OLD_SPELLINGS = {
    "param_name_patterns": "the Model Zoo 2.0/2.1 spelling (regular expressions); since 2.2 it is param_filter with "
                           "globs, e.g. '*proj_[qkv]_dense_layer.weight' for '.*proj_[qkv]_dense_layer.weight'",
}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_sparsity(value: Any, key: str = "sparsity",
                   locate: Callable[[str], str] = lambda key: "") -> list[tuple[str, dict]]:
    """The section as a list of (key path, algorithm config) pairs (``algorithm`` always set, ``schedule``
    renamed ``sparsity``, the 2.2 ``type`` renamed ``algorithm``; an entry with ``sparsity: null`` left
    out); an empty list for ``sparsity: null``.

    Per-parameter values are per-pattern entries: a list of mappings, each with its own ``param_filter``
    and its own level, schedules and ``init_method`` (a weight goes to the first entry whose filter
    matches it). The Python API's per-parameter mapping (``sparsity={param: level}``) is keyed by tensors
    and has no params-file form.

    Raises:
        ParamsError: an unknown key, algorithm, init method or schedule type, or a value out of range,
            naming the key path (``sparsity[1].update.freq``) and where it is.
    """
    if value is None:
        return []
    if _number(value):
        value = {"sparsity": value}
    if isinstance(value, dict) and "groups" in value:  # the config classes' packed form: {groups: [{params: ...}]}
        groups = value["groups"]
        value = [{**{k: v for k, v in g.items() if k != "params"}, **(g.get("params") or {})}
                 for g in (groups if isinstance(groups, list) else [groups])]
    if isinstance(value, dict):
        return [(key, c) for c in [_check_one(value, key, locate)] if c is not None]
    if isinstance(value, list):
        if not value:
            raise ParamsError(f"params: {key}: an empty list sparsifies nothing; give one mapping per algorithm or "
                              f"remove the section{locate(key)}")
        keys = [f"{key}[{i}]" for i in range(len(value))]
        return [(k, c) for k, item in zip(keys, value) if (c := _check_one(item, k, locate)) is not None]
    raise ParamsError(f"params: {key}: expected a sparsity level (a number), a mapping or a list of mappings, "
                      f"got {type(value).__name__}{locate(key)}")


def _check_one(config: Any, key: str, locate) -> Optional[dict]:
    if _number(config):
        config = {"sparsity": config}
    if not isinstance(config, dict):
        raise ParamsError(f"params: {key}: expected a mapping (algorithm, sparsity, ...), "
                          f"got {type(config).__name__}{locate(key)}")
    config = dict(config)
    if "type" in config and "algorithm" not in config:  # the 2.2 spelling, which the vendor still accepts
        config["algorithm"] = config.pop("type")
    algorithm = config.get("algorithm", "static")
    if not isinstance(algorithm, str) or algorithm.lower() not in ALGORITHMS:
        raise ParamsError(f"params: {key}.algorithm: {algorithm!r} is not one of {', '.join(ALGORITHMS)}"
                          f"{locate(key + '.algorithm')}")
    algorithm = config["algorithm"] = algorithm.lower()
    if "schedule" in config:
        schedule = config.pop("schedule")
        if isinstance(schedule, dict) and ("freq" in schedule or "steps" in schedule):
            raise ParamsError(f"params: {key}.schedule: an update schedule ({{freq: ...}}) is the Model Zoo 2.0/2.1 "
                              f"spelling; since 2.2 it is {key}.update, and schedule means the sparsity level"
                              f"{locate(key + '.schedule')}")
        if "sparsity" in config:
            raise ParamsError(f"params: {key}.schedule: an alias of {key}.sparsity; give one of them"
                              f"{locate(key + '.schedule')}")
        config["sparsity"] = schedule
    for name in config:
        if name not in _KEYS[algorithm]:
            hint = _OLD_SPELLINGS.get(name)
            if name == "param_name_patterns" and isinstance(config[name], dict):
                hint = _per_pattern_hint(config)
            if hint:
                raise ParamsError(f"params: {key}.{name}: {hint}{locate(f'{key}.{name}')}")
            raise ParamsError(unknown_key_message(f"{key}.{name}", name, _KEYS[algorithm],
                                                  where=f" (algorithm {algorithm}){locate(f'{key}.{name}')}"))
    if config.get("sparsity") is None:
        if "sparsity" in config:
            return None  # the vendor's configure: sparsity null means no sparsity from this entry
        raise ParamsError(f"params: {key}.sparsity: missing; give the fraction of each weight to prune "
                          f"(0 <= sparsity < 1){locate(key)}")
    level = config["sparsity"]
    if not (isinstance(level, dict) and not all(isinstance(k, str) for k in level)):  # {param tensor: level} is
        _check_level(config, algorithm, key, locate)  # the Python API's mapping: the algorithm checks its values
    method = config.get("init_method", "random")
    if not callable(method) and method not in INIT_METHODS:  # the Python API may give its own callable
        raise ParamsError(f"params: {key}.init_method: {method!r} is not one of {', '.join(INIT_METHODS)}"
                          f"{locate(key + '.init_method')}")
    if not isinstance(config.get("add_summaries", False), bool):
        raise ParamsError(f"params: {key}.add_summaries: expected true or false, got {config['add_summaries']!r}"
                          f"{locate(key + '.add_summaries')}")
    flt = config.get("param_filter")
    if flt is not None and not (isinstance(flt, str) or
                                (isinstance(flt, list) and flt and all(isinstance(f, str) for f in flt))):
        raise ParamsError(f"params: {key}.param_filter: expected a glob or a list of globs (e.g. '*dense_layer.weight'), "
                          f"got {flt!r}{locate(key + '.param_filter')}")
    if "update" in config:
        _check_update(config["update"], f"{key}.update", locate)
    if "drop_fraction" in config:
        _check_schedule(config["drop_fraction"], f"{key}.drop_fraction", locate)
        if _number(config["drop_fraction"]) and not 0 <= config["drop_fraction"] <= 1:
            raise ParamsError(f"params: {key}.drop_fraction: must be between 0 and 1, got {config['drop_fraction']}"
                              f"{locate(key + '.drop_fraction')}")
    balance = [b for b in ("balance_in_groups", "balance_out_groups") if config.get(b) is not None]
    if len(balance) > 1:
        raise ParamsError(f"params: {key}.balance_out_groups: give balance_in_groups or balance_out_groups, not both"
                          f"{locate(key + '.balance_out_groups')}")
    for b in balance:
        if not isinstance(config[b], int) or isinstance(config[b], bool) or config[b] < 1:
            raise ParamsError(f"params: {key}.{b}: expected an integer >= 1, got {config[b]!r}{locate(f'{key}.{b}')}")
    return config


def _check_level(config: dict, algorithm: str, key: str, locate) -> None:
    """``sparsity``: one number for static; a number, list or schedule for the others; numbers in [0, 1)."""
    _no_type_hint(config["sparsity"], f"{key}.sparsity", locate)
    if algorithm == "static":
        if not _number(config["sparsity"]):
            raise ParamsError(f"params: {key}.sparsity: static sparsity is one number, got "
                              f"{type(config['sparsity']).__name__}; use algorithm gmp for a schedule"
                              f"{locate(key + '.sparsity')}")
    else:
        _check_schedule(config["sparsity"], f"{key}.sparsity", locate)
        if algorithm == "gmp" and (_number(config["sparsity"]) or
                                   (isinstance(config["sparsity"], dict)
                                    and str(config["sparsity"].get("type")).lower() == "constant")):
            raise ParamsError(f"params: {key}.sparsity: gmp with a constant sparsity never changes the mask; use "
                              f"algorithm static, or a schedule (type: linear, exp, ...){locate(key + '.sparsity')}")
    if _number(config["sparsity"]) and not 0 <= config["sparsity"] < 1:
        raise ParamsError(f"params: {key}.sparsity: must be >= 0 and < 1, got {config['sparsity']}"
                          f"{locate(key + '.sparsity')}")


def _per_pattern_hint(config: dict) -> str:
    """The 2.2+ list a 2.0/2.1 ``param_name_patterns: {regex: {overrides}}`` section stands for, as the
    vendor's config converter writes it (each entry: the glob, the section's other keys, the overrides)."""
    rest = {k: v for k, v in config.items() if k != "param_name_patterns"}
    entries = [{"param_filter": str(pattern).replace(".*", "*"), **rest, **(overrides or {})}
               for pattern, overrides in config["param_name_patterns"].items()]
    return ("the Model Zoo 2.0/2.1 per-pattern form (regular expressions, each with its own settings); since 2.2 "
            f"it is one list entry per pattern with a param_filter glob: sparsity: {entries}")


def _no_type_hint(value: Any, key: str, locate) -> None:
    """A level given as ``{pattern: level}``: the Python API's per-parameter mapping has no params-file form."""
    if isinstance(value, dict) and "type" not in value:
        raise ParamsError(f"params: {key}: a mapping without a type is not a schedule; per-parameter levels are one "
                          f"list entry per pattern (sparsity: [{{param_filter: '*fc1*', sparsity: 0.5}}, ...]), "
                          f"and a schedule is {{type: linear, ...}}{locate(key)}")


def _check_schedule(value: Any, key: str, locate) -> None:
    """A step-aware hyper-parameter: a number, a list (cycling) or ``{type: ..., ...}``."""
    if _number(value):
        return
    if isinstance(value, list):
        if not value or not all(_number(v) for v in value):
            raise ParamsError(f"params: {key}: a list cycles through its numbers; got {value!r}{locate(key)}")
        return
    if not isinstance(value, dict):
        raise ParamsError(f"params: {key}: expected a number, a list of numbers or a schedule mapping with a type, "
                          f"got {type(value).__name__}{locate(key)}")
    kind = value.get("type")
    if not isinstance(kind, str) or kind.lower() not in SCHEDULE_TYPES:
        raise ParamsError(f"params: {key}.type: {kind!r} is not one of {', '.join(SCHEDULE_TYPES)}"
                          f"{locate(key + '.type')}")
    required, optional = SCHEDULE_TYPES[kind.lower()]
    for name, v in value.items():
        if name == "type":
            continue
        if name not in required | optional:
            raise ParamsError(unknown_key_message(f"{key}.{name}", name, sorted(required | optional),
                                                  where=f" (schedule type {kind}){locate(f'{key}.{name}')}"))
        ok = (isinstance(v, list) and v and all(_number(x) for x in v)) if name == "values" else _number(v)
        if not ok:
            raise ParamsError(f"params: {key}.{name}: expected a number, got {v!r}{locate(f'{key}.{name}')}")
    missing = sorted(required - set(value))
    if missing:
        raise ParamsError(f"params: {key}: schedule type {kind} needs {', '.join(missing)}{locate(key)}")
    if kind.lower() == "cosine" and value["half_period"] <= 0:
        raise ParamsError(f"params: {key}.half_period: must be > 0, got {value['half_period']}"
                          f"{locate(key + '.half_period')}")


def _check_update(value: Any, key: str, locate) -> None:
    """When masks change: ``{freq, start, stop}`` or ``{steps: [...]}``."""
    if not isinstance(value, dict) or not ({"freq", "steps"} & set(value)):
        raise ParamsError(f"params: {key}: expected {{freq: N, start: S, stop: E}} or {{steps: [...]}}, got {value!r}"
                          f"{locate(key)}")
    valid = ("steps",) if "steps" in value else ("freq", "start", "stop")
    for name, v in value.items():
        if name not in valid:
            raise ParamsError(unknown_key_message(f"{key}.{name}", name, valid, where=locate(f"{key}.{name}")))
        if name == "steps":
            if not isinstance(v, list) or not v or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                           for s in v):
                raise ParamsError(f"params: {key}.steps: expected a list of steps (integers >= 0), got {v!r}"
                                  f"{locate(f'{key}.steps')}")
            continue
        if v is None and name == "stop":
            continue
        low = 1 if name == "freq" else 0
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ParamsError(f"params: {key}.{name}: expected an integer >= {low}, got {v!r}{locate(f'{key}.{name}')}")


def summaries_wanted(value: Any) -> bool:
    """Whether the section asks for the target and actual sparsity summaries: ``add_summaries: true`` in
    an entry (the legacy spelling of the vendor Trainer's ``LogSparsity`` callback, which the trainer form
    lists under ``trainer.init.callbacks``)."""
    entries = value if isinstance(value, list) else [value]
    return any(isinstance(e, dict) and e.get("add_summaries") is True for e in entries)
