"""optimizer_step (clipping, errors), autocast and the params helpers."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

import cs_run as cstorch
from cs_run.amp import (
    GradScaler,
    autocast,
    build_grad_scaler,
    optimizer_step,
    precision,
    resolve_mixed_precision,
)
from cs_run.backend import _reset_for_tests
from cs_run.errors import ParamsError


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )
    x, y = torch.randn(16, 4) * 5, torch.randint(0, 2, (16,))
    return model, x, y


def _loss(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


@pytest.mark.parametrize(
    "clip",
    [
        {"max_gradient_norm": 0.1},
        {"max_gradient_value": 0.01},
        {"max_gradient_val": 0.01},
        {},
    ],
)
@pytest.mark.parametrize("scaled", [False, True])
def test_optimizer_step_matches_manual_torch(clip, scaled):
    model, x, y = _setup()
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    scaler = GradScaler("dynamic", init_scale=2.0**8) if scaled else None
    for _ in range(3):
        optimizer_step(_loss(model, x, y), opt, scaler, **clip)
        _loss(ref, x, y).backward()
        if "max_gradient_norm" in clip:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), clip["max_gradient_norm"])
        elif clip:
            torch.nn.utils.clip_grad_value_(ref.parameters(), 0.01)
        ref_opt.step()
        ref_opt.zero_grad()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        assert p.grad is None
    if scaled:
        assert scaler.get_scale() == 2.0**8


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_gradient_norm": 1.0, "max_gradient_value": 1.0}, "mutually exclusive"),
        ({"max_gradient_norm": 1.0, "max_gradient_val": 1.0}, "mutually exclusive"),
        ({"max_gradient_value": 1.0, "max_gradient_val": 2.0}, "not both"),
        ({"max_gradient_norm": 0.0}, "invalid max_gradient_norm"),
        ({"max_gradient_value": -1.0}, "invalid max_gradient_value"),
    ],
)
def test_optimizer_step_bad_clipping(kwargs, match):
    model, x, y = _setup()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ParamsError, match=match):
        optimizer_step(_loss(model, x, y), opt, None, **kwargs)


def test_public_names():
    assert cstorch.amp.GradScaler is GradScaler
    assert cstorch.amp.optimizer_step is optimizer_step
    assert cstorch.amp.autocast is autocast


def test_autocast_bf16_on_cpu_matches_torch_autocast():
    model, x, _ = _setup()
    with autocast(dtype=torch.bfloat16):
        out = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, ref)
    with autocast(dtype=torch.bfloat16, enabled=False):
        assert model(x).dtype == torch.float32
    with pytest.raises(ParamsError, match="invalid dtype"):
        autocast(dtype=torch.float64)


@pytest.mark.parametrize(
    "params, device, expected",
    [
        ({}, "cpu", None),
        ({"mixed_precision": False, "use_bfloat16": True}, "cpu", None),
        ({"mixed_precision": True, "use_bfloat16": True}, "cpu", torch.bfloat16),
        ({"mixed_precision": True, "use_bfloat16": True}, "cuda", torch.bfloat16),
        ({"mixed_precision": True}, "cuda", torch.float16),
        ({"mixed_precision": True}, "cpu", torch.bfloat16),
        ({"mixed_precision": True, "fp16_type": "float16"}, "cuda", torch.float16),
        ({"mixed_precision": True, "fp16_type": "cbfloat16"}, "cuda", torch.bfloat16),
    ],
)
def test_resolve_mixed_precision(params, device, expected):
    assert resolve_mixed_precision(params, device_type=device) == expected


def test_resolve_mixed_precision_logs_cpu_fallback_and_rejects_bad_type(caplog):
    with caplog.at_level(logging.INFO, logger="cs_run.amp.precision"):
        assert (
            resolve_mixed_precision({"mixed_precision": True}, device_type="cpu")
            == torch.bfloat16
        )
    assert "bfloat16" in caplog.text
    with pytest.raises(ParamsError, match="fp16_type"):
        resolve_mixed_precision(
            {"mixed_precision": True, "fp16_type": "fp8"}, device_type="cpu"
        )


def test_build_grad_scaler_from_params():
    assert build_grad_scaler({}) is None
    assert build_grad_scaler({"loss_scaling_factor": 1.0}) is None
    static = build_grad_scaler({"loss_scaling_factor": 64.0})
    assert static.is_enabled() and not static.dynamic and static.get_scale() == 64.0
    dyn = build_grad_scaler(
        {
            "loss_scaling_factor": "dynamic",
            "initial_loss_scale": 1024.0,
            "steps_per_increase": 10,
        }
    )
    assert dyn.dynamic and dyn.get_scale() == 1024.0 and dyn.steps_per_increase == 10


def test_autocast_follows_the_current_backend_not_the_machine(monkeypatch):
    """On a machine with a GPU, ``cstorch.backend("CPU")`` must autocast the CPU ops it runs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with _reset_for_tests():
        assert precision._default_device_type() == "cuda"  # no backend yet: the accelerator
        cstorch.backend("CPU")
        assert autocast(dtype=torch.bfloat16).device == "cpu"

