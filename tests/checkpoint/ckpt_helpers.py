"""Exact structural equality for checkpoint round trips (types, dtypes, bits, ties)."""

from __future__ import annotations

import collections
import math

import numpy as np
import torch


def tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().resolve_conj().resolve_neg().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def assert_same(a, b, path="root"):
    """a and b are equal bit for bit, with the same Python types all the way down."""
    assert type(a) is type(b), f"{path}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        assert a.requires_grad == b.requires_grad, path
        assert tensor_bytes(a) == tensor_bytes(b), f"{path}: data differs"
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes(), path
    elif isinstance(a, float):
        assert (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b)), path
    elif isinstance(a, complex):
        assert_same(a.real, b.real, path)
        assert_same(a.imag, b.imag, path)
    elif isinstance(a, dict):
        assert [(type(k), k) for k in a] == [(type(k), k) for k in b], f"{path}: keys differ"
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
        if isinstance(a, collections.OrderedDict):
            assert getattr(a, "_metadata", None) == getattr(b, "_metadata", None), f"{path}: _metadata"
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}.{i}")
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def leaves(obj, out=None):
    out = [] if out is None else out
    if isinstance(obj, dict):
        for v in obj.values():
            leaves(v, out)
    elif type(obj) in (list, tuple):
        for v in obj:
            leaves(v, out)
    else:
        out.append(obj)
    return out


def assert_ties(original, loaded):
    """Tensors that are one object in the original are one object after loading, and only those."""
    a = [x for x in leaves(original) if isinstance(x, torch.Tensor)]
    b = [x for x in leaves(loaded) if isinstance(x, torch.Tensor)]
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            if a[i].numel() == 0:
                continue
            assert (a[i] is a[j]) == (b[i] is b[j]), f"tie mismatch between leaves {i} and {j}"
