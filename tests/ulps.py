"""Float32 ULP distances for comparisons against numbers recorded on another CPU (golden files).

Why golden comparisons need a tolerance at all: ATen picks its elementwise kernels by the CPU's vector ISA
(``torch.backends.cpu.get_cpu_capability()``, overridable with ``ATEN_CPU_CAPABILITY``), and the kernels
of one op may round differently: the vectorized ones contract ``a + alpha * b`` (add with alpha,
addcmul, addcdiv, lerp) into one FMA where the scalar ones round twice, take exp/log/pow/tanh from Sleef
(within 1 ulp) instead of libm, and reduce (sum, norm, matmul) in an order set by the vector width.
sqrt, div and single mul/add are correctly rounded everywhere. So one op's result may differ by one ulp
between CPUs, and a recurrence carries that difference on. Tests state a bound as "K ulps of the
tensor's scale" with K derived from how many such roundings the compared value went through
(:data:`ROUNDINGS_PER_STEP` per optimizer step); numbers computed by the same kernels in one process
are compared bit for bit instead.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["ROUNDINGS_PER_STEP", "assert_tree_within_ulps", "assert_within_ulps", "ulp", "ulps_apart"]

# An optimizer step reaches a tensor through at most two roundings that may differ between CPUs: the
# state's update (an EMA or accumulation, one multiply-add: fused or not) and the parameter's own
# subtraction p - lr * u (the update u arrives carrying the state's difference, already counted). Each
# is at most one ulp of the largest magnitude the tensor reaches, since the value it rounds is no
# larger. The recurrences do not amplify a carried difference (EMAs with beta <= 1; p - lr * u with
# lr * weight_decay < 1), so after N steps the worst case is ROUNDINGS_PER_STEP * N ulps of that scale.
ROUNDINGS_PER_STEP = 2


def _f64(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.detach().to(torch.float64).numpy() if isinstance(x, torch.Tensor) else np.asarray(x, np.float64)


def ulp(scale: float) -> float:
    """The float32 spacing at ``|scale|``: one unit in the last place of a float32 of that magnitude."""
    return float(np.spacing(np.float32(abs(scale))))


def ulps_apart(actual: torch.Tensor | np.ndarray, expected: torch.Tensor | np.ndarray,
               scale: float | None = None) -> float:
    """max |actual - expected| in float32 ulps of ``scale`` (default: the largest |expected|).

    A scale rather than each element's own magnitude: a value that crossed zero keeps the absolute
    difference it picked up while it was large, which is tiny against the tensor but huge against itself.
    """
    a, e = _f64(actual).reshape(-1), _f64(expected).reshape(-1)
    assert a.shape == e.shape, (a.shape, e.shape)
    if scale is None:
        scale = float(np.abs(e).max(initial=0.0))
    return float(np.abs(a - e).max(initial=0.0)) / ulp(scale)


def assert_within_ulps(actual: torch.Tensor | np.ndarray, expected: torch.Tensor | np.ndarray, ulps: float,
                       scale: float | None = None, what: str = "") -> None:
    """Fail with the distance when ``actual`` is more than ``ulps`` float32 ulps of ``scale`` away."""
    apart = ulps_apart(actual, expected, scale)
    assert apart <= ulps, f"{what}: {apart:.3g} ulps apart (bound {ulps})"


def assert_tree_within_ulps(actual: object, expected: object, ulps: float, what: str = "") -> None:
    """Nested dicts/lists equal, except that float arrays (as nested lists) may be ``ulps`` apart, each in
    ulps of its own largest |expected|: for recorded summaries of trained tensors."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        assert actual.keys() == expected.keys(), f"{what}: keys {sorted(actual)} != {sorted(expected)}"
        for key in expected:
            assert_tree_within_ulps(actual[key], expected[key], ulps, f"{what}.{key}")
        return
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        values = _float_array(expected)
        if values is not None and _float_array(actual) is not None:
            assert np.shape(actual) == values.shape, f"{what}: shape {np.shape(actual)} != {values.shape}"
            assert_within_ulps(_float_array(actual), values, ulps, what=what)
            return
        assert type(actual) is type(expected) and len(actual) == len(expected), f"{what}: {actual!r} != {expected!r}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_tree_within_ulps(a, e, ulps, f"{what}.{i}")
        return
    assert actual == expected, f"{what}: {actual!r} != {expected!r}"


def _float_array(values: list | tuple) -> np.ndarray | None:
    """The values as a float64 array when they are a (nested) rectangular list of floats, else None."""
    try:
        array = np.asarray(values)
    except ValueError:  # ragged
        return None
    return array.astype(np.float64) if array.dtype.kind == "f" else None
