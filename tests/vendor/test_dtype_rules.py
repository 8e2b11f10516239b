"""The CSX trace checks dtypes as eager torch does (validate-only fails where eager would, at the user's line),
and runs the vendor's CSX data: half images with mixed precision, int32 class labels."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import cs_run as cstorch
from cs_run.engine import validate_step
from cs_run.errors import ComplianceError


def _line_of(fn, marker: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if marker in line)


def _forward(model, x):
    return model(x)  # MARK


@pytest.mark.parametrize("op", [
    lambda w, x: F.linear(x, w),
    lambda w, x: x @ w.t(),
    lambda w, x: torch.matmul(x, w.t()),
    lambda w, x: torch.mm(x, w.t()),
    lambda w, x: torch.addmm(torch.zeros(4, 3), x, w.t()),
])
def test_mixed_float_matmul_fails_at_trace_like_eager(op):
    w = torch.randn(3, 5)
    x = torch.randn(4, 5, dtype=torch.float16)
    with pytest.raises(RuntimeError):  # the eager reference rejects it
        op(w, x)
    with pytest.raises(ComplianceError, match=r"must have the same dtype, but got .*(Half|Float).*(Float|Half)"):
        validate_step(lambda inp: op(w, inp).sum(), x)


def test_the_error_names_the_users_line():
    model = torch.nn.Linear(5, 3)
    with pytest.raises(ComplianceError, match=rf"{__file__}:{_line_of(_forward, 'MARK')}: linear"):
        validate_step(lambda inp: _forward(model, inp).sum(), torch.randn(4, 5, dtype=torch.float16))


def test_under_autocast_half_inputs_trace():
    model = torch.nn.Linear(5, 3)

    def step(inp):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(inp).float().sum()

    validate_step(step, torch.randn(4, 5, dtype=torch.float16))


@pytest.mark.parametrize("loss_fn", [F.nll_loss, F.cross_entropy])
def test_int32_class_labels_run_on_csx_as_eager_with_int64(loss_fn):
    from cs_run.backend import _reset_for_tests

    torch.manual_seed(0)
    x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))
    with pytest.raises(RuntimeError):  # eager torch rejects int32 targets
        loss_fn(torch.randn(8, 3).log_softmax(1), y.int())
    with _reset_for_tests():
        cstorch.backend("CSX")
        model = torch.nn.Linear(5, 3)
        ref = torch.nn.Linear(5, 3)
        ref.load_state_dict(model.state_dict())
        compiled = cstorch.compile(model)

        @cstorch.trace
        def step(inp, target):
            return loss_fn(compiled(inp).log_softmax(1), target)

        got = step(x, y.int())
    assert torch.equal(got.detach().cpu(), loss_fn(ref(x).log_softmax(1), y).detach())


def test_other_integer_label_types_fail_like_eager():
    with pytest.raises(ComplianceError, match="expected target dtype to be Long or Byte, but got Short"):
        validate_step(lambda inp, t: F.nll_loss(inp.log_softmax(1), t), torch.randn(4, 3),
                      torch.zeros(4, dtype=torch.int16))
