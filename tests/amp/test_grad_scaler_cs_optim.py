"""Step skipping is exact for every cs_run.optim optimizer: an overflowing step changes neither the
parameters nor any optimizer state, and the run equals the same optimizer stepped on the clean
batches only (scales are powers of two, so unscaled gradients are bit-identical)."""

from __future__ import annotations

import copy

import pytest
import torch

import cs_run.optim as csoptim
from cs_run.amp import GradScaler, optimizer_step

NAMES = ["ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "Lamb", "Lion", "NAdam",
         "RAdam", "RMSprop", "Rprop", "SGD"]  # fmt: skip
PATTERN = ["ok", "big", "ok", "big", "big", "ok", "ok"]


def _batches():
    g = torch.Generator().manual_seed(1)
    return [
        ((torch.rand(3, 4, generator=g) + 0.5) * (1e38 if k == "big" else 1.0), k)
        for k in PATTERN
    ]


def _state(opt):
    return {
        (i, k): v.clone()
        for i, s in enumerate(opt.state.values())
        for k, v in s.items()
        if torch.is_tensor(v)
    }


@pytest.mark.parametrize("name", NAMES)
def test_skip_is_exact(name):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ref = copy.deepcopy(model)
    opt = getattr(csoptim, name)(model.parameters(), lr=0.01)
    ref_opt = getattr(csoptim, name)(ref.parameters(), lr=0.01)
    scaler = GradScaler("dynamic", init_scale=2.0**10, overflow_tolerance=0.0)
    for x, kind in _batches():
        params, state = [p.detach().clone() for p in model.parameters()], _state(opt)
        optimizer_step(model(x).square().mean(), opt, scaler)
        if kind == "big":
            assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
            after = _state(opt)
            assert all(torch.equal(after[k], v) for k, v in state.items()), name
        else:
            optimizer_step(ref(x).square().mean(), ref_opt, None)
    assert scaler.get_scale() == 2.0**7
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
