"""Scheduler values over 1,000 steps: equal to torch.optim.lr_scheduler where torch has the schedule,
to hand computations otherwise. Tolerance: rtol 1e-9 / atol 1e-12 (torch's chainable schedulers
multiply step by step in Python floats; ours evaluate the closed form in float64)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.optim.lr_scheduler as tls

import cs_run.optim as csoptim
from cs_run.optim import lr_scheduler as ls
from cs_run.optim.scheduler import _at_step

STEPS = 1000
S = ls  # ours


def _opt(lr=0.0):
    return csoptim.SGD([torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))], lr=lr)


def _torch_opt(lr):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def _ours_values(sched, n=STEPS):
    out = []
    for _ in range(n):
        out.append(float(sched.optimizer.param_groups[0]["lr"]))
        sched.step()
    return out


def _torch_values(make, base, n=STEPS):
    opt = _torch_opt(base)
    sched = make(opt)
    out = []
    for k in range(n):
        out.append(opt.param_groups[0]["lr"])
        if k < n - 1:
            opt.step()
            sched.step()
    return out


# (id, ours(opt), torch twin (opt) or None, base lr of the twin, hand formula t -> lr or None)
TABLE = [
    ("Constant", lambda o: S.ConstantLR(o, 0.07), lambda o: tls.ConstantLR(o, factor=1.0, total_iters=1), 0.07, None),
    ("Polynomial", lambda o: S.PolynomialLR(o, 0.1, 0.0, total_iters=700, power=2.0),
     lambda o: tls.PolynomialLR(o, total_iters=700, power=2.0), 0.1, None),
    ("PolynomialCycle", lambda o: S.PolynomialLR(o, 0.1, 0.01, total_iters=300, power=0.5, cycle=True), None, 0,
     lambda t: (0.1 - 0.01) * (1 - t / (300 * max(1, math.ceil(t / 300)))) ** 0.5 + 0.01),
    ("Linear", lambda o: S.LinearLR(o, 0.002, 0.1, total_iters=300),
     lambda o: tls.LinearLR(o, start_factor=0.02, end_factor=1.0, total_iters=300), 0.1, None),
    ("Exponential", lambda o: S.ExponentialLR(o, 0.1, total_iters=1, decay_rate=0.995),
     lambda o: tls.ExponentialLR(o, gamma=0.995), 0.1, None),
    ("ExponentialStaircase", lambda o: S.ExponentialLR(o, 0.1, total_iters=50, decay_rate=0.5, staircase=True),
     lambda o: tls.StepLR(o, step_size=50, gamma=0.5), 0.1, None),
    ("InverseExponentialTimeDecay", lambda o: S.InverseExponentialTimeDecayLR(o, 0.1, 1.5, 100, 0.3), None, 0,
     lambda t: 0.1 / (1 + 0.3 * t**1.5 / 100)),
    ("InverseExponentialTimeDecayStair",
     lambda o: S.InverseExponentialTimeDecayLR(o, 0.1, 1, 100, 0.3, staircase=True), None, 0,
     lambda t: 0.1 / (1 + 0.3 * math.floor(t / 100))),
    ("InverseSquareRootDecay", lambda o: S.InverseSquareRootDecayLR(o, 0.5, scale=2.0, warmup_steps=100), None, 0,
     lambda t: 0.5 * 2.0 / math.sqrt(max(t, 100))),
    ("CosineDecay", lambda o: S.CosineDecayLR(o, 0.1, 0.001, total_iters=1000),
     lambda o: tls.CosineAnnealingLR(o, T_max=1000, eta_min=0.001), 0.1, None),
    ("CosineDecayPastEnd", lambda o: S.CosineDecayLR(o, 0.1, 0.001, total_iters=600), None, 0,
     lambda t: 0.001 + (0.1 - 0.001) * 0.5 * (1 + math.cos(math.pi * min(t, 600) / 600))),
    ("CosineAnnealing", lambda o: S.CosineAnnealingLR(o, 0.1, T_max=300, eta_min=0.001),
     lambda o: tls.CosineAnnealingLR(o, T_max=300, eta_min=0.001), 0.1, None),
    ("WarmRestarts", lambda o: S.CosineAnnealingWarmRestarts(o, 0.1, T_0=50, eta_min=0.001),
     lambda o: tls.CosineAnnealingWarmRestarts(o, T_0=50, eta_min=0.001), 0.1, None),
    ("WarmRestartsMult", lambda o: S.CosineAnnealingWarmRestarts(o, 0.1, T_0=7, T_mult=2, eta_min=0.001),
     lambda o: tls.CosineAnnealingWarmRestarts(o, T_0=7, T_mult=2, eta_min=0.001), 0.1, None),
    ("Step", lambda o: S.StepLR(o, 0.1, step_size=100, gamma=0.7), lambda o: tls.StepLR(o, 100, gamma=0.7), 0.1, None),
    ("MultiStep", lambda o: S.MultiStepLR(o, 0.1, gamma=0.5, milestones=[100, 300, 800]),
     lambda o: tls.MultiStepLR(o, milestones=[100, 300, 800], gamma=0.5), 0.1, None),
    ("PiecewiseConstant", lambda o: S.PiecewiseConstantLR(o, [0.1, 0.05, 0.01], [200, 500]), None, 0,
     lambda t: 0.1 if t < 200 else 0.05 if t < 500 else 0.01),
    ("Lambda", lambda o: S.LambdaLR(o, 0.1, lr_lambda=lambda t: 0.99**t),
     lambda o: tls.LambdaLR(o, lr_lambda=lambda e: 0.99**e), 0.1, None),
    ("Multiplicative", lambda o: S.MultiplicativeLR(o, 0.1, coefficient=0.997),
     lambda o: tls.MultiplicativeLR(o, lr_lambda=lambda e: 0.997), 0.1, None),
    ("Cyclic", lambda o: S.CyclicLR(o, 0.001, 0.1, step_size_up=100, step_size_down=50),
     lambda o: tls.CyclicLR(o, 0.001, 0.1, step_size_up=100, step_size_down=50, cycle_momentum=False), 0.001, None),
    ("CyclicTriangular2", lambda o: S.CyclicLR(o, 0.001, 0.1, step_size_up=60, mode="triangular2"),
     lambda o: tls.CyclicLR(o, 0.001, 0.1, step_size_up=60, mode="triangular2", cycle_momentum=False), 0.001, None),
    ("CyclicExpRange", lambda o: S.CyclicLR(o, 0.001, 0.1, step_size_up=80, mode="exp_range", gamma=0.999),
     lambda o: tls.CyclicLR(o, 0.001, 0.1, step_size_up=80, mode="exp_range", gamma=0.999, cycle_momentum=False),
     0.001, None),
    ("OneCycle", lambda o: S.OneCycleLR(o, 0.004, 0.1, total_steps=STEPS),
     lambda o: tls.OneCycleLR(o, 0.1, total_steps=STEPS, div_factor=25.0, cycle_momentum=False), 0.004, None),
    ("OneCycleThreeLinear", lambda o: S.OneCycleLR(o, 0.004, 0.1, total_steps=STEPS, pct_start=0.25,
                                                   three_phase=True, anneal_strategy="linear"),
     lambda o: tls.OneCycleLR(o, 0.1, total_steps=STEPS, pct_start=0.25, div_factor=25.0, three_phase=True,
                              anneal_strategy="linear", cycle_momentum=False), 0.004, None),
    ("Sequential", lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.001, 0.1, 100), S.CosineAnnealingLR(o, 0.1, 900)],
                                            milestones=[100]),
     lambda o: tls.SequentialLR(o, [tls.LinearLR(o, 0.01, 1.0, 100), tls.CosineAnnealingLR(o, 900)], [100]),
     0.1, None),
    ("Chained", lambda o: S.ChainedLR([S.StepLR(o, 0.1, 100, 0.5), S.ExponentialLR(o, 1.0, 1, 0.999)]),
     lambda o: tls.ChainedScheduler([tls.StepLR(o, 100, 0.5), tls.ExponentialLR(o, 0.999)]), 0.1, None),
]


@pytest.mark.parametrize("name,ours,twin,base,hand", TABLE, ids=[r[0] for r in TABLE])
def test_values_over_1000_steps(name, ours, twin, base, hand):
    sched = ours(_opt())
    got = _ours_values(sched)
    want = _torch_values(twin, base) if twin is not None else [hand(t) for t in range(STEPS)]
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64),
                               rtol=1e-9, atol=1e-12)
    assert len(set(got)) > 1 or name == "Constant"


@pytest.mark.parametrize("name,ours,twin,base,hand", TABLE, ids=[r[0] for r in TABLE])
def test_closed_form_is_a_tensor_function_of_the_step(name, ours, twin, base, hand):
    """Evaluated once on arange(1000) (broadcast), the closed form gives the stepped values."""
    sched = ours(_opt())
    stepped = torch.tensor(_ours_values(sched), dtype=torch.float64)
    with _at_step(sched, torch.arange(STEPS)):
        vector = sched._get_closed_form_lr()
    torch.testing.assert_close(vector.expand(STEPS).to(torch.float64), stepped, rtol=1e-12, atol=1e-15)


def test_lr_is_set_at_construction_in_place():
    opt = _opt(0.5)
    lr = opt.param_groups[0]["lr"]
    sched = ls.LinearLR(opt, 0.0, 1.0, total_iters=10)
    assert opt.param_groups[0]["lr"] is lr and float(lr) == 0.0 and int(sched.last_epoch) == 0
    sched.step()
    assert opt.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.1)
    assert [float(v) for v in sched.get_last_lr()] == [pytest.approx(0.1)]


def test_state_dict_is_the_step_and_resumes():
    sched = ls.CosineDecayLR(_opt(), 0.1, 0.0, total_iters=100)
    for _ in range(37):
        sched.step()
    state = sched.state_dict()
    assert list(state) == ["last_epoch"] and int(state["last_epoch"]) == 37
    opt2 = _opt()
    resumed = ls.CosineDecayLR(opt2, 0.1, 0.0, total_iters=100)
    step_tensor = resumed.last_epoch
    resumed.load_state_dict(state)
    assert resumed.last_epoch is step_tensor
    assert float(opt2.param_groups[0]["lr"]) == float(sched.optimizer.param_groups[0]["lr"])
    resumed.load_state_dict({"last_epoch": 5, "base_lrs": [0.1]})  # a torch-style dict: only the step is read
    assert int(resumed.last_epoch) == 5


def test_custom_scheduler_with_either_closed_form_name():
    class Halving(ls.LRScheduler):
        def __init__(self, optimizer):
            super().__init__(optimizer, total_iters=None)

        def _get_closed_form(self):  # the vendor's newer name
            return 0.5 ** self._step_float()

    opt = _opt()
    sched = Halving(opt)
    sched.step()
    sched.step()
    assert float(opt.param_groups[0]["lr"]) == 0.25

    class Broken(ls.LRScheduler):
        pass

    with pytest.raises(TypeError, match="_get_closed_form_lr"):
        Broken(opt)


def test_bad_scheduler_arguments():
    opt = _opt()
    with pytest.raises(ValueError, match=r"Invalid T_mult: 1.5"):
        ls.CosineAnnealingWarmRestarts(opt, 0.1, T_0=10, T_mult=1.5)
    with pytest.raises(ValueError, match=r"Invalid mode: 'sine'"):
        ls.CyclicLR(opt, 0.1, 1.0, mode="sine")
    with pytest.raises(ValueError, match=r"2 schedulers need 1 milestones, got 2"):
        ls.SequentialLR(opt, [ls.ConstantLR(opt, 0.1), ls.ConstantLR(opt, 0.2)], [1, 2])
    with pytest.raises(ValueError, match=r"schedulers\[1\] belongs to another optimizer"):
        ls.SequentialLR(opt, [ls.ConstantLR(opt, 0.1), ls.ConstantLR(_opt(), 0.2)], [1])
    with pytest.raises(ValueError, match=r"one more than the milestones"):
        ls.PiecewiseConstantLR(opt, [0.1], [10])
    with pytest.raises(ValueError, match=r"Invalid param_group_tags: \['a', 'a'\]"):
        ls.ConstantLR(opt, 0.1, param_group_tags=["a", "a"])
    with pytest.raises(ValueError, match=r"param_group_tags \['decay'\] match no param group"):
        ls.ConstantLR(opt, 0.1, param_group_tags="decay")


def test_lambda_lr_default_is_the_vendors_rule():
    """Without lr_lambda, the vendor's default set_value_lambda: product of initial * f(t) over
    [t / 30, 0.95^t] (its golden values agree, tests/optim/test_vendor_oracle.py)."""
    sched = ls.LambdaLR(_opt(), 0.1)
    got = _ours_values(sched, 50)
    assert got == pytest.approx([0.1 * t / 30 * 0.1 * 0.95**t for t in range(50)], rel=1e-12, abs=1e-15)
    with_fn = ls.LambdaLR(_opt(), 0.1, lr_lambda=lambda t: 0.5**t)
    assert _ours_values(with_fn, 4) == [0.1, 0.05, 0.025, 0.0125]
