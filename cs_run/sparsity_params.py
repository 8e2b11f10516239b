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


def check_sparsity(value: Any, key: str = "sparsity", locate: Callable[[str], str] = lambda key: "",
                   max_steps: Optional[int] = None) -> list[tuple[str, dict]]:
    """The section as a list of (key path, algorithm config) pairs (``algorithm`` always set, ``schedule``
    renamed ``sparsity``, the 2.2 ``type`` renamed ``algorithm``; an entry with ``sparsity: null`` left
    out); an empty list for ``sparsity: null``.

    Per-parameter values are per-pattern entries: a list of mappings, each with its own ``param_filter``
    and its own level, schedules and ``init_method`` (a weight goes to the first entry whose filter
    matches it). The Python API's per-parameter mapping (``sparsity={param: level}``) is keyed by tensors
    and has no params-file form.

    Values are checked for meaning, not only type: a level stays in [0, 1) and a drop fraction in [0, 1]
    at every update step (a GMP schedule reaching 1.0 prunes every weight; the last update step is the
    update's ``stop``, its last listed step, or ``max_steps`` when the run's length is known), an update
    ``stop`` is after its ``start``, and steps fit the int64 step counter.

    Raises:
        ParamsError: an unknown key, algorithm, init method or schedule type, or a value out of range,
            naming the key path (``sparsity[1].update.freq``) and where it is.
    """
    if value is None:
        return []
    if _number(value):
        value = {"sparsity": value}
    if isinstance(value, dict) and "groups" in value:  # the config classes' packed form: {groups: [{params: ...}]}
        value = _unpack_groups(value["groups"], f"{key}.groups", locate)
    if isinstance(value, dict):
        return [(key, c) for c in [_check_one(value, key, locate, max_steps)] if c is not None]
    if isinstance(value, list):
        if not value:
            raise ParamsError(f"params: {key}: an empty list sparsifies nothing; give one mapping per algorithm or "
                              f"remove the section{locate(key)}")
        keys = [f"{key}[{i}]" for i in range(len(value))]
        return [(k, c) for k, item in zip(keys, value) if (c := _check_one(item, k, locate, max_steps)) is not None]
    raise ParamsError(f"params: {key}: expected a sparsity level (a number), a mapping or a list of mappings, "
                      f"got {type(value).__name__}{locate(key)}")


def _unpack_groups(groups: Any, key: str, locate) -> list:
    """``{groups: [{params: {...}, ...}]}`` (one group may stand alone) as a list of entries."""
    entries = groups if isinstance(groups, list) else [groups]
    for i, group in enumerate(entries):
        where = f"{key}[{i}]" if isinstance(groups, list) else key
        if not isinstance(group, dict):
            raise ParamsError(f"params: {where}: expected a mapping {{params: {{algorithm: ..., sparsity: ...}}}} "
                              f"(a list of them for several groups), got {group!r}{locate(where)}")
        if not isinstance(group.get("params") or {}, dict):
            raise ParamsError(f"params: {where}.params: expected a mapping of the group's settings (algorithm, "
                              f"sparsity, ...), got {group['params']!r}{locate(where + '.params')}")
    return [{**{k: v for k, v in g.items() if k != "params"}, **(g.get("params") or {})} for g in entries]


def _check_one(config: Any, key: str, locate, max_steps: Optional[int] = None) -> Optional[dict]:
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
    steps = _update_steps(config.get("update"), max_steps)
    if not (isinstance(level, dict) and not all(isinstance(k, str) for k in level)):
        _check_range(level, f"{key}.sparsity", locate, steps, closed=False)
    if "drop_fraction" in config:
        _check_schedule(config["drop_fraction"], f"{key}.drop_fraction", locate)
        _check_range(config["drop_fraction"], f"{key}.drop_fraction", locate, steps, closed=True)
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


_INT64_MAX = 2**63 - 1  # the step counter and the update schedule's arithmetic are int64 tensors
_FLOAT32_ONE = 1 - 2**-25  # a level at or above this is 1.0 in the float32 the masks are computed in


def _update_steps(update: Any, max_steps: Optional[int]) -> tuple[int, Optional[int]]:
    """The first and last steps whose masks a schedule sets (last None: not known before the run)."""
    if isinstance(update, dict) and isinstance(update.get("steps"), list):
        return min(update["steps"]), max(update["steps"])
    update = update if isinstance(update, dict) else {}
    start, freq, stop = update.get("start") or 0, update.get("freq") or 1, update.get("stop")
    known = isinstance(max_steps, int) and not isinstance(max_steps, bool)
    last = stop - 1 if stop is not None else (max_steps - 1 if known else None)
    return start, (None if last is None or last < start else start + (last - start) // freq * freq)


def _values(value: Any, steps: tuple[int, Optional[int]]) -> list[tuple[float, str]]:
    """(value, where) at the extremes a schedule takes over its update steps (each type is monotone
    between them, cosine bounded by init and minimum, cycling one of its values)."""
    if _number(value):
        return [(value, "")]
    if isinstance(value, list):
        return [(v, f" (its item {i})") for i, v in enumerate(value)]
    kind = str(value.get("type")).lower()
    if kind == "constant":
        return [(value["value"], "")]
    if kind == "cycling":
        return [(v, f" (values[{i}])") for i, v in enumerate(value["values"])]
    if kind == "cosine":
        return [(value["init"], " (init)"), (value.get("minimum", 0.0), " (minimum)")]
    formula = {"linear": lambda s: value["init"] + s * value["slope"],
               "exp": lambda s: value.get("final", 1.0) - (value.get("final", 1.0) - value["init"]) *
               math.exp(min(s * value["gamma"], 700.0)),
               "power": lambda s: value["init"] * value["beta"] ** s}[kind]
    out = []
    for step in dict.fromkeys(s for s in steps if s is not None):
        try:
            out.append((formula(step), f" at step {step}"))
        except OverflowError:
            out.append((math.inf, f" at step {step}"))
        if kind == "power" and value["beta"] < 0:  # alternates sign: the next step has the other one
            out.append((formula(step + 1), f" at step {step + 1}"))
    return out


def _check_range(value: Any, key: str, locate, steps: tuple[int, Optional[int]], closed: bool) -> None:
    """A level in [0, 1) (1.0 prunes every weight), a drop fraction in [0, 1], at every update step."""
    if isinstance(value, dict) and str(value.get("type")).lower() not in SCHEDULE_TYPES:
        return  # the Python API's per-parameter mapping: each value checked when the algorithm is made
    for v, where in _values(value, steps):
        top_ok = v <= 1 if closed else v < _FLOAT32_ONE
        if not (v >= 0 and top_ok):
            what = "must be between 0 and 1" if closed else "must be >= 0 and < 1"
            fix = "" if _number(value) else "; change the schedule" + (
                ", or stop its update (update.stop) before it gets there" if "step" in where else "")
            why = "; a level of 1.0 prunes every weight" if fix and not closed and v >= 1 else ""
            raise ParamsError(f"params: {key}: {what}, got {v if _number(value) else f'{v:g}'}{where}{why}{fix}"
                              f"{locate(key)}")


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
            if not isinstance(v, list) or not v or not all(isinstance(s, int) and not isinstance(s, bool) and
                                                           0 <= s <= _INT64_MAX for s in v):
                raise ParamsError(f"params: {key}.steps: expected a list of steps (integers >= 0 and < 2**63), got "
                                  f"{v!r}{locate(f'{key}.steps')}")
            continue
        if v is None and name == "stop":
            continue
        low = 1 if name == "freq" else 0
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ParamsError(f"params: {key}.{name}: expected an integer >= {low}, got {v!r}{locate(f'{key}.{name}')}")
        if v > _INT64_MAX:
            raise ParamsError(f"params: {key}.{name}: expected an integer < 2**63 (steps are counted in int64), got "
                              f"{v!r}{locate(f'{key}.{name}')}")
    start, stop = value.get("start") or 0, value.get("stop")
    if stop is not None and stop <= start:
        raise ParamsError(f"params: {key}.stop: {stop} is not after start {start}, so the masks never update; give a "
                          f"stop > start (or none: update to the end){locate(f'{key}.stop')}")


def summaries_wanted(value: Any) -> bool:
    """Whether the section asks for the target and actual sparsity summaries: ``add_summaries: true`` in
    an entry (the legacy spelling of the vendor Trainer's ``LogSparsity`` callback, which the trainer form
    lists under ``trainer.init.callbacks``)."""
    entries = value if isinstance(value, list) else [value]
    return any(isinstance(e, dict) and e.get("add_summaries") is True for e in entries)
