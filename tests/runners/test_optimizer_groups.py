"""A params file's optimizer is grouped as the Model Zoo's trainer groups it (Release 2.3+
``common/optim_utils.py: configure_param_groups``, called for every model): biases and normalization layers
get no weight decay. Checked against the rule applied by hand (the optimizers' numerics are tests/optim's),
and a checkpoint written before the runner
grouped every optimizer (its state in one group, in the model's parameter order) still resumes exactly."""

from __future__ import annotations

import torch

from cs_run.checkpoint import load, save
from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner

DECAY = {"optimizer.weight_decay": 0.1}  # the toy's SGD with momentum, now with weight decay


def _runner(params_path, tmp_path, name: str, **overrides):
    params = load_params(params_path, {**DECAY, "runconfig.model_dir": str(tmp_path / name), **overrides})
    return PyTorchBaseRunner.create(params, device="CPU")


def _weights(runner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in runner.model.state_dict().items()}


def test_biases_and_norms_get_no_weight_decay_as_the_vendors_trainer(toy_project, tmp_path):
    runner = _runner(toy_project, tmp_path, "md", **{"runconfig.max_steps": 1})
    names = {id(p): n for n, p in runner.model.named_parameters()}
    groups = [(g["weight_decay"], sorted(names[id(p)] for p in g["params"])) for g in runner.optimizer.param_groups]
    decayed = sorted(n for n, _ in runner.model.named_parameters() if "bias" not in n)  # the toy has no norm layer
    plain = sorted(n for n, _ in runner.model.named_parameters() if "bias" in n)
    assert groups == [(0.1, decayed), (0.0, plain)]


def _one_group(state: dict, runner) -> dict:
    """The optimizer state as cs-run wrote it before: one group over the trainable parameters in model order."""
    order = [p for p in runner.model.parameters() if p.requires_grad]
    index_of = {id(p): i for i, p in enumerate(order)}
    flat = [p for g in runner.optimizer.param_groups for p in g["params"]]  # the saved ids are positions in this
    saved = state["optimizer"]
    group = {k: v for k, v in saved["param_groups"][0].items() if k != "params"}
    return {"state": {index_of[id(p)]: saved["state"][i] for i, p in enumerate(flat) if i in saved["state"]},
            "param_groups": [{**group, "weight_decay": 0.1, "params": list(range(len(order)))}]}


def test_a_one_group_checkpoint_of_an_earlier_cs_run_resumes_exactly(toy_project, tmp_path):
    whole = _runner(toy_project, tmp_path, "whole", **{"runconfig.max_steps": 20})
    whole.run("train")
    first = _runner(toy_project, tmp_path, "old", **{"runconfig.max_steps": 10})
    first.run("train")
    path = tmp_path / "old" / "checkpoint_10.mdl"
    state = load(str(path))
    state["optimizer"] = _one_group(state, first)
    save(state, str(path))
    resumed = _runner(toy_project, tmp_path, "old", **{"runconfig.max_steps": 20})
    resumed.run("train")
    for key, value in _weights(whole).items():
        torch.testing.assert_close(_weights(resumed)[key], value, rtol=0, atol=0)
