"""cs_run.optim against the real vendor package's numbers (golden files from tools/vendor_oracle).

Each optimizer case replays the vendor's 50 gradients and compares parameters and every state tensor
after every step; float32 throughout, as the vendor runs. Bound: TRAJECTORY_ULPS float32 ulps of each
tensor's scale, derived in tests/ulps.py (the golden files were recorded on another CPU, whose kernels
may round an op differently). Class signatures (names, order, defaults, required arguments) and state-dict key
names are compared with the vendor's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cs_run.optim as csoptim
from tests.optim import vendor_golden
from tests.optim.helpers import SmallNet
from tests.ulps import ROUNDINGS_PER_STEP, assert_within_ulps

# 50 steps of at most ROUNDINGS_PER_STEP roundings that may differ between CPUs, none amplified
# (tests/ulps.py): 100 ulps of the tensor's largest magnitude so far. Measured: 0-1 on the recording
# ISA (AVX2), up to 6 with ATEN_CPU_CAPABILITY=default.
TRAJECTORY_ULPS = ROUNDINGS_PER_STEP * vendor_golden.cases.STEPS

# cs-run keyword arguments the vendor's class lacks (appended after the vendor's own, never before)
EXTRA_ARGS = {
    "Adam": ["maximize", "correct_bias"], "AdamW": ["maximize"], "Lamb": ["maximize"], "Lion": ["maximize"],
    "NAdam": ["decoupled_weight_decay", "maximize"], "RAdam": ["decoupled_weight_decay", "maximize"],
    "RMSprop": ["maximize"], "Rprop": ["maximize"],
}
EXTRA_GROUP_KEYS = {"maximize", "decoupled_weight_decay"}


@pytest.mark.parametrize("case_id", vendor_golden.optimizer_case_ids())
def test_optimizer_matches_vendor_trajectory(case_id):
    worst = vendor_golden.replay_optimizer(case_id)
    assert worst["param_ulps"] <= TRAJECTORY_ULPS, worst
    assert worst["state_ulps"] <= TRAJECTORY_ULPS, worst


@pytest.mark.parametrize("case_id", vendor_golden.optimizer_case_ids())
def test_state_dict_keys_match_vendor(case_id):
    info = vendor_golden.meta()["optimizers"]["cases"][case_id]
    prob = vendor_golden.meta()["optimizers"]["problem"]
    params = [torch.nn.Parameter(torch.tensor(prob["w0"])), torch.nn.Parameter(torch.tensor(prob["b0"]))]
    opt = getattr(csoptim, info["class"])(params[: info["n_params"]], **vendor_golden._tuples(info["kwargs"]))
    sd = opt.state_dict()
    assert [sorted(sd["state"][i]) for i in range(info["n_params"])] == info["state_keys"]
    ours = set(sd["param_groups"][0])
    assert set(info["param_group_keys"]) <= ours and ours - set(info["param_group_keys"]) <= EXTRA_GROUP_KEYS
    for key, value in info["param_group"].items():  # e.g. Adam's weight_decay stored as l2 rate
        ours_value = sd["param_groups"][0][key]
        if isinstance(ours_value, torch.Tensor):  # the lr: a float32 tensor here, a Python float there
            assert float(ours_value) == float(torch.tensor(value, dtype=ours_value.dtype)), key
        else:
            assert ours_value == (tuple(value) if isinstance(value, list) else value), key


@pytest.mark.parametrize("name", sorted(k.split(".", 1)[1] for k in vendor_golden.meta()["signatures"]
                                        if k.startswith("optim.") and k.count(".") == 1
                                        and k.split(".")[1] != "Optimizer"))
def test_optimizer_signature_and_defaults_match_vendor(name):
    """Vendor arguments in the vendor's order with its defaults (SGD and Adafactor require lr)."""
    vendor = vendor_golden.meta()["signatures"][f"optim.{name}"]
    ours = vendor_golden.signature_of(getattr(csoptim, name))
    extras = EXTRA_ARGS.get(name, [])
    assert [a[0] for a in ours] == [a[0] for a in vendor] + extras
    for (arg, required, default), (_, v_required, v_default) in zip(ours, vendor):
        assert required == v_required, f"{name}.{arg}: required {required}, vendor {v_required}"
        if not required:
            assert default == v_default, f"{name}.{arg}: default {default!r}, vendor {v_default!r}"


def test_vendor_muon_cannot_step_but_ours_does():
    """The vendor's Muon (2.10) fails on its first step (a recorded fact); cs-run's steps."""
    info = vendor_golden.meta()["optimizers"]["cases"]["Muon-defaults"]
    assert "got multiple values for argument 'steps'" in info["error"]
    model = SmallNet(torch.float32)
    opt = csoptim.Muon([model.w1])
    before = model.w1.detach().clone()
    model.w1.grad = torch.ones_like(model.w1)
    opt.step()
    assert not torch.equal(model.w1, before)


def test_vendor_adam_state_dict_loads_and_continues():
    """A vendor Adam(W) state (beta1_power, beta2_power, l2_regularization_rate) continues identically:
    run 25 of the golden steps, move the state into a fresh optimizer, run the other 25. Bit for bit
    against cs-run's own uninterrupted run (the same kernels in one process), and within the trajectory
    bound of the vendor's step 50."""
    for case_id in ("AdamW-wd", "Adam-wd", "Adam-amsgrad-betas-eps"):
        split, whole = _run_golden_steps(case_id, resume_at=25), _run_golden_steps(case_id)
        golden = vendor_golden._npz(f"optim_{vendor_golden.meta()['optimizers']['cases'][case_id]['class']}.npz")
        for index, (a, b) in enumerate(zip(split, whole)):
            assert torch.equal(a, b), case_id
            recorded = golden[f"{case_id}/param.{index}"]
            assert_within_ulps(a, recorded[-1], TRAJECTORY_ULPS, np.abs(recorded).max(), f"{case_id} param {index}")


def _run_golden_steps(case_id: str, resume_at: int = -1) -> list[torch.Tensor]:
    """The case's 50 golden gradients; at ``resume_at`` the state dict moves into a fresh optimizer."""
    info = vendor_golden.meta()["optimizers"]["cases"][case_id]
    data = vendor_golden._npz(f"optim_{info['class']}.npz")
    prob = vendor_golden.meta()["optimizers"]["problem"]
    kwargs = vendor_golden._tuples(info["kwargs"])
    params = [torch.nn.Parameter(torch.tensor(prob["w0"])), torch.nn.Parameter(torch.tensor(prob["b0"]))]
    opt = getattr(csoptim, info["class"])(params, **kwargs)
    for step in range(vendor_golden.cases.STEPS):
        if step == resume_at:
            saved = opt.state_dict()
            opt = getattr(csoptim, info["class"])(params, **{**kwargs, "lr": 0.5})
            opt.load_state_dict(saved)
        for index, p in enumerate(params):
            p.grad = torch.from_numpy(data[f"{case_id}/grad.{index}"][step].copy())
        opt.step()
    return [p.detach() for p in params]


# -- schedulers ------------------------------------------------------------------------------------
_SCHEDULER_CASES = [c for c in vendor_golden.meta()["schedulers"] if c not in vendor_golden.SCHEDULER_EXCEPTIONS]


@pytest.mark.parametrize("case_id", _SCHEDULER_CASES)
def test_scheduler_matches_vendor_over_1000_steps(case_id):
    """Within 1e-6 of the schedule's scale: cs-run evaluates in float64, the vendor in float32."""
    ours, golden = vendor_golden.scheduler_values(case_id)
    scale = np.abs(golden).max()
    if case_id == "CyclicLR-exp_range":
        # the vendor raises a float32 gamma to the power t: with gamma rounded the same way, 1e-6 holds
        ours = _cyclic_exp_range_with_float32_gamma()
        assert np.abs(vendor_golden.scheduler_values(case_id)[0] - golden).max() < 1e-5 * scale
    assert np.abs(ours - golden).max() <= 1e-6 * scale, np.abs(ours - golden).max() / scale


def _cyclic_exp_range_with_float32_gamma() -> np.ndarray:
    kwargs = dict(vendor_golden.meta()["schedulers"]["CyclicLR-exp_range"]["kwargs"])
    kwargs["gamma"] = float(torch.tensor(kwargs["gamma"], dtype=torch.float32))
    opt = csoptim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    sched = csoptim.lr_scheduler.CyclicLR(opt, **kwargs)
    values = [float(opt.param_groups[0]["lr"])]
    for _ in range(1000):
        sched.step()
        values.append(float(opt.param_groups[0]["lr"]))
    return np.asarray(values)


def _split(case_id: str, boundary: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    ours, golden = vendor_golden.scheduler_values(case_id)
    return ours[:boundary], golden[:boundary], ours[boundary:], golden[boundary:]


@pytest.mark.parametrize("case_id", ["PolynomialLR-cycle", "LinearLR-cycle"])
def test_cycle_true_cycles_here_but_not_in_the_vendor(case_id):
    kwargs = vendor_golden.meta()["schedulers"][case_id]["kwargs"]
    total, start, end = kwargs["total_iters"], kwargs["initial_learning_rate"], kwargs["end_learning_rate"]
    power = kwargs.get("power", 1.0)
    ours_before, vendor_before, ours_after, vendor_after = _split(case_id, total)
    np.testing.assert_allclose(ours_before, vendor_before, rtol=1e-6)  # first period: the same
    assert np.all(vendor_after == np.float32(end))  # fact 1: the vendor holds end_learning_rate
    t = np.arange(total, len(ours_before) + len(ours_after))
    keras = (start - end) * (1 - t / (total * np.maximum(1, np.ceil(t / total)))) ** power + end
    np.testing.assert_allclose(ours_after, keras, rtol=1e-6)  # fact 2: cs-run cycles (Keras' rule)
    assert ours_after.max() > 2 * end


def test_warm_restarts_follow_sgdr_here_and_the_vendors_t_cur_there():
    kwargs = vendor_golden.meta()["schedulers"]["CosineAnnealingWarmRestarts"]["kwargs"]
    t0, lr0, eta_min = kwargs["T_0"], kwargs["initial_learning_rate"], kwargs["eta_min"]
    ours, golden = vendor_golden.scheduler_values("CosineAnnealingWarmRestarts")
    t = np.arange(len(golden))
    vendor_t_cur = np.where(t < t0, t, np.floor(t / t0) * t0 - t0)  # the vendor's formula, a defect
    np.testing.assert_allclose(golden, eta_min + (lr0 - eta_min) * (1 + np.cos(np.pi * vendor_t_cur / t0)) / 2,
                               rtol=2e-6)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr0)
    ref = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=t0, eta_min=eta_min)
    torch_values = []
    for _ in t:
        torch_values.append(opt.param_groups[0]["lr"])
        opt.step()
        ref.step()
    np.testing.assert_allclose(ours, torch_values, rtol=1e-6)  # cs-run: torch's SGDR
    np.testing.assert_allclose(ours[:t0], golden[:t0], rtol=1e-6)  # the first period agrees


@pytest.mark.parametrize("case_id", ["OneCycleLR", "OneCycleLR-linear", "OneCycleLR-three-phase"])
def test_one_cycle_holds_its_end_here_while_the_vendor_keeps_annealing(case_id):
    kwargs = vendor_golden.meta()["schedulers"][case_id]["kwargs"]
    total, final = kwargs["total_steps"], kwargs["initial_learning_rate"] / 1e4
    ours_before, vendor_before, ours_after, vendor_after = _split(case_id, total)
    np.testing.assert_allclose(ours_before, vendor_before, rtol=1e-5, atol=1e-6 * vendor_before.max())
    np.testing.assert_allclose(ours_after, final, rtol=1e-6)  # cs-run: the final value is held
    if kwargs.get("anneal_strategy") == "linear":
        assert vendor_after.min() < 0  # the vendor's lr goes negative past total_steps
    else:
        assert vendor_after.max() > 2 * final  # the vendor's cosine rises again past the end


def test_param_group_tags_select_groups():
    a, b, c = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
    opt = csoptim.AdamW([{"params": [a], "tags": "decay"}, {"params": [b], "tags": ["decay", "head"]},
                         {"params": [c]}], lr=0.5)
    assert opt.param_groups[1]["tags"] == {"decay", "head"}
    csoptim.lr_scheduler.ConstantLR(opt, 0.1, param_group_tags="decay")
    assert [float(g["lr"]) for g in opt.param_groups] == [pytest.approx(0.1)] * 2 + [0.5]
    sched = csoptim.lr_scheduler.LinearLR(opt, 0.0, 1.0, total_iters=10, param_group_tags=[None])
    sched.step()
    assert [float(g["lr"]) for g in opt.param_groups] == [pytest.approx(0.1)] * 2 + [pytest.approx(0.1)]
    assert sched.get_last_lr()[:2] == [None, None]


def test_weight_decay_scheduler_drives_the_optimizers_decay():
    """CosineDecayWD writes group['weight_decay'] (a tensor); AdamW's step uses the scheduled value."""
    p = torch.nn.Parameter(torch.ones(3))
    opt = csoptim.AdamW([p], lr=0.1, weight_decay=0.0)
    sched = csoptim.weight_decay_scheduler.CosineDecayWD(opt, initial_val=0.5, end_val=0.0, total_iters=4)
    assert isinstance(opt.param_groups[0]["weight_decay"], torch.Tensor)
    assert float(opt.param_groups[0]["weight_decay"]) == 0.5
    p.grad = torch.zeros(3)
    opt.step()  # zero grad: only the decay moves p
    torch.testing.assert_close(p.detach(), torch.full((3,), 1 - 0.1 * 0.5))
    sched.step()
    assert float(opt.param_groups[0]["weight_decay"]) == pytest.approx(0.25 * (1 + np.cos(np.pi / 4)))


def test_scale_per_param_lr_scales_each_group():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = csoptim.SGD([{"params": [a], "adjust_learning_rate": 0.5}, {"params": [b]}], lr=1.0)
    inner = csoptim.lr_scheduler.ExponentialLR(opt, 0.2, total_iters=1, decay_rate=0.5)
    sched = csoptim.lr_scheduler.ScalePerParamLR(opt, inner)
    sched.step()
    assert [float(g["lr"]) for g in opt.param_groups] == [pytest.approx(0.05), pytest.approx(0.1)]


@pytest.mark.parametrize("module,suffix", [("lr_scheduler", "LR"), ("weight_decay_scheduler", "WD")])
def test_scheduler_signatures_match_vendor(module, suffix):
    """Every vendor scheduler class of the module exists with the vendor's arguments and defaults."""
    signatures = vendor_golden.meta()["signatures"]
    names = [k.rsplit(".", 1)[1] for k in signatures if k.startswith(f"optim.{module}.")]
    extras = {"lr_scheduler.LambdaLR": ["lr_lambda"], "lr_scheduler.ChainedLR": ["optimizer"],
              "lr_scheduler.ChainedScheduler": ["optimizer"], "lr_scheduler.LambdaScheduler": ["value_lambda"],
              "weight_decay_scheduler.LambdaScheduler": ["value_lambda"], "weight_decay_scheduler.LambdaWD": ["value_lambda"]}
    for name in names:
        cls = getattr(getattr(csoptim, module), name, None) or getattr(csoptim.scheduler, name)
        vendor = signatures[f"optim.{module}.{name}"]
        ours = vendor_golden.signature_of(cls)
        assert [a[0] for a in ours] == [a[0] for a in vendor] + extras.get(f"{module}.{name}", []), name
        for (arg, required, default), (_, v_required, v_default) in zip(ours, vendor):
            assert required == v_required, f"{name}.{arg}"
            if not required:
                assert default == v_default, f"{name}.{arg}: {default!r} != {v_default!r}"
