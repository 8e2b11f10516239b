"""``Trainer(schedulers=[...])``: the vendor Trainer's list of schedulers, stepped side by side.

Release 2.10's Trainer (``trainer/callbacks/schedulers.py``: SchedulersCallback) takes a scheduler, a callable
``(optimizer) -> scheduler`` or a list of them; each is stepped after every optimizer step and each sets its own
``param_group_key`` (lr, weight_decay) of the groups its ``param_group_tags`` name. The values each step trains
with are checked against the schedules' closed forms by hand, and the checkpoint holds the list of states as the
params form's ``optimizer.schedulers`` does (``{"schedulers": [...]}``).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import cs_run
from cs_run.backend import _reset_for_tests
from cs_run.checkpoint import load
from cs_run.errors import ParamsError
from cs_run.frontends.trainer import Trainer
from cs_run.optim.lr_scheduler import ConstantLR, LinearLR
from cs_run.optim.weight_decay_scheduler import ConstantWD, CosineDecayWD
from cs_run.runners import PyTorchRunner

STEPS = 5


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.last = torch.nn.Linear(4, 6), torch.nn.Linear(6, 2)

    def forward(self, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.last(torch.relu(self.first(x))), y)


def _loader():
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(40, 4, generator=g), torch.randint(0, 2, (40,), generator=g)),
                      batch_size=4, shuffle=False)


class _Recorder(PyTorchRunner):
    """Records (lr, weight_decay) of every param group as each step starts: the values its optimizer step uses."""

    seen: list = []

    def on_train_batch_start(self, data):
        _Recorder.seen.append([(float(g["lr"]), float(g["weight_decay"])) for g in self.optimizer.param_groups])
        return data


def _optimizer(model):
    """The groups a params section's ``params`` tags make of this model: each tag's weights, then its biases (no
    weight decay on them, the Model Zoo's default)."""
    return cs_run.optim.SGD([{"params": [model.first.weight], "tags": {"first"}},
                             {"params": [model.first.bias], "tags": {"first"}, "weight_decay": 0.0},
                             {"params": [model.last.weight], "tags": {"last"}},
                             {"params": [model.last.bias], "tags": {"last"}, "weight_decay": 0.0}],
                            lr=0.5, weight_decay=0.3)


def _fit(tmp_path, schedulers_of, device: str = "CPU", max_steps: int = STEPS) -> tuple[list, dict]:
    """A fit to ``max_steps`` (from model_dir's last checkpoint, if any) with ``schedulers_of(optimizer)``: the
    groups' values at each step (CPU) and the last checkpoint."""
    _Recorder.seen = []
    with _reset_for_tests():
        model = _Net()
        optimizer = _optimizer(model)
        Trainer(device=device, model_dir=str(tmp_path / "md"), model=model, optimizer=optimizer,
                schedulers=schedulers_of(optimizer), loop={"max_steps": max_steps}, checkpoint={"steps": max_steps},
                runner=_Recorder if device == "CPU" else None).fit(_loader())
    return _Recorder.seen, load(str(tmp_path / "md" / f"checkpoint_{max_steps}.mdl"))


def _lr_and_wd(opt):
    """LinearLR 0.1 -> 0.02 over 4 steps of every group, CosineDecayWD 0.2 -> 0 over 4 steps of the 'first' ones."""
    return [LinearLR(opt, initial_learning_rate=0.1, end_learning_rate=0.02, total_iters=4),
            CosineDecayWD(opt, initial_val=0.2, end_val=0.0, total_iters=4, param_group_tags="first")]


def test_a_list_of_an_lr_and_a_weight_decay_schedule_sets_both_every_step(tmp_path):
    """LinearLR 0.1 -> 0.02 over 4 steps (every group, an object) and CosineDecayWD 0.2 -> 0.0 over 4 steps of the
    'first' groups (a callable, built on the run's optimizer): step k trains with the value at k - 1, by hand; the
    'last' groups keep their weight decay (0.3, 0.0). Fails before the fix (the Trainer refused a list)."""
    seen, state = _fit(tmp_path, lambda opt: [
        LinearLR(opt, initial_learning_rate=0.1, end_learning_rate=0.02, total_iters=4),
        lambda run_opt: CosineDecayWD(run_opt, initial_val=0.2, end_val=0.0, total_iters=4, param_group_tags="first")])
    for k, groups in enumerate(seen):
        t = min(k, 4)
        lr = 0.1 + (0.02 - 0.1) * t / 4
        wd = 0.0 + (0.2 - 0.0) * (1 + math.cos(math.pi * t / 4)) / 2
        assert groups == [pytest.approx((lr, wd), rel=1e-6, abs=1e-7)] * 2 + [pytest.approx((lr, 0.3), rel=1e-6),
                                                                             pytest.approx((lr, 0.0), rel=1e-6)], k
    assert len(seen) == STEPS
    states = state["lr_scheduler"]["schedulers"]  # the params form's layout: a list, one state per schedule
    assert [int(s["last_epoch"]) for s in states] == [STEPS, STEPS]


_MAPPINGS = [{"LinearLR": {"initial_learning_rate": 0.1, "end_learning_rate": 0.02, "total_iters": 4}},
             {"CosineDecayWD": {"initial_val": 0.2, "end_val": 0.0, "total_iters": 4, "param_group_tags": "first"}}]
"""The two schedules of the tests above as the YAML form writes them."""


@pytest.mark.parametrize("where", ["section", "argument"])
def test_the_list_form_trains_as_the_params_forms_schedulers(tmp_path, where):
    """The same two schedules as ``optimizer.schedulers`` of a params section, or as the YAML form's
    ``schedulers`` mappings beside a section: the same weights after 5 steps, bit for bit."""
    _, state = _fit(tmp_path / "list", _lr_and_wd)
    with _reset_for_tests():
        model = _Net()
        section = {"optimizer_type": "SGD", "weight_decay": 0.3,
                   "params": [{"params": "first.*", "tag": "first"}, {"params": "last.*", "tag": "last"}]}
        arguments = {"optimizer": {**section, "schedulers": _MAPPINGS}} if where == "section" else \
            {"optimizer": section, "schedulers": _MAPPINGS}
        Trainer(device="CPU", model_dir=str(tmp_path / "params"), model=model, loop={"num_steps": STEPS},
                checkpoint={"steps": STEPS}, **arguments).fit(_loader())
    other = load(str(tmp_path / "params" / f"checkpoint_{STEPS}.mdl"))
    for key, value in other["model"].items():
        torch.testing.assert_close(state["model"][key], value, rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("schedulers_of, message", [
    (lambda opt: [ConstantLR(opt, learning_rate=0.1), ConstantLR(opt, learning_rate=0.2)],
     r"^Trainer: schedulers\[0\] \(ConstantLR\) and schedulers\[1\] \(ConstantLR\) both set 'lr' and at least one "
     r"names no param_group_tags"),
    (lambda opt: [ConstantWD(opt, val=0.1, param_group_tags="first"),
                  ConstantWD(opt, val=0.2, param_group_tags={"first", "last"})],
     r"^Trainer: schedulers\[0\] \(ConstantWD\) and schedulers\[1\] \(ConstantWD\) both set 'weight_decay' of the "
     r"groups tagged \['first'\]"),
    (lambda opt: [ConstantLR(opt, learning_rate=0.1), 5],
     r"^Trainer: schedulers\[1\] must be a scheduler or a callable \(optimizer\) -> scheduler, got int 5$"),
], ids=["two_lr_schedules_of_every_group", "two_wd_schedules_of_one_tag", "not_a_scheduler"])
def test_a_bad_list_is_one_error_naming_the_entries(tmp_path, schedulers_of, message):
    """The vendor's SchedulersCallback rules (two schedules of one key and group), and an entry of another kind."""
    with _reset_for_tests():
        model = _Net()
        optimizer = _optimizer(model)
        with pytest.raises(ParamsError, match=message):
            Trainer(device="CPU", model_dir=str(tmp_path / "md"), model=model, optimizer=optimizer,
                    schedulers=schedulers_of(optimizer), loop={"num_steps": 2}).fit(_loader())
    assert not list((tmp_path / "md").glob("checkpoint_*"))


@pytest.mark.parametrize("section, schedulers_of, message", [
    (True, lambda opt: [ConstantLR(opt, learning_rate=0.1)],
     r"^Trainer: schedulers with an optimizer params section: give them as \[\{'CosineDecayLR': \{\.\.\.\}\}, "
     r"\.\.\.\] mappings"),
    (True, lambda opt: _MAPPINGS[:1] + [ConstantWD(opt, val=0.1)], r"^Trainer: schedulers with an optimizer params "
                                                                    r"section"),
    (False, lambda opt: [ConstantWD(opt, val=0.1)] + _MAPPINGS[:1],
     r"^Trainer: schedulers\[1\] is a params mapping \{'LinearLR': .*, which an optimizer params section builds"),
], ids=["object_beside_a_section", "object_among_mappings", "mapping_beside_an_optimizer_object"])
def test_schedulers_of_the_other_optimizer_form_are_refused(tmp_path, section, schedulers_of, message):
    """A section builds its optimizer in the run, so a scheduler object (bound to another optimizer) cannot be its
    schedule (it was dropped without a word before); a mapping needs a section to build it."""
    model = _Net()
    optimizer = _optimizer(model)
    with pytest.raises(ParamsError, match=message):
        Trainer(device="CPU", model_dir=str(tmp_path / "md"), model=model,
                optimizer={"optimizer_type": "SGD", "learning_rate": 0.1} if section else optimizer,
                schedulers=schedulers_of(optimizer))


def test_a_resumed_fit_continues_every_schedule(tmp_path):
    """3 steps, then a new Trainer on the same model_dir to step 5: steps 4 and 5 train with the values of one
    5-step fit (each schedule's state restored from the checkpoint's list)."""
    whole, _ = _fit(tmp_path / "whole", _lr_and_wd)
    first, _ = _fit(tmp_path / "parts", _lr_and_wd, max_steps=3)
    rest, state = _fit(tmp_path / "parts", _lr_and_wd, max_steps=STEPS)
    assert first + rest == whole and len(rest) == 2
    assert [int(s["last_epoch"]) for s in state["lr_scheduler"]["schedulers"]] == [STEPS, STEPS]


def test_the_list_trains_the_same_weights_on_csx(tmp_path):
    """The traced step (CSX engine) with both schedules: the CPU fit's weights and schedule states, bit for bit."""
    _, cpu = _fit(tmp_path / "cpu", _lr_and_wd)
    _, csx = _fit(tmp_path / "csx", _lr_and_wd, device="CSX")
    for key, value in cpu["model"].items():
        torch.testing.assert_close(csx["model"][key], value, rtol=0, atol=0, msg=key)
    assert csx["lr_scheduler"] == cpu["lr_scheduler"]
