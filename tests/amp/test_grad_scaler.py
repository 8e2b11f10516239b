"""GradScaler: overflow halves the scale and skips the step, clean windows double it, bounds hold,
torch.amp.GradScaler agrees where semantics coincide, and a make_fx-traced step gives the same history."""

from __future__ import annotations

import copy

import pytest
import torch
from amp_helpers import PreinitSGD, trace_step

from cs_run.amp import GradScaler, optimizer_step
from cs_run.errors import ParamsError


def _model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1, bias=True).to(dtype)


def _big(dtype: torch.dtype) -> float:
    # finite input whose gradient times the scale overflows this dtype
    return {torch.float16: 60000.0, torch.bfloat16: 1e38, torch.float32: 1e38}[dtype]


def _loss(model, x):
    return model(x).sum()


def _run(model, opt, scaler, xs):
    """Eager steps; returns the scale after each update and the params after each step."""
    scales, snapshots = [], []
    for x in xs:
        opt.zero_grad()
        scaler.scale(_loss(model, x)).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        snapshots.append([p.detach().clone() for p in model.parameters()])
    return scales, snapshots


def _inputs(dtype, pattern, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = []
    for kind in pattern:
        x = torch.rand(2, 4, generator=g) + 0.5
        xs.append((x * (_big(dtype) if kind == "big" else 1.0)).to(dtype))
    return xs


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_overflow_halves_skips_and_regrows(dtype):
    model = _model(dtype)
    opt = PreinitSGD(model.parameters(), lr=0.01)
    scaler = GradScaler(
        "dynamic", init_scale=2.0**8, steps_per_increase=3, overflow_tolerance=0.0
    )
    pattern = ["ok", "big", "ok", "ok", "ok", "big", "big"]
    xs = _inputs(dtype, pattern)
    before = None
    for i, (kind, x) in enumerate(zip(pattern, xs)):
        params = [p.detach().clone() for p in model.parameters()]
        state = copy.deepcopy(opt.state_dict()["state"])
        scale = scaler.get_scale()
        opt.zero_grad()
        scaler.scale(_loss(model, x)).backward()
        scaler.step(opt)
        scaler.update()
        if kind == "big":
            assert scaler.get_scale() == scale / 2, i
            for p, q in zip(model.parameters(), params):
                assert torch.equal(p, q), (
                    "a step with overflowing grads must leave params unchanged"
                )
            for k, entry in opt.state_dict()["state"].items():
                for name, t in entry.items():
                    assert torch.equal(t, state[k][name]), (
                        f"optimizer state {name} changed on a skipped step"
                    )
        else:
            assert any(
                not torch.equal(p, q) for p, q in zip(model.parameters(), params)
            ), i
        before = scale
    # 2**8 -> ok, big: 2**7, ok ok ok: 2**8 after 3 clean steps, big big: 2**6
    assert scaler.get_scale() == 2.0**6
    assert before == 2.0**7


def test_min_and_max_bounds_hold():
    model = _model(torch.float32)
    opt = PreinitSGD(model.parameters(), lr=1e-6)
    scaler = GradScaler(
        "dynamic",
        init_scale=4.0,
        steps_per_increase=1,
        min_loss_scale=1.0,
        max_loss_scale=16.0,
        overflow_tolerance=0.0,
    )
    xs = [torch.full((2, 4), float("inf"))] * 4
    scales, _ = _run(model, opt, scaler, xs)
    assert scales == [2.0, 1.0, 1.0, 1.0]
    scales, _ = _run(model, opt, scaler, _inputs(torch.float32, ["ok"] * 6))
    assert scales == [2.0, 4.0, 8.0, 16.0, 16.0, 16.0]


def test_overflow_tolerance_counts_fraction_since_last_rescale():
    model = _model(torch.float32)
    opt = PreinitSGD(model.parameters(), lr=1e-3)
    scaler = GradScaler(
        "dynamic", init_scale=2.0**10, steps_per_increase=4, overflow_tolerance=0.5
    )
    pattern = ["big", "ok", "ok", "big", "ok", "big", "big"]
    scales, snaps = _run(model, opt, scaler, _inputs(torch.float32, pattern))
    # step 1: 1 overflow in 1 step > .5: halve and reset the counts. Then ok, ok, big: 1/3 is
    # tolerated (skipped, growth tracker reset), ok, big: 2/5 tolerated, big: 3/6 = .5, not > .5.
    assert scales == [2.0**9, 2.0**9, 2.0**9, 2.0**9, 2.0**9, 2.0**9, 2.0**9]
    assert torch.equal(snaps[3][0], snaps[2][0]), (
        "a tolerated overflow still skips the step"
    )
    # one more overflow: 4/7 > .5 halves
    scales, _ = _run(model, opt, scaler, _inputs(torch.float32, ["big"]))
    assert scales == [2.0**8]


@pytest.mark.parametrize("optim_cls", ["preinit_sgd", "sgd", "adam"])
def test_matches_torch_grad_scaler(optim_cls):
    pattern = ["ok", "big", "ok", "ok", "big", "ok", "ok", "ok", "ok"]
    xs = _inputs(torch.float32, pattern, seed=3)

    def make(scaler_cls):
        model = _model(torch.float32)
        if optim_cls == "preinit_sgd":
            opt = PreinitSGD(model.parameters(), lr=0.05)
        elif optim_cls == "sgd":
            opt = torch.optim.SGD(
                model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01
            )
        else:
            opt = torch.optim.Adam(model.parameters(), lr=0.05)
        return model, opt

    model, opt = make(None)
    ours = GradScaler(
        "dynamic",
        init_scale=2.0**10,
        steps_per_increase=3,
        overflow_tolerance=0.0,
        min_loss_scale=1e-30,
        max_loss_scale=1e30,
    )
    scales, snaps = _run(model, opt, ours, xs)

    tmodel, topt = make(None)
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    tscales, tsnaps = _run(tmodel, topt, theirs, xs)
    assert scales == tscales
    for a, b in zip(snaps, tsnaps):
        for p, q in zip(a, b):
            torch.testing.assert_close(p, q, rtol=0, atol=0)
    for (_, va), (_, vb) in zip(
        opt.state_dict()["state"].items(), topt.state_dict()["state"].items()
    ):
        for name in vb:
            torch.testing.assert_close(
                torch.as_tensor(va[name]), torch.as_tensor(vb[name]), rtol=0, atol=0
            )


def test_static_scale_is_constant_and_skips_overflow():
    model = _model(torch.float32)
    opt = PreinitSGD(model.parameters(), lr=1e-3)
    scaler = GradScaler(loss_scale=128.0)
    scales, snaps = _run(
        model, opt, scaler, _inputs(torch.float32, ["ok", "big", "ok"])
    )
    assert scales == [128.0] * 3
    assert all(torch.equal(p, q) for p, q in zip(snaps[0], snaps[1]))


def test_disabled_scaler_passes_through():
    scaler = GradScaler()  # vendor default loss_scale=0.0: no scaling
    assert not scaler.is_enabled()
    loss = torch.tensor(3.0)
    assert scaler.scale(loss) is loss
    model = _model(torch.float32)
    ref = copy.deepcopy(model)
    opt, ref_opt = PreinitSGD(model.parameters()), PreinitSGD(ref.parameters())
    x = _inputs(torch.float32, ["ok"])[0]
    optimizer_step(_loss(model, x), opt, scaler)
    optimizer_step(_loss(ref, x), ref_opt, None)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))


def test_state_dict_round_trip_and_torch_state_dict():
    a = GradScaler("dynamic", init_scale=64.0, steps_per_increase=2)
    model = _model(torch.float32)
    _run(
        model,
        PreinitSGD(model.parameters()),
        a,
        _inputs(torch.float32, ["ok", "big", "ok"]),
    )
    b = GradScaler("dynamic", init_scale=2.0, steps_per_increase=2)
    b.load_state_dict(a.state_dict())
    for key in (
        "current_scale",
        "growth_tracker",
        "steps_since_rescale",
        "overflows_since_rescale",
    ):
        assert torch.equal(getattr(a, key), getattr(b, key))
    c = GradScaler("dynamic")
    c.load_state_dict(torch.amp.GradScaler("cpu", init_scale=512.0).state_dict())
    assert c.get_scale() == 512.0 and int(c.growth_tracker) == 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"loss_scale": "Dynamic"}, "invalid loss_scale"),
        ({"loss_scale": -1.0}, "invalid loss_scale"),
        ({"loss_scale": float("inf")}, "invalid loss_scale"),
        ({"loss_scale": "dynamic", "init_scale": 0}, "invalid init_scale"),
        (
            {"loss_scale": "dynamic", "steps_per_increase": 0},
            "invalid steps_per_increase",
        ),
        (
            {"loss_scale": "dynamic", "min_loss_scale": 4.0, "max_loss_scale": 2.0},
            "larger than max_loss_scale",
        ),
        ({"loss_scale": "dynamic", "init_scale": 2.0**20}, "outside"),
        ({"loss_scale": "dynamic", "overflow_tolerance": 1.5}, "overflow_tolerance"),
        ({"loss_scale": 1.0, "max_gradient_norm": -1}, "max_gradient_norm"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ParamsError, match=match):
        GradScaler(**kwargs)


def test_misuse_order_errors():
    model = _model(torch.float32)
    opt = PreinitSGD(model.parameters())
    scaler = GradScaler("dynamic")
    with pytest.raises(RuntimeError, match="No inf checks"):
        scaler.update()
    scaler.scale(_loss(model, torch.ones(1, 4))).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.step(opt)
    with pytest.raises(TypeError, match="tensor"):
        scaler.scale(3.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_traced_step_gives_same_scale_history(dtype):
    pattern = ["ok", "big", "ok", "ok", "ok", "big", "ok"]
    xs = _inputs(dtype, pattern, seed=5)

    def build():
        model = _model(dtype)
        opt = PreinitSGD(model.parameters(), lr=0.01)
        scaler = GradScaler(
            "dynamic", init_scale=2.0**8, steps_per_increase=3, overflow_tolerance=0.0
        )
        return model, opt, scaler

    model, opt, scaler = build()
    eager_scales, eager_snaps = _run(model, opt, scaler, xs)

    tmodel, topt, tscaler = build()

    def step(x):
        loss = _loss(tmodel, x)
        optimizer_step(loss, topt, tscaler, max_gradient_norm=1e30)
        return loss

    replay = trace_step([tmodel, tscaler], topt, step, xs[0])
    assert not any(
        n.op == "call_function" and "item" in str(n.target)
        for n in replay.graph.graph.nodes
    )
    traced_scales = []
    for i, x in enumerate(xs):
        replay(x)
        traced_scales.append(tscaler.get_scale())
        for p, q in zip(tmodel.parameters(), eager_snaps[i]):
            torch.testing.assert_close(p.detach(), q, rtol=1e-6, atol=1e-6)
    assert traced_scales == eager_scales
    assert eager_scales == [2.0**8, 2.0**7, 2.0**7, 2.0**7, 2.0**8, 2.0**7, 2.0**7]
