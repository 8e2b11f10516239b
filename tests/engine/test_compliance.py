"""Reading a tensor's value inside a traced CSX step fails at trace time with the user's file:line."""

from __future__ import annotations

import inspect

import pytest
import torch

import cs_run as cstorch
from cs_run.errors import ComplianceError
from tests.engine.helpers import MLP


def _line_of(fn, marker: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if marker in line)


def _item(loss):
    return loss.item()  # MARK


def _print(loss):
    print(loss)  # MARK


def _if(loss):
    if loss > 0:  # MARK
        return loss * 2
    return loss


def _float(loss):
    return float(loss)  # MARK


def _bool(loss):
    return bool(loss)  # MARK


@pytest.mark.parametrize("read", [_item, _print, _if, _float, _bool])
def test_value_read_in_traced_step_raises_with_user_line(read):
    cstorch.backend("CSX")
    torch.manual_seed(0)
    model = MLP(depth=1, hidden=8)
    before = [p.clone() for p in model.parameters()]

    @cstorch.trace
    def step(x):
        loss = model(x).sum()
        read(loss)
        return loss

    with pytest.raises(ComplianceError) as info:
        step(torch.randn(4, 16))
    msg = str(info.value)
    assert f"{__file__}:{_line_of(read, 'MARK')}" in msg
    assert "step closure" in msg
    # state is restored: parameters are the real tensors again, unchanged
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert all(type(p) is torch.nn.Parameter for p in model.parameters())


@pytest.mark.parametrize("read", [_item, _print, _if, _float, _bool])
def test_same_reads_inside_a_step_closure_work(read, capsys):
    cstorch.backend("CSX")
    torch.manual_seed(0)
    model = MLP(depth=1, hidden=8)
    results = []

    @cstorch.step_closure
    def closure(loss):
        results.append(read(loss))

    @cstorch.trace
    def step(x):
        loss = model(x).sum()
        closure(loss)
        return loss

    losses = [step(torch.randn(4, 16)) for _ in range(3)]
    assert len(results) == 3
    if read is _item or read is _float:
        assert results == [loss.item() for loss in losses]


def test_validate_step_reports_compliance_error_without_running():
    from cs_run.engine import validate_step

    torch.manual_seed(0)
    model = MLP(depth=1, hidden=8)

    def step(x):
        return _item(model(x).sum())

    with pytest.raises(ComplianceError, match=rf"{__file__}:{_line_of(_item, 'MARK')}"):
        validate_step(step, torch.randn(4, 16))


def test_lazy_optimizer_state_is_a_compliance_error():
    cstorch.backend("CSX")
    torch.manual_seed(0)
    model = MLP(depth=1, hidden=8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # creates state lazily inside step()

    @cstorch.trace
    def step(x):
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    with pytest.raises(ComplianceError, match=r"test_compliance.py:\d+: .*cs_run\.optim"):
        step(torch.randn(4, 16))
    assert len(opt.state) == 0  # nothing leaked from the trace


class LazySGD(torch.optim.Optimizer):
    """Creates its momentum buffer on the first step (torch.optim style): not replayable."""

    def __init__(self, params):
        super().__init__(params, dict(lr=0.1))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if "buf" not in state:
                    state["buf"] = torch.zeros_like(p)
                state["buf"].add_(p.grad)
                p.sub_(state["buf"], alpha=group["lr"])


def test_optimizer_creating_state_in_step_is_a_compliance_error():
    cstorch.backend("CSX")
    torch.manual_seed(0)
    model = MLP(depth=1, hidden=8)
    opt = LazySGD(model.parameters())

    @cstorch.trace
    def step(x):
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss

    with pytest.raises(ComplianceError, match=r"test_compliance.py:\d+: .*preinitialize"):
        step(torch.randn(4, 16))
    assert len(opt.state) == 0
