"""configure_from_params: a Model Zoo ``optimizer:`` block (every key the vendor's own params files use) maps
onto cs_run.optim exactly as torch.optim built by hand from the same numbers."""

from __future__ import annotations

import pytest
import torch
import yaml

import cs_run.optim as csoptim
from cs_run.errors import ParamsError
from tests.optim.helpers import SmallNet, batches

# The optimizer-block keys of the Model Zoo's params files (R_1.7 .. Release_2.10, all models), by where they go.
BLOCK_KEYS = {
    "optimizer_type": "class", "learning_rate": "schedule",
    "weight_decay": "kwargs", "weight_decay_rate": "kwargs", "eps": "kwargs", "epsilon": "kwargs",
    "betas": "kwargs", "beta1": "kwargs", "beta2": "kwargs", "correct_bias": "kwargs", "momentum": "kwargs",
    "max_gradient_norm": "step", "loss_scaling_factor": "step", "log_summaries": "step",
    "max_loss_scale": "step", "initial_loss_scale": "step", "steps_per_increase": "step",
    "adjust_learning_rate": "param_groups", "params": "param_groups",
    "disable_lr_steps_reset": "recorded", "ws_summary": "recorded",
}


@pytest.mark.parametrize("key,where", sorted(BLOCK_KEYS.items()))
def test_every_vendor_block_key_has_a_place(key, where):
    parts = csoptim.split_optimizer_block({"optimizer_type": "AdamW", "learning_rate": 0.1, key: 1})
    if where == "class":
        assert parts.optimizer_type == 1
    elif where == "schedule":
        assert parts.learning_rate == 1
    else:
        assert getattr(parts, where) == {key: 1}


def _steps(opt, sched, model, n=6):
    losses = []
    for x, y in batches(n):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses


def test_gpt2_style_block_equals_torch_adamw_with_the_same_schedule():
    block = yaml.safe_load("""
    optimizer_type: AdamW
    beta1: 0.9
    beta2: 0.95
    epsilon: 1.0e-8
    weight_decay_rate: 0.011
    correct_bias: True
    max_gradient_norm: 1.0
    loss_scaling_factor: dynamic
    log_summaries: True
    disable_lr_steps_reset: True
    learning_rate:
      - scheduler: Linear
        initial_learning_rate: 0.0
        end_learning_rate: 0.01
        total_iters: 3
      - scheduler: Linear
        initial_learning_rate: 0.01
        end_learning_rate: 0.001
        total_iters: 10
    """)
    torch.manual_seed(0)
    model = SmallNet()
    ref = SmallNet()
    ref.load_state_dict(model.state_dict())
    opt, sched, step = csoptim.configure_from_params(block, model)
    assert step == {"max_gradient_norm": 1.0, "loss_scaling_factor": "dynamic", "log_summaries": True}
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.0, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.011)
    lrs = [0.0, 0.01 / 3, 0.02 / 3, 0.01, 0.01 - 0.009 / 10, 0.01 - 0.009 * 2 / 10]
    got = []
    for i, (x, y) in enumerate(batches(6)):
        got.append(float(opt.param_groups[0]["lr"]))
        for g in ref_opt.param_groups:
            g["lr"] = lrs[i]
        for o, m in ((opt, model), (ref_opt, ref)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
        sched.step()
    assert got == pytest.approx(lrs, abs=1e-9)
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_fc_mnist_block_equals_torch_sgd():
    block = {"optimizer_type": "SGD", "learning_rate": 0.001, "momentum": 0.9, "loss_scaling_factor": 1.0}
    torch.manual_seed(1)
    model, ref = SmallNet(), SmallNet()
    ref.load_state_dict(model.state_dict())
    opt, sched, step = csoptim.configure_from_params(block, model)
    assert step == {"loss_scaling_factor": 1.0}
    a = _steps(opt, sched, model)
    b = _steps(torch.optim.SGD(ref.parameters(), lr=0.001, momentum=0.9), None, ref)
    assert a == pytest.approx(b, rel=1e-6)


@pytest.mark.parametrize("block,regex", [
    ({"learning_rate": 0.1}, r"optimizer.optimizer_type: missing"),
    ({"optimizer_type": "SGD", "learning_rate": 0.1, "momentun": 0.9}, r"optimizer.momentun: unknown key for SGD.*did you mean 'momentum'"),
    ({"optimizer_type": "AdamW", "learning_rate": 0.1, "epsilon": 1e-8, "eps": 1e-6},
     r"'eps' is given twice with different values"),
    ("SGD", r"optimizer: expected a mapping, got str"),
])
def test_bad_blocks_name_the_key(block, regex):
    with pytest.raises(ParamsError, match=regex):
        csoptim.configure_from_params(block, SmallNet())
