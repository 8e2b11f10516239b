"""runconfig.load_checkpoint_states (the Model Zoo's LoadCheckpointStates callback): a training run that
starts from a checkpoint loads only the named states; the others start fresh."""

from __future__ import annotations

import torch
from click.testing import CliRunner

from cs_run.checkpoint import load
from cs_run.frontends.cli import cli


def _train(params, model_dir, *extra):
    return CliRunner().invoke(cli, ["train", "--params", str(params), "--model_dir", str(model_dir), *extra])


def test_model_only_restarts_the_step_and_the_optimizer(toy_project, tmp_path):
    first = _train(toy_project, tmp_path / "a", "--max_steps", "3")
    assert first.exit_code == 0, first.output
    start = tmp_path / "a" / "checkpoint_3.mdl"
    weights = {k: v.clone() for k, v in load(str(start))["model"].items()}
    # all states: the run resumes at step 3 and goes on to 5
    resumed = _train(toy_project, tmp_path / "b", "--max_steps", "5", "--checkpoint_path", str(start))
    assert resumed.exit_code == 0, resumed.output
    assert sorted(p.name for p in (tmp_path / "b").glob("checkpoint_*.mdl")) == ["checkpoint_5.mdl"]
    # model only: the weights of step 3, the step and optimizer state fresh (5 steps from step 0)
    fresh = _train(toy_project, tmp_path / "c", "--max_steps", "1", "--checkpoint_path", str(start),
                   "--set", "runconfig.load_checkpoint_states=model", "--set", "optimizer.learning_rate=0.0")
    assert fresh.exit_code == 0, fresh.output
    state = load(str(tmp_path / "c" / "checkpoint_1.mdl"))
    assert int(state["global_step"]) == 1
    for key, value in weights.items():  # lr 0: one step leaves the loaded weights as they were
        assert torch.equal(state["model"][key], value), key


def test_a_state_the_checkpoint_lacks_is_an_error(toy_project, tmp_path):
    assert _train(toy_project, tmp_path / "a", "--max_steps", "2").exit_code == 0
    result = _train(toy_project, tmp_path / "b", "--max_steps", "4", "--checkpoint_path",
                    str(tmp_path / "a" / "checkpoint_2.mdl"), "--set", "runconfig.load_checkpoint_states=model,weights")
    assert result.exit_code == 2
    assert "Error: params: runconfig.load_checkpoint_states: weights not in checkpoint_2.mdl, which holds" in result.output
