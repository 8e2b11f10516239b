"""configure_optimizer / configure_lr_scheduler: names, Model Zoo spellings, YAML == code, and errors
that name the entry and key."""

from __future__ import annotations

import pytest
import torch
import yaml

import cs_run
import cs_run.optim as csoptim
from cs_run.errors import ParamsError
from cs_run.optim import lr_scheduler as ls
from tests.optim.helpers import SmallNet, batches, train


def _lrs(sched, n=120):
    out = []
    for _ in range(n):
        out.append(float(sched.optimizer.param_groups[0]["lr"]))
        sched.step()
    return out


@pytest.mark.parametrize("name", ["adamw", "AdamW", "ADAMW", "sgd", "RMSProp", "lamb", "Adafactor"])
def test_names_are_case_insensitive(name):
    opt = csoptim.configure_optimizer(name, SmallNet().parameters())
    assert type(opt).__name__.lower() == name.lower()


def test_model_zoo_aliases_and_yaml_strings():
    params = yaml.safe_load("""
    optimizer_type: AdamW
    learning_rate: 1e-3      # a YAML string: coerced
    weight_decay_rate: 0.01
    beta1: 0.8
    eps: 1e-8
    correct_bias: false
    """)
    opt = csoptim.configure_optimizer(params.pop("optimizer_type"), SmallNet().parameters(), **params)
    assert opt.defaults == {"lr": 1e-3, "betas": (0.8, 0.999), "eps": 1e-8, "weight_decay": 0.01, "amsgrad": False,
                            "l2_regularization_rate": 0.0, "maximize": False, "correct_bias": False}
    rprop = csoptim.configure_optimizer("rprop", SmallNet().parameters(), eta1=0.4, eta2=1.3, step_size_max=1.0)
    assert rprop.defaults["etas"] == (0.4, 1.3) and rprop.defaults["step_sizes"] == (1e-6, 1.0)
    fact = csoptim.configure_optimizer("adafactor", SmallNet().parameters(), beta1=0.9)  # its own beta1
    assert fact.defaults["beta1"] == 0.9


def test_optimizer_without_lr_is_scheduled_at_construction():
    opt = csoptim.configure_optimizer("SGD", SmallNet().parameters(), momentum=0.9)
    csoptim.configure_lr_scheduler(opt, 0.25)
    assert float(opt.param_groups[0]["lr"]) == 0.25


@pytest.mark.parametrize("kind,kwargs,regex", [
    ("Adamm", {}, r"optimizer.optimizer_type: unknown 'Adamm'; expected one of .*Adam.*AdamW.*\(did you mean 'Adam'\?\)"),
    ("Adam", {"betaz": (0.9, 0.9)}, (r"optimizer.betaz: unknown key for Adam; expected one of lr, betas, .* "
                                    r"\(did you mean 'betas'\?\)")),
    ("Adam", {"lr": 0.1, "learning_rate": 0.2}, r"'lr' is given twice"),
    ("SGD", {"momentum": -1.0}, r"optimizer: SGD: Invalid momentum value: -1.0"),
])
def test_optimizer_errors(kind, kwargs, regex):
    with pytest.raises(ParamsError, match=regex) as info:
        csoptim.configure_optimizer(kind, SmallNet().parameters(), **kwargs)
    assert info.value.exit_code == 2


# The vendor's custom optimizer guide, written as its text describes: a subclass of cstorch.optim.Optimizer with params, defaults,
# enable_global_step, preinitialize (cstorch creation ops), step (torch ops only), state_names_to_sparsify.
class MySignOptimizer(cs_run.optim.Optimizer):
    """Sign-SGD with momentum, only torch ops in step; compliant per the vendor's custom optimizer guide."""

    def __init__(self, params, lr=0.01, momentum=0.9):
        defaults = {"lr": lr, "momentum": momentum}
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["momentum_buffer"] = cs_run.zeros_like(p)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:  # static structure: fixed at trace time
                    continue
                self.increment_global_step(p)
                buf = self.state[p]["momentum_buffer"]
                buf.mul_(group["momentum"]).add_(p.grad)
                p.sub_(torch.sign(buf) * group["lr"])

    def state_names_to_sparsify(self):
        return ["momentum_buffer"]


def test_custom_optimizer_from_a_params_file(tmp_path):
    """``optimizer_type: MySignOptimizer`` in a params file builds the user's class (the vendor's custom optimizer
    guide). Its name is its own: tests/conftest.py has a MyOptimizer too, and a second import of conftest
    (``from conftest import`` in tests/checkpoint) makes that one the latest definition on a worker that ran it."""
    path = tmp_path / "params.yaml"
    path.write_text("optimizer:\n  optimizer_type: mysignoptimizer\n  momentum: 0.5\n  learning_rate: 0.1\n")
    block = yaml.safe_load(path.read_text())["optimizer"]
    learning_rate = block.pop("learning_rate")
    model = SmallNet()
    opt = csoptim.configure_optimizer(block.pop("optimizer_type"), model.parameters(), **block)
    sched = csoptim.configure_lr_scheduler(opt, learning_rate)
    assert type(opt) is MySignOptimizer and opt.defaults["momentum"] == 0.5
    before = model.w1.detach().clone()
    train(model, opt, batches(3), sched)
    assert float(opt.state[model.w1]["step"]) == 3
    assert torch.allclose((before - model.w1).abs().max(), torch.tensor(0.3, dtype=torch.float64))


def test_yaml_schedules_equal_code():
    yaml_text = """
    scalar: 0.01
    single: {scheduler: CosineDecay, initial_learning_rate: 0.1, end_learning_rate: 0.001, decay_steps: 100}
    sequential:
      - {scheduler: LinearLR, initial_learning_rate: 0.0, end_learning_rate: 0.1, total_iters: 20}
      - {scheduler: Exponential, initial_learning_rate: 0.1, decay_steps: 10, decay_rate: 0.8, staircase: true}
      - {scheduler: StepLR, initial_learning_rate: 0.02, step_size: 5, gamma: 0.5, total_iters: 20}
      - {scheduler: constant, learning_rate: 0.005}
    chained:
      - {scheduler: StepLR, initial_learning_rate: 0.1, step_size: 25, gamma: 0.5, main_scheduler: ChainedLR}
      - {scheduler: MultiplicativeLR, initial_learning_rate: 1.0, coefficient: 0.99}
    """
    cfg = yaml.safe_load(yaml_text)

    def opt():
        return csoptim.SGD(SmallNet().parameters(), lr=0.0)

    built = {k: _lrs(csoptim.configure_lr_scheduler(opt(), v)) for k, v in cfg.items()}
    o = opt()
    code = {
        "scalar": _lrs(ls.ConstantLR(opt(), 0.01)),
        "single": _lrs(ls.CosineDecayLR(opt(), 0.1, 0.001, 100)),
        "sequential": _lrs(ls.SequentialLR(o, [ls.LinearLR(o, 0.0, 0.1, 20), ls.ExponentialLR(o, 0.1, 10, 0.8, True),
                                               ls.StepLR(o, 0.02, 5, 0.5), ls.ConstantLR(o, 0.005)],
                                     milestones=[20, 30, 50])),
    }
    o = opt()
    code["chained"] = _lrs(ls.ChainedLR([ls.StepLR(o, 0.1, 25, 0.5), ls.MultiplicativeLR(o, 1.0, 0.99)]))
    assert built == code
    assert built["sequential"][19] < built["sequential"][20] == 0.1 and built["sequential"][30] == 0.02
    assert built["sequential"][50] == 0.005


@pytest.mark.parametrize("learning_rate,regex", [
    ([{"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 0.1, "total_iters": 5},
      {"scheduler": "Cosine", "initial_learning_rate": 0.1}],
     r"^learning_rate\[1\].scheduler: unknown 'Cosine'; expected one of .*CosineDecayLR, .*\(did you mean"),
    ([{"scheduler": "Constant", "learning_rate": 0.1}, {"scheduler": "Constant", "learning_rate": 0.2}],
     r"^learning_rate\[0\].total_iters: missing; every scheduler but the last needs"),
    ({"scheduler": "CosineDecay", "initial_learning_rate": 0.1, "end_learning_rate": 0.0, "total_iters": 5,
      "warmup": 3}, r"^learning_rate.warmup: unknown key for CosineDecayLR; expected one of initial_learning_rate"),
    ([{"scheduler": "StepLR", "initial_learning_rate": 0.1, "gamma": 0.5, "total_iters": 4}, {"scheduler": "Step"}],
     r"^learning_rate\[0\].step_size: missing \(required by StepLR"),
    ({"initial_learning_rate": 0.1}, r"^learning_rate.scheduler: missing"),
    ("fast", r"^learning_rate: 'fast' is not a number"),
    ([{"scheduler": "Constant", "learning_rate": 0.1, "main_scheduler": "Parallel"}], r"main_scheduler must be"),
    ({"scheduler": "StepLR", "initial_learning_rate": 0.1, "step_size": 0, "gamma": 0.5}, r"^learning_rate: StepLR: Invalid step_size"),
])
def test_scheduler_errors_name_index_and_key(learning_rate, regex):
    with pytest.raises(ParamsError, match=regex):
        csoptim.configure_lr_scheduler(csoptim.SGD(SmallNet().parameters(), lr=0.1), learning_rate)


def test_one_value_under_two_spellings_is_that_value_and_two_values_are_refused():
    """R_1.7's gpt2_small_ws.yaml gives a schedule both steps and decay_steps, equal (its PyTorchBaseModel copies
    steps over decay_steps); equal values are one setting, different ones an error naming both."""
    linear = {"scheduler": "Linear", "initial_learning_rate": 0.1, "end_learning_rate": 0.0}
    both = csoptim.configure_lr_scheduler(csoptim.SGD(SmallNet().parameters(), lr=0.1),
                                          {**linear, "steps": 4, "decay_steps": 4})
    one = csoptim.configure_lr_scheduler(csoptim.SGD(SmallNet().parameters(), lr=0.1), {**linear, "steps": 4})
    assert (type(both), both.total_iters) == (type(one), one.total_iters) == (ls.LinearLR, 4)
    with pytest.raises(ParamsError, match=r"^learning_rate.decay_steps: 'total_iters' is given twice with different "
                                          r"values \(as 'decay_steps' and another spelling: 5 and 4\); keep one"):
        csoptim.configure_lr_scheduler(csoptim.SGD(SmallNet().parameters(), lr=0.1),
                                       {**linear, "steps": 4, "decay_steps": 5})


def test_none_means_no_scheduler():
    assert csoptim.configure_lr_scheduler(csoptim.SGD(SmallNet().parameters(), lr=0.1), None) is None
