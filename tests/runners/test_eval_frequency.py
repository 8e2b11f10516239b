"""runconfig.eval_frequency follows the Model Zoo: only train_and_eval evaluates during training (the
2.10 runner sets ``trainer.loop.eval_frequency = None`` for mode train; 1.8-2.1's run.py used the key
only in train_and_eval), every eval_frequency steps (or, a float, that fraction of the run's steps)
counted from the run's start, and once at its end."""

from __future__ import annotations

import logging
import math

import pytest
from click.testing import CliRunner

from cs_run.frontends.cli import cli
from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner
from cs_run.summaries import read_scalars


def vendor_eval_steps(start: int, total: int, eval_frequency: int) -> list[int]:
    """The global steps the Model Zoo 2.10 Trainer validates at in a fit of ``total`` steps from ``start``
    (run_schedule._build_train_schedule: stages of min(eval_frequency, total) steps, a validation after
    each, the last stage shorter), written out by hand."""
    stage = math.ceil(eval_frequency * total) if isinstance(eval_frequency, float) else min(eval_frequency, total)
    stages = -(-total // stage)
    return [start + min((i + 1) * stage, total) for i in range(stages)]


def _run(toy_project, model_dir, mode, **keys):
    params = load_params(toy_project, {"runconfig.model_dir": str(model_dir), "runconfig.checkpoint_steps": 0,
                                       **{f"runconfig.{k}": v for k, v in keys.items()}})
    return PyTorchBaseRunner.create(params, device="CPU", mode=mode).run(mode)


def _eval_steps(model_dir):
    return [step for step, _ in read_scalars(model_dir / "eval").get("loss", [])]


def test_train_never_evaluates_and_says_so(toy_project, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="cs_run.runners"):
        results = _run(toy_project, tmp_path / "md", "train", max_steps=6, eval_frequency=2)
    assert results == {}
    assert _eval_steps(tmp_path / "md") == []
    assert "runconfig.eval_frequency=2 has no effect here: only train_and_eval" in caplog.text


@pytest.mark.parametrize("start, max_steps, eval_frequency", [(0, 6, 2), (0, 7, 3), (0, 4, 10), (3, 9, 2), (3, 10, 4),
                                                             (0, 6, 0.5), (0, 7, 0.3), (2, 7, 1.0), (3, 10, 0.25)])
def test_train_and_eval_evaluates_where_the_vendor_does(toy_project, tmp_path, start, max_steps, eval_frequency):
    md = tmp_path / "md"
    if start:
        _run(toy_project, md, "train", max_steps=start)
    results = _run(toy_project, md, "train_and_eval", max_steps=max_steps, eval_frequency=eval_frequency)
    steps = _eval_steps(md)
    assert steps == vendor_eval_steps(start, max_steps - start, eval_frequency)  # each step once
    final = read_scalars(md / "eval")["loss"][-1]
    assert final == (max_steps, pytest.approx(results["eval/loss"]))


def test_one_runner_evaluates_during_training_only_in_its_train_and_eval_run(toy_project, tmp_path):
    """A runner run twice (train_and_eval, then train to a later step) follows each run's mode: the train run
    evaluates nowhere, as a train run of its own does, and a later train_and_eval evaluates again."""
    md = tmp_path / "md"
    params = load_params(toy_project, {"runconfig.model_dir": str(md), "runconfig.checkpoint_steps": 0,
                                       "runconfig.max_steps": 4, "runconfig.eval_frequency": 2})
    runner = PyTorchBaseRunner.create(params, device="CPU", mode="train_and_eval")
    runner.run("train_and_eval")
    assert _eval_steps(md) == [2, 4]
    runner.params.runconfig.max_steps = 8
    assert runner.run("train") == {}
    assert _eval_steps(md) == [2, 4]
    runner.params.runconfig.max_steps = 12
    runner.run("train_and_eval")
    assert _eval_steps(md) == [2, 4, 10, 12]


def test_the_cli_train_with_eval_frequency_writes_no_eval_results(toy_project, tmp_path):
    md = tmp_path / "md"
    result = CliRunner().invoke(cli, ["train", "--params", str(toy_project), "--model_dir", str(md), "--max_steps", "4",
                                      "--set", "runconfig.eval_frequency=2"])
    assert result.exit_code == 0, result.output
    assert "| Eval" not in result.output and _eval_steps(md) == []
    result = CliRunner().invoke(cli, ["train-and-eval", "--params", str(toy_project), "--model_dir", str(md),
                                      "--max_steps", "8", "--set", "runconfig.eval_frequency=2"])
    assert result.exit_code == 0, result.output
    assert _eval_steps(md) == [6, 8]
    assert result.output.count("| Eval") == 2


@pytest.mark.parametrize("value, message", [
    (1.5, r"runconfig.eval_frequency: a float is the fraction of the run's steps between evaluations, in \(0, 1\]; "
          r"got 1.5"),
    (0, r"runconfig.eval_frequency: must be > 0, got 0"),
    (-0.5, r"runconfig.eval_frequency: must be > 0, got -0.5"),
])
def test_an_eval_frequency_out_of_the_vendors_range_is_a_params_error(toy_project, value, message):
    from cs_run.errors import ParamsError

    with pytest.raises(ParamsError, match=message):
        load_params(toy_project, {"runconfig.eval_frequency": value})
