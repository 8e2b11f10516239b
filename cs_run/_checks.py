"""Value checks shared by params files, function signatures and the Trainer: types, ranges, names.

Every message names the key path, the value and what is expected, and gives the closest valid key.
"""

from __future__ import annotations

import difflib
import math
import types
import typing
from typing import Any, Literal, Union

from cs_run.errors import ParamsError

__all__ = ["check_value", "unknown_key_error", "unknown_key_message"]


def check_value(key_path: str, value: Any, hint: Any, meta: typing.Mapping = {}, *, where: str = "",
                head: str = "params: ") -> None:
    """Raise ParamsError unless ``value`` fits the type ``hint`` and the range in ``meta``; the message is
    ``head`` (what was given: the params, a Trainer argument), the key path, what is wrong and ``where``."""
    if not _fits(value, hint):
        raise ParamsError(f"{head}{key_path}: expected {_type_name(hint)}, got {_describe(value)}{where}")
    if "choices" in meta and value not in meta["choices"]:
        choices = ", ".join(map(str, meta["choices"]))
        raise ParamsError(f"{head}{key_path}: {value!r} is not one of {choices}{where}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ParamsError(f"{head}{key_path}: expected a finite number, got {value}{where}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "max" in meta and value > meta["max"]:
            raise ParamsError(f"{head}{key_path}: must be <= {meta['max']}, got {value}{where}")
        if "min" in meta and value < meta["min"]:
            raise ParamsError(f"{head}{key_path}: must be >= {meta['min']}, got {value}{where}")
        if "min_exclusive" in meta and value <= meta["min_exclusive"]:
            raise ParamsError(f"{head}{key_path}: must be > {meta['min_exclusive']}, got {value}{where}")


def _fits(value: Any, hint: Any) -> bool:
    if hint is Any or hint is typing.Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if origin is Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is list and typing.get_args(hint):  # list[X]: every element an X
        return isinstance(value, (list, tuple)) and all(_fits(v, typing.get_args(hint)[0]) for v in value)
    if origin in (list, tuple) or hint in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        names = [_type_name(a) for a in typing.get_args(hint) if a is not type(None)]
        return " or ".join(names)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    names = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string",
             dict: "a mapping", list: "a list"}
    if origin is list and typing.get_args(hint):
        return f"a list of {_type_name(typing.get_args(hint)[0]).removeprefix('a ').removeprefix('an ')}s"
    return names.get(origin or hint, getattr(hint, "__name__", str(hint)))


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}" if not isinstance(value, (dict, list)) else type(value).__name__


def unknown_key_message(key_path: str, key: str, valid, *, where: str = "") -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'?" if close else "valid keys: " + ", ".join(sorted(valid))
    return f"params: unknown key {key_path}; {hint}{where}"


def unknown_key_error(key_path: str, key: str, valid, where: str = "") -> ParamsError:
    """The error for a key no schema or function signature knows, with the closest valid key."""
    return ParamsError(unknown_key_message(key_path, key, valid, where=where))
