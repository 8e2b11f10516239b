"""Every optimizer of optim_table.py against its torch.optim twin or paper reference, plus the contract
of the compliant base class (state up front, in-place updates, tensor lr, checkpoints)."""

from __future__ import annotations

import copy

import pytest
import torch

import cs_run
import cs_run.optim as csoptim
from tests.optim.helpers import SmallNet, batches, train, twins
from tests.optim.optim_table import CASES, ROWS, TWIN_CASES, VENDOR_RULE_CASES, case_id


def _trained_with_twin(case) -> tuple[SmallNet, SmallNet]:
    """Twin models (the same start), one trained by the row's optimizer and one by its torch twin, on the same data."""
    row, variant = case
    ours_model, ref_model = twins()
    ours = row.cls(ours_model.parameters(), **variant)
    ref = row.twin(ref_model.parameters(), **{**row.twin_defaults, **variant})
    data = batches()
    train(ours_model, ours, data)
    train(ref_model, ref, data)
    return ours_model, ref_model


@pytest.mark.parametrize("case", TWIN_CASES, ids=case_id)
def test_matches_twin_over_50_steps(case):
    """Where the vendor's rule is torch's: 50 steps in float64; tolerance per row (optim_table.atol)."""
    row, _ = case
    ours_model, ref_model = _trained_with_twin(case)
    for (name, p), q in zip(ours_model.named_parameters(), ref_model.parameters()):
        assert not torch.equal(p, SmallNet().get_parameter(name)), "the optimizer did not move the parameter"
        diff = (p - q).abs().max().item()
        assert diff <= row.atol, f"{name}: max |diff| {diff:.3g} > {row.atol:g}"


@pytest.mark.parametrize("case", VENDOR_RULE_CASES, ids=case_id)
def test_vendor_rule_really_differs_from_twin(case):
    """Where optim_table records a vendor rule, torch's twin does differ (so the golden files decide)."""
    ours_model, ref_model = _trained_with_twin(case)
    diff = max((p - q).abs().max().item() for p, q in zip(ours_model.parameters(), ref_model.parameters()))
    assert diff > 1e-7, f"{case_id(case)} equals its twin ({diff:.3g}); drop it from vendor_rule"


@pytest.mark.parametrize("name", ["SGD", "RMSprop", "Lion"])
def test_float32_close_to_torch(name):
    """float32 with a float32 lr tensor: torch.optim to 1e-5 relative (rounding order only)."""
    row = next(r for r in ROWS if r.name == name)
    variant = [v for i, v in enumerate(row.variants) if i not in row.vendor_rule][-1]
    ours_model, ref_model = twins(torch.float32)
    ours = row.cls(ours_model.parameters(), **variant)
    ref = row.twin(ref_model.parameters(), **{**row.twin_defaults, **variant})
    data = batches(20, torch.float32)
    train(ours_model, ours, data)
    train(ref_model, ref, data)
    for p, q in zip(ours_model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("row", [(r, kw, rx) for r in ROWS for kw, rx in r.bad],
                         ids=lambda c: f"{c[0].name}-{c[1]}")
def test_bad_hyperparameters(row):
    row, kwargs, regex = row
    with pytest.raises(ValueError, match=regex):
        row.cls(SmallNet().parameters(), **kwargs)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_state_exists_up_front_and_is_updated_in_place(case):
    """All state exists after construction; steps keep every state tensor's identity and storage."""
    row, variant = case
    model = SmallNet()
    opt = row.cls(model.parameters(), **variant)
    before = {(i, k): (v, v.data_ptr()) for i, s in enumerate(opt.state.values()) for k, v in s.items()}
    lrs = [(g["lr"], g["lr"].data_ptr()) for g in opt.param_groups]
    assert len(opt.state) == len(list(model.parameters()))
    train(model, opt, batches(3))
    after = {(i, k): v for i, s in enumerate(opt.state.values()) for k, v in s.items()}
    assert after.keys() == before.keys()
    for key, (tensor, ptr) in before.items():
        assert after[key] is tensor and tensor.data_ptr() == ptr, key
    assert all(g["lr"] is t and t.data_ptr() == ptr for g, (t, ptr) in zip(opt.param_groups, lrs))


def test_lr_is_a_tensor_and_in_place_changes_apply():
    model = SmallNet()
    opt = csoptim.SGD(model.parameters(), lr=0.1)
    lr = opt.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.dim() == 0 and lr.dtype == torch.float64
    assert csoptim.SGD(SmallNet(torch.float32).parameters(), lr=0.1).param_groups[0]["lr"].dtype == torch.float32
    p0 = model.w1.detach().clone()
    model.w1.grad = torch.ones_like(model.w1)
    lr.fill_(0.5)
    opt.step()
    torch.testing.assert_close(model.w1.detach(), p0 - 0.5, rtol=0, atol=0)


def test_param_groups_and_params_without_grad():
    model = SmallNet()
    opt = csoptim.RMSprop([{"params": [model.w1], "lr": 0.1}, {"params": [model.b1, model.w2]}], lr=0.01,
                          momentum=0.9)
    ref_model = copy.deepcopy(model)
    ref = torch.optim.RMSprop([{"params": [ref_model.w1], "lr": 0.1}, {"params": [ref_model.b1, ref_model.w2]}],
                              lr=0.01, momentum=0.9)
    for m, o in ((model, opt), (ref_model, ref)):
        m.w1.grad = torch.full_like(m.w1, 0.3)
        o.step()  # b1, w2 have no grad: skipped, their state untouched
    assert not opt.state[model.b1]["momentum_buffer"].any() and opt.state[model.w1]["momentum_buffer"].all()
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-15)


def test_add_param_group_creates_state_and_keeps_the_old():
    model = SmallNet()
    opt = csoptim.Adam([model.w1], lr=0.1)
    model.w1.grad = torch.ones_like(model.w1)
    opt.step()
    old = opt.state[model.w1]["exp_avg"].clone()
    opt.add_param_group({"params": [model.b1], "lr": 0.2, "weight_decay": 0.3})
    assert torch.equal(opt.state[model.w1]["exp_avg"], old)
    assert float(opt.state[model.w1]["beta1_power"]) == float(torch.tensor(0.9) * 0.9)  # advanced one step
    assert set(opt.state[model.b1]) == {"exp_avg", "exp_avg_sq", "beta1_power", "beta2_power"}
    assert float(opt.state[model.b1]["beta1_power"]) == float(torch.tensor(0.9))
    assert isinstance(opt.param_groups[1]["lr"], torch.Tensor)
    # Adam: a group's weight_decay is its L2 rate, as the constructor's
    assert opt.param_groups[1]["l2_regularization_rate"] == 0.3 and opt.param_groups[1]["weight_decay"] == 0.0


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_state_dict_round_trip_copies_in_place(row):
    """Resume from a state_dict: identical continuation, and the state tensors keep their storage."""
    data = batches(8)
    model = SmallNet()
    opt = row.cls(model.parameters(), **row.variants[-1])
    train(model, opt, data[:4])
    saved_model, saved = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    train(model, opt, data[4:])

    resumed = SmallNet()
    resumed.load_state_dict(saved_model)
    opt2 = row.cls(resumed.parameters(), **row.variants[-1])
    tensors = [v for s in opt2.state.values() for v in s.values()]
    lr = opt2.param_groups[0]["lr"]
    opt2.load_state_dict(saved)
    assert [v for s in opt2.state.values() for v in s.values()] == tensors or all(
        a is b for a, b in zip([v for s in opt2.state.values() for v in s.values()], tensors))
    assert opt2.param_groups[0]["lr"] is lr
    train(resumed, opt2, data[4:])
    for p, q in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def test_torch_adam_state_dict_loads_into_ours():
    """A torch.optim.Adam checkpoint resumes in cs_run.optim.Adam (as in the vendor's Adam): ``step``
    becomes ``beta^(step + 1)`` for the next step, torch's ``weight_decay`` becomes the L2 rate."""
    data = batches(6)
    ref_model, model = twins()
    ref = torch.optim.Adam(ref_model.parameters(), lr=0.01, eps=1e-6, weight_decay=0.02)
    train(ref_model, ref, data[:3])
    model.load_state_dict(ref_model.state_dict())
    opt = csoptim.Adam(model.parameters(), lr=0.5)
    opt.load_state_dict(ref.state_dict())
    group = opt.param_groups[0]
    assert float(group["lr"]) == 0.01 and group["l2_regularization_rate"] == 0.02 and group["weight_decay"] == 0.0
    state = opt.state[model.w1]
    assert set(state) == {"exp_avg", "exp_avg_sq", "beta1_power", "beta2_power"}
    assert float(state["beta1_power"]) == pytest.approx(0.9**4, rel=1e-7)
    assert float(state["beta2_power"]) == pytest.approx(0.999**4, rel=1e-7)
    assert torch.equal(state["exp_avg"], ref.state[ref_model.w1]["exp_avg"])
    train(model, opt, data[3:])  # continues (with the vendor's eps placement)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_load_state_dict_logs_unknown_and_missing_state(caplog):
    model = SmallNet()
    opt = csoptim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][0]["bogus"] = torch.zeros(1)
    del sd["state"][1]["momentum_buffer"]
    opt.load_state_dict(sd)
    assert "bogus" not in opt.state[model.w1] and "momentum_buffer" in opt.state[model.b1]
    assert "Dropping unknown optimizer state 'bogus'" in caplog.text
    assert "lacks optimizer state 'momentum_buffer'" in caplog.text


class _Lazy(csoptim.Optimizer):
    """Creates state in step(), as torch.optim does: not compliant."""

    def __init__(self, params, lr=0.1):
        super().__init__(params, {"lr": lr})

    def preinitialize(self):
        pass

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["buf"] = cs_run.zeros_like(p)

    def state_names_to_sparsify(self):
        return []


class _Forgetful(_Lazy):
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["momentum"].add_(1)


def test_state_created_in_step_is_a_compliance_error():
    opt = _Lazy(SmallNet().parameters())
    with pytest.raises(cs_run.errors.ComplianceError, match=r"_Lazy.step\(\) created optimizer state \['buf'\] "
                       r"for parameter 0; create all state in preinitialize\(\)"):
        opt.step()


def test_state_read_but_never_created_is_a_compliance_error():
    opt = _Forgetful(SmallNet().parameters())
    with pytest.raises(cs_run.errors.ComplianceError, match=r"read optimizer state 'momentum', which "
                       r"preinitialize\(\) did not create"):
        opt.step()


def test_missing_preinitialize_is_a_clear_type_error():
    class NoPreinit(csoptim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.1})

        def step(self, closure=None):
            pass

        def state_names_to_sparsify(self):
            return []

    with pytest.raises(TypeError, match=r"NoPreinit cannot be instantiated: it does not implement preinitialize"):
        NoPreinit(SmallNet().parameters())


def test_enable_global_step_and_sparsify_names():
    class Counting(csoptim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.1}, enable_global_step=True)

        def preinitialize(self):
            pass

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    self.increment_global_step(p)

        def state_names_to_sparsify(self):
            return []

    model = SmallNet()
    opt = Counting(model.parameters())
    opt.step()
    opt.step()
    assert all(float(s["step"]) == 2 for s in opt.state.values())
    assert csoptim.Adam(model.parameters()).state_names_to_sparsify() == ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]


def test_closure_is_evaluated_with_grad():
    model = SmallNet()
    opt = csoptim.SGD(model.parameters(), lr=0.1)
    x, y = batches(1)[0]

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert loss.requires_grad and model.w1.grad is not None


def test_vendor_defaults_are_documented_differences():
    model = SmallNet()
    assert csoptim.Adam(model.parameters()).defaults["eps"] == 1e-6
    assert csoptim.AdamW(model.parameters()).defaults["weight_decay"] == 0.0
    assert "correct_bias" in csoptim.AdamW(model.parameters()).defaults


def test_adamw_without_bias_correction_by_hand():
    """correct_bias=False (the BERT recipe): two steps computed by hand, the vendor's order."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    opt = csoptim.AdamW([p], lr=0.1, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.5, correct_bias=False)
    assert set(opt.state[p]) == {"exp_avg", "exp_avg_sq"}
    x, m, v = p.detach().clone(), torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    for g in (torch.tensor([0.5, 0.25], dtype=torch.float64), torch.tensor([-1.0, 2.0], dtype=torch.float64)):
        p.grad = g.clone()
        opt.step()
        m, v = 0.9 * m + 0.1 * g, 0.99 * v + 0.01 * g * g
        x = x - 0.1 * (m / (v.sqrt() + 1e-6) + 0.5 * x)
    torch.testing.assert_close(p.detach(), x, rtol=0, atol=1e-15)
