"""Adam/AdamW at learning rate 0 (a warmup that starts at 0) leave parameters unchanged and finite."""

from __future__ import annotations

import pytest
import torch

import cs_run.optim as optim


@pytest.mark.parametrize("cls,amsgrad", [(optim.AdamW, False), (optim.Adam, False), (optim.AdamW, True)])
def test_zero_learning_rate_is_a_no_op_even_where_the_gradient_is_zero(cls, amsgrad):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(6, 4))
    before = p.detach().clone()
    opt = cls([p], lr=0.0, weight_decay=0.01, amsgrad=amsgrad)
    grad = torch.randn(6, 4)
    grad[2:4] = 0.0  # rows an embedding lookup did not touch: v stays 0
    for _ in range(3):
        p.grad = grad.clone()
        opt.step()
    torch.testing.assert_close(p.detach(), before, rtol=0, atol=1e-20)
    assert torch.isfinite(p).all() and all(torch.isfinite(v).all() for v in opt.state[p].values()
                                           if isinstance(v, torch.Tensor))
