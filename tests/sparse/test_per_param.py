"""Per-parameter sparsity schedules, as cerebras.pytorch.sparse 2.10 defines them: ``sparsity`` may be a
mapping keyed by the parameter tensors (each value a level or a schedule); ``algorithm.sparsity[param]``
is then that weight's schedule, a weight missing from it has none, and assigning a plain level later sets
the default while keeping the mapping. A dynamic algorithm computes each schedule once per step, reports
its target once under the common prefix of its weights' names, moves it on once per update step, and
saves a stateful schedule (cycling) under one of its weights' names (``state["sparsity"][name]``).

The expected masks are computed by hand: weights with fixed magnitudes (lr 0), GMP keeping the top
``int((1 - level) * 16)`` of each 4x4 weight (ties to the lower index) on the update steps ``n % 2 == 0``.
"""

from __future__ import annotations

import pytest
import torch

import cs_run as cstorch
from cs_run.backend import _reset_for_tests
from cs_run.sparse import GMP, SET, Group, Static
from tests.engine.helpers import MLP, input_fn

UP = torch.arange(1.0, 17.0).reshape(4, 4)  # entry i is i + 1: the top k are the last k positions
DOWN = torch.arange(16.0, 0.0, -1.0).reshape(4, 4)  # the top k are the first k


class Three(torch.nn.Module):
    """Three 4x4 weights with fixed values; the loss ``sum(W * G)`` gives every weight the gradient G."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = (torch.nn.Linear(4, 4, bias=False) for _ in range(3))
        with torch.no_grad():
            for layer, value in ((self.fc1, UP), (self.fc2, DOWN), (self.fc3, UP)):
                layer.weight.copy_(value)

    def forward(self, grad: torch.Tensor) -> torch.Tensor:
        return sum((layer.weight * grad).sum() for layer in (self.fc1, self.fc2, self.fc3))


def positions(mask: torch.Tensor) -> set[int]:
    return set(torch.nonzero(mask.reshape(-1)).reshape(-1).tolist())


def attach(model: torch.nn.Module, algorithm) -> torch.optim.Optimizer:
    model.apply(algorithm)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.0)
    optimizer.apply(algorithm)
    return optimizer


def step(model, optimizer) -> None:
    model(torch.ones(4, 4)).backward()
    optimizer.step()
    optimizer.zero_grad()


def test_each_weight_follows_its_own_schedule_and_a_shared_one_reports_once():
    model = Three()
    growing = {"type": "linear", "init": 0.25, "slope": 0.125}  # 0.25, then 0.5 at n=2, 0.75 at n=4
    shared = GMP(sparsity={model.fc1.weight: growing, model.fc2.weight: [0.5, 0.25]}, update={"freq": 2},
                 init_method="topk")
    shared.sparsity = {model.fc1.weight: shared.sparsity[model.fc1.weight], model.fc2.weight: [0.5, 0.25],
                       model.fc3.weight: shared.sparsity[model.fc1.weight]}  # fc1 and fc3: one schedule object
    targets = []
    shared.register_target_sparsity_hook(lambda algorithm, name, target: targets.append((name, float(target))))
    optimizer = attach(model, shared)
    # step 0: fc1, fc3 at 0.25 keep the top 12; fc2's cycle starts at 0.5 (top 8) and moves on to 0.25
    assert positions(model.fc1.weight_mask) == positions(model.fc3.weight_mask) == set(range(4, 16))
    assert positions(model.fc2.weight_mask) == set(range(8))
    seen = []
    for _ in range(4):
        step(model, optimizer)
        seen.append([positions(layer.weight_mask) for layer in (model.fc1, model.fc2, model.fc3)])
    # n=2: fc1, fc3 at 0.5 keep the top 8; fc2 at 0.25 keeps 12: its 8 nonzero and the zeros at 8-11 (ties: lower
    # index); n=4: fc1, fc3 at 0.75 keep 4; fc2's cycle is back at 0.5: the top 8
    assert seen[1] == [set(range(8, 16)), set(range(12)), set(range(8, 16))]
    assert seen[3] == [set(range(12, 16)), set(range(8)), set(range(12, 16))]
    assert seen[0] == [set(range(4, 16)), set(range(8)), set(range(4, 16))] and seen[2] == seen[1]
    # one target per schedule and step: fc1/fc3's under their common prefix "fc", fc2's under its name
    assert targets[:2] == [("fc*", 0.375), ("fc2.weight*", 0.25)]
    assert [t for t in targets if t[0] == "fc*"] == [("fc*", 0.25 + 0.125 * n) for n in range(1, 5)]
    assert [t[1] for t in targets if t[0] == "fc2.weight*"] == [0.25, 0.25, 0.5, 0.5]


def test_a_cycling_schedules_state_is_saved_under_its_weights_name_and_restored():
    model = Three()
    algorithm = GMP(sparsity={model.fc1.weight: [0.5, 0.25, 0.75], model.fc2.weight: [0.5, 0.25],
                              model.fc3.weight: {"type": "linear", "init": 0.1, "slope": 0.1}}, update={"freq": 2})
    optimizer = attach(model, algorithm)
    for _ in range(3):  # update steps 0 and 2: fc1's cycle at index 2, fc2's back at 0
        step(model, optimizer)
    state = algorithm.state_dict()
    assert set(state) == {"step", "sparsity"} and int(state["step"]) == 3
    assert {k: int(v["index"]) for k, v in state["sparsity"].items()} == {"fc1.weight": 2, "fc2.weight": 0}
    fresh_model = Three()
    fresh = GMP(sparsity={fresh_model.fc1.weight: [0.5, 0.25, 0.75], fresh_model.fc2.weight: [0.5, 0.25],
                          fresh_model.fc3.weight: {"type": "linear", "init": 0.1, "slope": 0.1}}, update={"freq": 2})
    attach(fresh_model, fresh)
    fresh.load_state_dict(state)
    assert int(fresh.sparsity[fresh_model.fc1.weight].index) == 2
    assert int(fresh.sparsity[fresh_model.fc2.weight].index) == 0 and int(fresh.step) == 3


def test_the_state_layout_cs_run_wrote_before_still_resumes_the_cycles():
    """Before the vendor's keying, a dynamic algorithm's one shared schedule was saved as ``schedules: {"0": ...}``
    and SET's/RigL's drop fraction as ``"1"`` (cs-run at 903ff0e); such a checkpoint resumes both cycles."""
    model = Three()
    algorithm = SET(sparsity=[0.5, 0.25, 0.75], drop_fraction=[0.1, 0.2], update={"freq": 2})
    attach(model, algorithm)
    old = {"step": torch.tensor(3), "schedules": {"0": {"index": torch.tensor(2)}, "1": {"index": torch.tensor(1)}}}
    algorithm.load_state_dict(old)
    assert int(algorithm.step) == 3 and int(algorithm.drop_fraction.index) == 1
    assert {int(algorithm.sparsity[layer.weight].index) for layer in (model.fc1, model.fc2, model.fc3)} == {2}


def test_a_default_set_later_keeps_the_mapping_and_covers_the_other_weights():
    model = Three()
    algorithm = SET(sparsity={model.fc2.weight: 0.75}, init_method="topk")
    algorithm.sparsity = 0.25  # the vendor's setter: the default, the mapping kept
    model.apply(algorithm)
    assert [int(layer.weight_mask.sum()) for layer in (model.fc1, model.fc2, model.fc3)] == [12, 4, 12]
    other, static = Three(), Static(sparsity=0.5)
    static.sparsity = {other.fc1.weight: 0.25}  # a mapping replaces everything, the default included
    with pytest.raises(ValueError, match=r"Static fc2.weight: no sparsity level: the per-parameter sparsity mapping "
                                         r"has no entry for this weight"):
        other.apply(static)


@pytest.mark.parametrize("make,regex", [
    (lambda m: SET(sparsity={m.fc1.weight: 0.5, "fc2.weight": 0.5}),
     r"a per-parameter sparsity mapping is keyed by the parameters themselves \(tensors\), got the key 'fc2.weight'"),
    (lambda m: SET(sparsity={"fc1.*": 0.5}),
     r"a schedule mapping needs a type .*; a per-parameter mapping is keyed by the parameter tensors"),
    (lambda m: SET(sparsity={m.fc1.weight: {"type": "sine"}}), r"unknown schedule type 'sine'"),
    (lambda m: GMP(sparsity={m.fc1.weight: {"type": "linear", "init": 0.1, "slope": 0.1}, m.fc2.weight: 0.5}),
     r"GMP with a constant sparsity \(0.5\) never changes the mask"),
    (lambda m: Static(sparsity={m.fc1.weight: 0.5}), r"Static sparsity is one number"),
])
def test_a_bad_per_parameter_mapping_is_one_error(make, regex):
    with pytest.raises(ValueError, match=regex):
        make(Three())


def run_mlp(backend_type: str, tmp_path) -> dict:
    """MLP training with per-weight GMP cycles through cstorch.trace, the backend's way."""
    cstorch.backend(backend_type, artifact_dir=tmp_path, compile_tier="fx")
    torch.manual_seed(0)
    model = MLP()
    compiled = cstorch.compile(model)
    weights = [model.body[0].weight, model.body[3].weight, model.head.weight]
    sparsity = Group()  # the mapping covers the three weights: the group's filter keeps the rest dense
    sparsity.add(["body.0.weight", "body.3.weight", "head.weight"],
                 GMP(sparsity={weights[0]: [0.3, 0.6], weights[1]: [0.5, 0.2, 0.7], weights[2]: [0.25, 0.5]},
                     update={"freq": 3}, init_method="topk"))
    model.apply(sparsity)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    optimizer.apply(sparsity)
    loss_fn = torch.nn.NLLLoss()

    @cstorch.trace
    def training_step(inputs, targets):
        loss = loss_fn(compiled(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    history = []
    for inputs, targets in cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(input_fn, batch_size=32),
                                                           num_steps=7):
        training_step(inputs, targets)
        history.append([int(m.sum()) for m in (model.body[0].weight_mask, model.body[3].weight_mask,
                                               model.head.weight_mask)])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return {"state": state, "history": history, "sparsity": sparsity.state_dict()[0]}


def test_per_weight_cycles_on_csx_fx_are_bit_identical_to_cpu(tmp_path):
    with _reset_for_tests():
        cpu = run_mlp("CPU", tmp_path / "cpu")
    with _reset_for_tests():
        csx = run_mlp("CSX", tmp_path / "csx")
    for key, value in cpu["state"].items():
        assert torch.equal(value, csx["state"][key]), key
    # each mask's kept count after each step, by hand: int((1 - level) * numel) (numel 512, 1024, 128); the
    # update steps 3 and 6 take each cycle's next level (body.0 0.3 -> 0.6 -> 0.3, body.3 0.5 -> 0.2 -> 0.7,
    # head 0.25 -> 0.5 -> 0.25)
    expected = [[358, 512, 96]] * 2 + [[204, 819, 64]] * 3 + [[358, 307, 96]] * 2
    assert cpu["history"] == csx["history"] == expected
    assert {k: int(v["index"]) for k, v in csx["sparsity"]["sparsity"].items()} == \
        {k: int(v["index"]) for k, v in cpu["sparsity"]["sparsity"].items()} == \
        {"body.0.weight": 1, "body.3.weight": 0, "head.weight": 1}
