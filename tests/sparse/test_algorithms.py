"""cstorch.sparse against hand computations from the vendor's rules (cerebras.pytorch.sparse 2.10):

* a mask keeps ``int((1 - sparsity) * numel)`` entries, the float32 product truncated;
* after an optimizer step the step counter ``n`` (finite steps so far) advances; ``update: {freq, stop}``
  changes masks at steps ``n % freq == 0, n < stop``; SET/RigL keep ``int((1 - drop_fraction(n)) * kept)``
  connections of the largest magnitude and regrow to the target count (SET at random, RigL where the
  dense gradient is largest); GMP keeps the top ``1 - sparsity(n)`` by magnitude;
* ``cosine``: ``o + a cos(n pi / half_period)``, ``o = (init + minimum) / 2``, ``a = init - o``.

Every expected mask below is written out by hand from those rules on a 4x4 weight whose entry ``i``
(row-major) is ``i + 1``; the gradient, where it matters, is set by the loss ``sum(W * G)``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import cs_run as cstorch
from cs_run.sparse import GMP, SET, RigL, Static, configure
from cs_run.sparse.utils import Cosine, FreqSchedule, Linear, ListSchedule, make_mask_topk_sparsity

EVEN = torch.tensor([i % 2 == 0 for i in range(16)]).reshape(4, 4)


class Probe(torch.nn.Module):
    """One 4x4 weight (entry i = i + 1) whose loss ``sum(W * G)`` has the dense gradient G."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(1.0, 17.0).reshape(4, 4))

    def forward(self, grad: torch.Tensor) -> torch.Tensor:
        return (self.weight * grad).sum()


def positions(mask: torch.Tensor) -> set[int]:
    return set(torch.nonzero(mask.reshape(-1)).reshape(-1).tolist())


def probe_with(algorithm, mask: torch.Tensor | None = None):
    model = Probe()
    model.apply(algorithm)
    if mask is not None:
        model.weight_mask.copy_(mask)
        with torch.no_grad():
            model.weight.copy_(torch.arange(1.0, 17.0).reshape(4, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: magnitudes stay as set
    optimizer.apply = lambda f: f.apply(optimizer)
    algorithm.apply(optimizer)
    return model, optimizer


def one_step(model, optimizer, grad: torch.Tensor) -> None:
    model(grad).backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize("sparsity,numel,kept", [
    (0.5, 16, 8), (0.75, 16, 4), (0.7, 100, 30),  # float32(0.3) * 100 = 30.0000012 -> 30
    (0.7, 30, 9), (0.9, 7, 0),  # 0.1 * 7 = 0.7 -> 0 (the vendor truncates)
    (0.0, 12, 12),
])
def test_topk_mask_keeps_the_truncated_count_of_highest_scores(sparsity, numel, kept):
    score = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    mask = make_mask_topk_sparsity(score, torch.tensor(sparsity))
    assert int(mask.sum()) == kept
    assert positions(mask) == set(torch.argsort(score, descending=True)[:kept].tolist())


def test_configure_masks_the_default_filters_weights_with_exact_counts():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(5, 10), torch.nn.Linear(10, 10), torch.nn.LayerNorm(10),
                                torch.nn.Linear(10, 3))
    sparsity = configure({"sparsity": 0.7})
    model.apply(sparsity)
    masks = {k: v for k, v in model.state_dict().items() if k.endswith("_mask")}
    # the vendor's default filter: > 1-D, not an embedding or a norm (names and class: 0 is the Embedding)
    assert set(masks) == {"0.weight_mask", "1.weight_mask", "3.weight_mask"}
    assert [int(masks[k].sum()) for k in ("1.weight_mask", "3.weight_mask")] == [30, 9]
    for name in ("1.weight", "3.weight"):
        weight, mask = model.get_parameter(name), masks[name + "_mask"]
        assert (weight[~mask] == 0).all() and (weight[mask] != 0).all()


def test_param_filter_globs_match_the_full_name_through_module_apply():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 4)))
    model.apply(configure({"sparsity": 0.5, "param_filter": ["1.*.weight"]}))
    assert [k for k in model.state_dict() if k.endswith("_mask")] == ["1.0.weight_mask"]


def test_pruned_weights_and_adamw_state_stay_exactly_zero_and_kept_weights_follow_masked_adamw():
    """Reference: the same AdamW on a dense copy whose gradients, state and weights are masked by hand as the
    vendor's hooks do (gradients after backward, state before the step, weights and state after it)."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    reference.load_state_dict(model.state_dict())
    sparsity = configure({"sparsity": 0.6, "init_method": "topk"})
    model.apply(sparsity)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    optimizer.apply(sparsity)
    masks = {"0.weight": model[0].weight_mask.clone(), "2.weight": model[2].weight_mask.clone()}
    ref_opt = cstorch.optim.AdamW(reference.parameters(), lr=0.05, weight_decay=0.1)
    with torch.no_grad():
        for name, mask in masks.items():
            reference.get_parameter(name).mul_(mask)
    data = torch.randn(12, 8, generator=torch.Generator().manual_seed(1))
    for step in range(12):
        x = data[step:step + 1].repeat(3, 1)
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        reference(x).square().mean().backward()
        with torch.no_grad():
            for name, mask in masks.items():
                p = reference.get_parameter(name)
                p.grad = torch.where(mask, p.grad, torch.zeros_like(p.grad))
                for state in ref_opt.state[p].values():
                    if state.shape == p.shape:
                        state.mul_(mask)
            ref_opt.step()
            ref_opt.zero_grad()
            for name, mask in masks.items():
                p = reference.get_parameter(name)
                for tensor in [p, *(s for s in ref_opt.state[p].values() if s.shape == p.shape)]:
                    tensor.mul_(mask)
    for name, mask in masks.items():
        weight = model.get_parameter(name)
        assert torch.equal(model.get_buffer(name + "_mask"), mask)  # static: the mask never changes
        assert (weight[~mask] == 0).all()
        for state in optimizer.state[weight].values():
            if state.shape == weight.shape:
                assert (state[~mask] == 0).all()
    # the same float ops in the same order: bit for bit
    for key, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


def test_rigl_drops_smallest_and_regrows_largest_dense_gradient_on_update_steps():
    rigl = RigL(sparsity=0.5, drop_fraction=0.25, update={"freq": 2}, init_method="topk")
    model, optimizer = probe_with(rigl, EVEN)
    grad = torch.zeros(16)
    grad[[5, 0, 7, 1, 4]] = torch.tensor([-9.0, 4.0, 2.0, 1.0, 100.0])  # 4 is kept: not a regrow candidate
    grad = grad.reshape(4, 4)
    one_step(model, optimizer, grad)  # step 1: not an update step
    assert positions(model.weight_mask) == set(range(0, 16, 2)) and int(rigl.step) == 1
    one_step(model, optimizer, grad)  # step 2: keep int(0.75 * 8) = 6 -> drop 0 and 2 (|w| 1, 3); regrow 5, 0
    assert positions(model.weight_mask) == {0, 4, 5, 6, 8, 10, 12, 14}
    expected = torch.tensor([1.0, 0, 0, 0, 5, 0, 7, 0, 9, 0, 11, 0, 13, 0, 15, 0]).reshape(4, 4)
    assert torch.equal(model.weight.detach(), expected)  # 2 pruned to 0, 5 regrown at 0, 0 kept its value


def test_set_drop_fraction_follows_the_cosine_at_the_counted_step_and_stops():
    torch.manual_seed(0)
    # drop_fraction(n) = 0.25 + 0.25 cos(n pi / 4): n=2 -> 0.25 (keep 6 of 8), n=4 -> 0 (keep all 8)
    algorithm = SET(sparsity=0.5, drop_fraction={"type": "cosine", "init": 0.5, "half_period": 4},
                    update={"freq": 2, "stop": 5}, init_method="topk")
    model, optimizer = probe_with(algorithm, EVEN)
    grad = torch.ones(4, 4)
    history = []
    for _ in range(6):
        one_step(model, optimizer, grad)
        history.append(positions(model.weight_mask))
    start = set(range(0, 16, 2))
    assert history[0] == start  # step 1
    kept = {4, 6, 8, 10, 12, 14}  # step 2: the six largest of the even entries; two regrown at random
    assert len(history[1]) == 8 and kept < history[1] and history[1] != start
    assert (model.weight.detach().reshape(-1)[[2]] == 0).all()
    assert history[2] == history[1] and history[3] == history[1]  # step 3; step 4 drops 0 (cosine at its minimum)
    assert history[4] == history[1] and history[5] == history[1]  # steps 5, 6: past stop
    assert int(algorithm.step) == 6


def test_gmp_keeps_the_top_of_a_growing_sparsity():
    # sparsity(n) = 0.25 + 0.125 n; start mask: top 12 (0.25); update at n=2 (0.5: top 8) and n=4 (0.75: top 4)
    gmp = GMP(sparsity={"type": "linear", "init": 0.25, "slope": 0.125}, update={"freq": 2}, init_method="topk")
    model, optimizer = probe_with(gmp)
    assert positions(model.weight_mask) == set(range(4, 16))
    seen = []
    for _ in range(4):
        one_step(model, optimizer, torch.ones(4, 4))
        seen.append(positions(model.weight_mask))
    assert seen == [set(range(4, 16)), set(range(8, 16)), set(range(8, 16)), set(range(12, 16))]
    assert (model.weight.detach().reshape(-1)[:12] == 0).all()


def test_a_step_with_a_nonfinite_gradient_changes_no_mask_and_is_not_counted():
    rigl = RigL(sparsity=0.5, drop_fraction=0.25, update={"freq": 1}, init_method="topk")
    model, optimizer = probe_with(rigl, EVEN)
    bad = torch.full((4, 4), float("nan"))
    one_step(model, optimizer, bad)
    assert int(rigl.step) == 0 and positions(model.weight_mask) == set(range(0, 16, 2))


def test_an_update_schedule_with_a_start_trains_dense_until_then():
    algorithm = SET(sparsity=0.5, update={"freq": 3, "start": 2})
    model, _ = probe_with(algorithm)
    assert bool(model.weight_mask.all())


@pytest.mark.parametrize("step", [0, 1, 100, 1792, 3000, 3584])
def test_cosine_schedule_is_the_vendors_formula(step):
    schedule = Cosine(init=0.3, half_period=3584)  # the gpt3 rigl75/set75 files' drop_fraction
    # the vendor evaluates in float32: cos of float32(step) * float32(pi / half_period); then a few ulps of 0.3
    def vendor(init, minimum, half_period):
        offset = (init + minimum) / 2
        arg = float(np.float32(step) * np.float32(math.pi / half_period))
        return offset + (init - offset) * math.cos(arg)

    assert abs(float(schedule(torch.tensor(step))) - vendor(0.3, 0.0, 3584)) < 1e-7
    assert abs(float(Cosine(init=0.5, half_period=10, minimum=0.1)(torch.tensor(step))) - vendor(0.5, 0.1, 10)) < 1e-7
    assert float(Linear(init=0.1, slope=0.5)(torch.tensor(step))) == pytest.approx(0.1 + 0.5 * step, rel=1e-6)


def test_update_schedules_pick_the_vendors_steps():
    freq = FreqSchedule(freq=100, stop=3584)  # the gpt3 files' update
    due = [n for n in range(0, 4000) if bool(freq(torch.tensor(n)))]
    assert due == list(range(0, 3584, 100))
    started = FreqSchedule(freq=3, start=5, stop=12)
    assert [n for n in range(20) if bool(started(torch.tensor(n)))] == [5, 8, 11]
    listed = ListSchedule([3, 7])
    assert [n for n in range(10) if bool(listed(torch.tensor(n)))] == [3, 7]


def test_state_dict_round_trip_restores_the_step_counter():
    algorithm = SET(sparsity=0.5, update={"freq": 2})
    model, optimizer = probe_with(algorithm)
    for _ in range(3):
        one_step(model, optimizer, torch.ones(4, 4))
    fresh = SET(sparsity=0.5, update={"freq": 2})
    probe_with(fresh)
    fresh.load_state_dict(algorithm.state_dict())
    assert int(fresh.step) == 3 and int(algorithm.step) == 3


def test_static_refuses_a_schedule_and_gmp_a_constant():
    with pytest.raises(ValueError, match="one number"):
        Static(sparsity={"type": "linear", "init": 0.1, "slope": 0.1})
    with pytest.raises(ValueError, match="never changes the mask"):
        GMP(sparsity=0.5)
