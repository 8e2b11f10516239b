"""The Model Zoo 2.x schedule form: ``{SequentialLR: {schedulers: [{LinearLR: {...}}, ...]}}`` with the
milestones derived as the vendor derives them (the running sum of the sub-schedules' total_iters), nested
ScalePerParamLR, and errors naming the nested key."""

from __future__ import annotations

import math

import pytest
import torch

import cs_run.optim as csoptim
from cs_run.errors import ParamsError
from cs_run.optim import lr_scheduler as ls


def _optimizer(groups=None):
    return csoptim.SGD(groups or [torch.nn.Parameter(torch.zeros(2))], lr=0.0)


def _lrs(scheduler, steps):
    out = []
    for _ in range(steps):
        out.append([float(g["lr"]) for g in scheduler.optimizer.param_groups])
        scheduler.step()
    return out


def test_sequential_milestones_are_the_running_sum_of_total_iters():
    # Cerebras-GPT's form: warm up linearly, then decay; a third phase to see a second milestone.
    learning_rate = {"SequentialLR": {"schedulers": [
        {"LinearLR": {"initial_learning_rate": 0.0, "end_learning_rate": 0.006, "total_iters": 4}},
        {"CosineDecayLR": {"initial_learning_rate": 0.006, "end_learning_rate": 0.0006, "total_iters": 6}},
        {"ConstantLR": {"learning_rate": 0.0006}}]}}
    scheduler = csoptim.configure_lr_scheduler(_optimizer(), learning_rate)
    assert isinstance(scheduler, ls.SequentialLR) and scheduler._milestones == [4, 10]

    def by_hand(t):  # the three phases, each at its own shifted step
        if t < 4:
            return 0.006 * t / 4
        if t < 10:
            return 0.0006 + (0.006 - 0.0006) * 0.5 * (1 + math.cos(math.pi * (t - 4) / 6))
        return 0.0006

    got = [lrs[0] for lrs in _lrs(scheduler, 14)]
    # float32 lr tensors: 1e-6 relative covers their rounding of values near 6e-3
    assert got == pytest.approx([by_hand(t) for t in range(14)], rel=1e-6, abs=1e-9)


def test_milestones_equal_torch_sequential_lr():
    """Against torch's SequentialLR, given the milestones our rule derives ([3, 8]), over 12 steps."""
    param = torch.nn.Parameter(torch.zeros(2))
    ours = csoptim.configure_lr_scheduler(_optimizer([param]), {"SequentialLR": {"schedulers": [
        {"ConstantLR": {"learning_rate": 0.1, "total_iters": 3}},
        {"ExponentialLR": {"initial_learning_rate": 0.1, "decay_rate": 0.5, "total_iters": 5}},
        {"ConstantLR": {"learning_rate": 0.01}}]}})
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    theirs = torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0, total_iters=3),
        torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.5 ** (t / 5)),
        torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.1)], milestones=[3, 8])
    expected = []
    for _ in range(12):
        expected.append(opt.param_groups[0]["lr"])
        opt.step()  # no gradients: nothing moves; torch wants it before its scheduler's step
        theirs.step()
    assert [lrs[0] for lrs in _lrs(ours, 12)] == pytest.approx(expected, rel=1e-6)  # float32 lr tensors


def test_given_milestones_must_agree():
    entry = {"SequentialLR": {"milestones": [5], "schedulers": [
        {"ConstantLR": {"learning_rate": 0.1, "total_iters": 4}}, {"ConstantLR": {"learning_rate": 0.2}}]}}
    with pytest.raises(ParamsError, match=r"^learning_rate.SequentialLR.milestones: \[5\] but the schedules' "
                                          r"total_iters give \[4\]"):
        csoptim.configure_lr_scheduler(_optimizer(), entry)
    entry["SequentialLR"]["milestones"] = [4]
    assert csoptim.configure_lr_scheduler(_optimizer(), entry)._milestones == [4]


def test_scale_per_param_wraps_a_nested_sequence():
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "adjust_learning_rate": 1.0},
              {"params": [torch.nn.Parameter(torch.zeros(1))], "adjust_learning_rate": 0.25}]
    learning_rate = {"ScalePerParamLR": {"scheduler": {"SequentialLR": {"schedulers": [
        {"LinearLR": {"initial_learning_rate": 0.0, "end_learning_rate": 0.02, "total_iters": 2}},
        {"LinearLR": {"initial_learning_rate": 0.02, "end_learning_rate": 0.0, "total_iters": 4}}]}}}}
    scheduler = csoptim.configure_lr_scheduler(_optimizer(groups), learning_rate)
    assert isinstance(scheduler, ls.ScalePerParamLR)
    base = [0.0, 0.01, 0.02, 0.015, 0.01, 0.005, 0.0]  # by hand: up over 2 steps, down over 4
    assert sum(_lrs(scheduler, 7), []) == pytest.approx([v for b in base for v in (b, b * 0.25)], abs=1e-9)


def test_groups_with_adjust_learning_rate_get_scaled_without_a_wrapper():
    """The Model Zoo 2.10 trainer wraps any LR schedule in ScalePerParamLR when a group has a scale."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "adjust_learning_rate": 0.5},
              {"params": [torch.nn.Parameter(torch.zeros(1))], "adjust_learning_rate": 1.0}]
    scheduler = csoptim.configure_lr_scheduler(_optimizer(groups), 0.3)
    assert isinstance(scheduler, ls.ScalePerParamLR)
    assert sum(_lrs(scheduler, 2), []) == pytest.approx([0.15, 0.3] * 2)


@pytest.mark.parametrize("learning_rate,regex", [
    ({"SequentialLR": {"schedulers": [{"ConstantLR": {"learning_rate": 0.1}}, {"ConstantLR": {"learning_rate": 0.2}}]}},
     r"^learning_rate.SequentialLR.schedulers\[0\].ConstantLR.total_iters: missing; every scheduler but the last"),
    ({"SequentialLR": {"schedulers": [{"LinearLR": {"initial_learning_rate": 0.1, "total_iters": 2}},
                                      {"ConstantLR": {"learning_rate": 0.2}}]}},
     r"^learning_rate.SequentialLR.schedulers\[0\].LinearLR.end_learning_rate: missing \(required by LinearLR"),
    ({"SequentialLR": {"schedulers": [{"ConstantLR": {"learning_rate": 0.1, "total_iters": 2}},
                                      {"Cosine": {"initial_learning_rate": 0.2}}]}},
     r"^learning_rate.SequentialLR.schedulers\[1\].Cosine: unknown 'Cosine'"),
    ({"SequentialLR": {"schedulers": []}}, r"^learning_rate.SequentialLR.schedulers: empty"),
    ({"ScalePerParamLR": {"scheduler": {"ConstantLR": {"learning_rate": 0.1, "warmup": 2}}}},
     r"^learning_rate.ScalePerParamLR.scheduler.ConstantLR.warmup: unknown key for ConstantLR"),
])
def test_nested_errors_name_the_nested_key(learning_rate, regex):
    with pytest.raises(ParamsError, match=regex):
        csoptim.configure_lr_scheduler(_optimizer(), learning_rate)
