"""Initializer specs as the Model Zoo writes them (``initializer``, ``embedding_initializer``,
``output_layer_initializer``, ...): a name, or a dict of ``name`` plus that initializer's arguments,
with the Model Zoo's defaults (layers/init.py and create_initializer.py).

:func:`initializer_spec` checks a spec and returns it in full (every argument filled), so a wrong
name or argument is one error naming the key; :func:`make_initializer` turns a full spec into a
function of a tensor; :func:`scale_spec` is muP's width/depth scaling of a normal or truncated
normal spec (mup_utils.scale_initializers_by_dimension).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Union

import torch
from torch import nn

__all__ = ["initializer_spec", "make_initializer", "scale_spec", "truncated_normal", "INITIALIZER_ARGS"]

Spec = Union[str, dict]

# Each initializer's arguments and their defaults; None: filled from another argument (truncated
# normal's a/b are -2 std / 2 std when not given).
INITIALIZER_ARGS: dict[str, dict[str, Any]] = {
    "constant": {"val": 0.0},
    "ones": {}, "zeros": {}, "eye": {},
    "uniform": {"a": -0.05, "b": 0.05},
    "normal": {"mean": 0.0, "std": 0.05},
    "xavier_normal": {"gain": 1.0}, "glorot_normal": {"gain": 1.0},
    "xavier_uniform": {"gain": 1.0}, "glorot_uniform": {"gain": 1.0},
    "kaiming_normal": {"a": 0.0, "mode": "fan_in", "nonlinearity": "leaky_relu"},
    "kaiming_uniform": {"a": 0.0, "mode": "fan_in", "nonlinearity": "leaky_relu"},
    "truncated_normal": {"mean": 0.0, "std": 0.05, "a": None, "b": None},
    "variance_scaling": {"scale": 1.0, "mode": "fan_in", "distribution": "truncated_normal"},
    "lecun_normal": {"scale": 1.0, "mode": "fan_in", "distribution": "truncated_normal"},
    "lecun_uniform": {"scale": 1.0, "mode": "fan_in", "distribution": "uniform"},
}
_CHOICES = {"mode": ("fan_in", "fan_out", "fan_avg"), "distribution": ("uniform", "normal", "truncated_normal"),
            "nonlinearity": ("leaky_relu", "relu")}


def truncated_normal(std: float, mean: float = 0.0) -> dict:
    """The Model Zoo's default initializer: truncated normal cut at two standard deviations."""
    return {"name": "truncated_normal", "mean": mean, "std": std, "a": -2 * std, "b": 2 * std}


def initializer_spec(spec: Spec, key: str) -> dict:
    """``spec`` checked and completed. Raises ValueError naming ``key`` and the bad part."""
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"{key}: expected an initializer name or a dict with 'name', got {spec!r}")
    name = spec["name"].lower()
    if name not in INITIALIZER_ARGS:
        raise ValueError(f"{key}.name: unknown initializer {spec['name']!r}; one of {', '.join(INITIALIZER_ARGS)}")
    args = INITIALIZER_ARGS[name]
    out: dict[str, Any] = {"name": name}
    for arg, value in spec.items():
        if arg == "name" or value is None:  # the Model Zoo drops None arguments (defaults apply)
            continue
        if arg not in args:
            raise ValueError(f"{key}.{arg}: not an argument of the {name} initializer "
                             f"({', '.join(args) or 'it takes none'})")
        if arg in _CHOICES:
            if value not in _CHOICES[arg]:
                raise ValueError(f"{key}.{arg}: {value!r} is not one of {', '.join(_CHOICES[arg])}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key}.{arg}: expected a number, got {value!r}")
        out[arg] = value
    for arg, default in args.items():
        out.setdefault(arg, default)
    if name == "truncated_normal":
        out["a"] = -2 * out["std"] if out["a"] is None else out["a"]
        out["b"] = 2 * out["std"] if out["b"] is None else out["b"]
    return out


def scale_spec(spec: dict, width_scale: float = 1.0, depth_scale: float = 1.0, key: str = "") -> dict:
    """muP: a normal/truncated-normal spec with std (and a, b) times ``width_scale * depth_scale``."""
    if spec["name"] not in ("normal", "truncated_normal"):
        raise ValueError(f"{key}: muP scales only normal and truncated_normal initializers, got {spec['name']!r}")
    factor = width_scale * depth_scale
    out = dict(spec, std=spec["std"] * factor)
    if spec["name"] == "truncated_normal":
        out.update(a=spec["a"] * factor, b=spec["b"] * factor)
    return out


def _variance_scaling(tensor: torch.Tensor, scale: float, mode: str, distribution: str) -> torch.Tensor:
    fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(tensor)
    denom = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[mode]
    variance = scale / max(1.0, denom)
    with torch.no_grad():
        if distribution == "truncated_normal":
            return nn.init.trunc_normal_(tensor, std=math.sqrt(variance) / 0.87962566103423978)
        if distribution == "normal":
            return tensor.normal_(std=math.sqrt(variance))
        bound = math.sqrt(3 * variance)
        return tensor.uniform_(-bound, bound)


def make_initializer(spec: Spec) -> Callable[[torch.Tensor], Any]:
    """A function that initializes a tensor in place as ``spec`` (checked by :func:`initializer_spec`) says."""
    s = initializer_spec(spec, "initializer")
    name, init = s["name"], nn.init
    if name in ("variance_scaling", "lecun_normal", "lecun_uniform"):
        return lambda t: _variance_scaling(t, s["scale"], s["mode"], s["distribution"])
    table: dict[str, Callable[[torch.Tensor], Any]] = {
        "constant": lambda t: init.constant_(t, s["val"]),
        "ones": init.ones_, "zeros": init.zeros_, "eye": init.eye_,
        "uniform": lambda t: init.uniform_(t, a=s["a"], b=s["b"]),
        "normal": lambda t: init.normal_(t, mean=s["mean"], std=s["std"]),
        "xavier_normal": lambda t: init.xavier_normal_(t, gain=s["gain"]),
        "glorot_normal": lambda t: init.xavier_normal_(t, gain=s["gain"]),
        "xavier_uniform": lambda t: init.xavier_uniform_(t, gain=s["gain"]),
        "glorot_uniform": lambda t: init.xavier_uniform_(t, gain=s["gain"]),
        "kaiming_normal": lambda t: init.kaiming_normal_(t, a=s["a"], mode=s["mode"], nonlinearity=s["nonlinearity"]),
        "kaiming_uniform": lambda t: init.kaiming_uniform_(t, a=s["a"], mode=s["mode"],
                                                           nonlinearity=s["nonlinearity"]),
        "truncated_normal": lambda t: init.trunc_normal_(t, mean=s["mean"], std=s["std"], a=s["a"], b=s["b"]),
    }
    return table[name]
