"""Step closures: materialized values, run after the step; checkpoint closures only on checkpoint steps."""

from __future__ import annotations

import pytest
import torch

import cs_run as cstorch
from cs_run.backend import _reset_for_tests
from tests.engine.helpers import TraceSafeSGD


def run(backend_type: str) -> dict:
    cstorch.backend(backend_type)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = TraceSafeSGD(model.parameters(), lr=0.5, momentum=0.0)
    events: list = []

    @cstorch.step_closure
    def before_update(weight):
        events.append(("closure", weight))

    @cstorch.trace
    def step(x):
        loss = model(x).pow(2).sum()
        loss.backward()
        before_update(model.weight)  # called before the optimizer mutates the weight in place
        opt.step()
        opt.zero_grad()
        events.append(("body-end", None))
        return loss

    for i in range(3):
        step(torch.full((1, 3), float(i + 1)))
        events.append(("returned", model.weight.detach().clone()))
    return {"events": events, "weight": model.weight.detach().clone()}


def test_closure_sees_value_at_call_and_runs_after_the_step():
    csx = run("CSX")
    with _reset_for_tests():
        cpu = run("CPU")
    for res in (csx, cpu):
        closures = [e[1] for e in res["events"] if e[0] == "closure"]
        returned = [e[1] for e in res["events"] if e[0] == "returned"]
        assert len(closures) == 3
        # materialized before the in-place update: the weight the step started from, not the updated one
        assert not torch.equal(closures[1], returned[1])
        assert torch.equal(closures[1], returned[0])
    assert all(torch.equal(a, b) for a, b in zip(
        [e[1] for e in csx["events"] if e[0] == "closure"], [e[1] for e in cpu["events"] if e[0] == "closure"]))
    # CPU: the closure ran after the body finished, not where it was called
    kinds = [e[0] for e in cpu["events"]]
    assert kinds[:3] == ["body-end", "closure", "returned"]
    # CSX: the body ran once (at the trace), closures still run once per step, after it
    assert [e[0] for e in csx["events"]].count("body-end") == 1
    assert [e[0] for e in csx["events"]].count("closure") == 3


def test_closure_outside_step_does_not_see_later_updates():
    cstorch.backend("CSX")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = TraceSafeSGD(model.parameters(), lr=0.5, momentum=0.0)
    seen = []

    @cstorch.trace
    def step(x):
        loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    @cstorch.step_closure
    def record(loss):
        seen.append(loss)

    for i in range(3):
        record(step(torch.full((1, 3), float(i))))
    assert len({float(s) for s in seen}) == 3  # one distinct value per step


@pytest.mark.parametrize("backend_type", ["CSX", "CPU"])
@pytest.mark.parametrize("num_steps,checkpoint_steps,expected", [(7, 3, [3, 6, 7]), (6, 3, [3, 6]), (4, 0, [4])])
def test_checkpoint_closure_runs_on_checkpoint_and_final_steps(backend_type, num_steps, checkpoint_steps, expected):
    cstorch.backend(backend_type)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    saved, inside = [], []
    data = torch.utils.data.TensorDataset(torch.randn(8, 3))
    loader = cstorch.utils.data.DataLoader(lambda: torch.utils.data.DataLoader(data, batch_size=2))
    executor = cstorch.utils.data.DataExecutor(loader, num_steps=num_steps, checkpoint_steps=checkpoint_steps)

    @cstorch.checkpoint_closure
    def save(step):
        saved.append(step)

    @cstorch.checkpoint_closure
    def save_inside():
        inside.append(executor.user_iteration)

    @cstorch.trace
    def step(x):
        save_inside()  # a checkpoint closure called in the step is gated per replay
        return model(x).sum()

    for i, (x,) in enumerate(executor, start=1):
        step(x)
        save(i)
    assert saved == expected and inside == expected


def test_checkpoint_closure_without_executor_always_runs():
    calls = []
    cstorch.checkpoint_closure(lambda: calls.append(1))()
    assert calls == [1]
