"""The property the CSX engine relies on: a full training step with every optimizer and every scheduler
traces under make_fx (fake mode) without a data-dependent error, a second trace gives the same graph
code (no recompile), and replaying the one graph for many steps, with the lr changing every step,
gives the eager result (compared bit-exactly: the graph runs the same aten ops)."""

from __future__ import annotations

import copy

import pytest
import torch

import cs_run.optim as csoptim
from tests.optim.helpers import SmallNet, batches, train
from tests.optim.optim_table import CASES, case_id
from tests.optim.test_schedulers import TABLE
from tests.optim.tracing import replay, trace_train_step

REPLAYS = 6


def _check(make_opt, make_sched, steps=REPLAYS):
    model = SmallNet(torch.float32)
    opt = make_opt(model.parameters())
    sched = make_sched(opt)
    eager_model = copy.deepcopy(model)
    eager_opt = make_opt(eager_model.parameters())
    eager_sched = make_sched(eager_opt)
    data = batches(steps, torch.float32)

    gm = trace_train_step(model, opt, sched, data[0])
    assert trace_train_step(model, opt, sched, data[0]).code == gm.code, "a second trace changed the graph"
    assert int(sched.last_epoch) == 0 and torch.equal(model.w1, eager_model.w1), "the trace mutated real state"

    lrs, eager_lrs = [], []
    for batch in data:
        replay(gm, model, opt, sched, batch)
        lrs.append(float(opt.param_groups[0]["lr"]))
    for batch in data:
        train(eager_model, eager_opt, [batch], eager_sched)
        eager_lrs.append(float(eager_opt.param_groups[0]["lr"]))
    assert lrs == eager_lrs
    for (name, p), q in zip(model.named_parameters(), eager_model.parameters()):
        assert torch.equal(p, q), name
    for s, es in zip(opt.state.values(), eager_opt.state.values()):
        for key in s:
            torch.testing.assert_close(s[key], es[key], rtol=0, atol=0)
    return lrs


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_optimizer_traces_once_and_replays(case):
    row, variant = case
    _check(lambda ps: row.cls(ps, **variant),
           lambda o: csoptim.lr_scheduler.LinearLR(o, 0.02, 0.002, total_iters=REPLAYS))


@pytest.mark.parametrize("name,ours,twin,base,hand", TABLE, ids=[r[0] for r in TABLE])
def test_every_scheduler_traces_once_and_replays(name, ours, twin, base, hand):
    lrs = _check(lambda ps: csoptim.SGD(ps, lr=0.0, momentum=0.9), ours, steps=12)
    assert len(set(lrs)) > 1 or name in ("Constant", "ExponentialStaircase", "Step", "MultiStep",
                                           "PiecewiseConstant", "InverseSquareRootDecay",
                                           "InverseExponentialTimeDecayStair", "Chained")


def test_one_graph_serves_a_whole_warmup_and_decay():
    """A 60-step warmup + cosine schedule: one trace, 60 replays, every lr as eager computes it."""
    def sched(o):
        return csoptim.configure_lr_scheduler(o, [
            {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 0.05, "total_iters": 10},
            {"scheduler": "CosineDecay", "initial_learning_rate": 0.05, "end_learning_rate": 0.0, "total_iters": 50}])

    lrs = _check(lambda ps: csoptim.AdamW(ps, weight_decay=0.01), sched, steps=60)
    assert len(set(lrs)) > 50
