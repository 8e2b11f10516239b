"""The step options' declared range (the params fields' ``min``, which the CLI flags' ranges and the
Trainer's checks come from) is the schedule's own rule, ``check_step_options``: the help said
``[x>=0]`` for --max_steps / --num_steps / --num_epochs while a run refused 0 ("must be >= 1")."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import yaml
from click.testing import CliRunner

import cs_run
from cs_run.frontends.cli import cli
from cs_run.frontends.flags import run_options
from cs_run.frontends.trainer import Trainer
from cs_run.params import OptimizerParams, RunConfig
from cs_run.schedule import check_step_options

STEP_OPTIONS = {"num_steps": RunConfig, "max_steps": RunConfig, "num_epochs": RunConfig,
                "steps_per_epoch": RunConfig, "grad_accum_steps": OptimizerParams}
FLAGS = ("max_steps", "num_steps", "num_epochs")


def _least_accepted(name: str) -> int:
    """The least value check_step_options accepts for ``name``, found by asking it."""
    for value in range(-3, 4):
        try:
            check_step_options(**{"max_steps": 5, name: value})  # steps_per_epoch alone is no length
        except ValueError:
            continue
        return value
    raise AssertionError(f"check_step_options accepts no value of {name} in -3..3")


@pytest.mark.parametrize("name", sorted(STEP_OPTIONS))
def test_each_step_options_declared_minimum_is_the_schedules_rule(name):
    fields = {f.name: f for f in dataclasses.fields(STEP_OPTIONS[name])}
    assert fields[name].metadata["min"] == _least_accepted(name) == 1


def test_the_flags_range_is_the_declared_one():
    options = {o.key: o for o in run_options()}
    assert {key: options[key].minimum for key in FLAGS} == dict.fromkeys(FLAGS, 1)
    help_text = " ".join(CliRunner().invoke(cli, ["train", "--help"]).output.split())
    for key in FLAGS:  # each flag's own help entry ends with its range (after its default)
        assert re.search(rf"--{key} INTEGER RANGE [^\[]*\[[^\]]*; x>=(\d+)\]", help_text).group(1) == "1", key


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_flag_below_the_range_is_a_usage_error_before_anything_is_made(toy_project, tmp_path, flag, value):
    md = tmp_path / "md"
    result = CliRunner().invoke(cli, ["train", "--params", str(toy_project), "--model_dir", str(md), f"--{flag}", value])
    assert result.exit_code == 2
    assert f"Error: Invalid value for '--{flag}': {value} is not in the range x>=1." in result.output
    assert result.output.count("Error:") == 1 and not md.exists()


@pytest.mark.parametrize("key", FLAGS)
def test_set_0_names_the_command_line_not_the_params_file(toy_project, tmp_path, key):
    # before, the schedule's refusal was located at the params file's runconfig line
    md = tmp_path / "md"
    result = CliRunner().invoke(cli, ["train", "--params", str(toy_project), "--model_dir", str(md),
                                      "--set", f"runconfig.{key}=0"])
    assert result.exit_code == 2
    assert f"Error: params: runconfig.{key}: must be >= 1, got 0 (set on the command line)" in result.output
    assert result.output.count("Error:") == 1 and not md.exists()


@pytest.mark.parametrize("flag", FLAGS)
def test_the_least_value_in_the_range_runs(toy_project, tmp_path, flag):
    args = ["train", "--params", str(toy_project), "--model_dir", str(tmp_path / "md"), f"--{flag}", "1"]
    if flag == "num_epochs":
        args += ["--set", "runconfig.steps_per_epoch=2"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("key", FLAGS)
def test_a_params_file_and_the_trainer_refuse_0_naming_the_key(toy_project, tmp_path, key):
    raw = yaml.safe_load(toy_project.read_text())
    raw["runconfig"].pop("max_steps")
    raw["runconfig"][key] = 0
    path = tmp_path / "zero.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    line = path.read_text().splitlines().index(f"  {key}: 0") + 1
    with pytest.raises(ValueError, match=rf"^params: runconfig.{key}: must be >= 1, got 0 \({path}:{line}\)$"):
        cs_run.params.load_params(path)
    with pytest.raises(ValueError, match=rf"loop.{key}|runconfig.{key}: must be >= 1, got 0"):
        Trainer(device="CPU", model_dir=str(tmp_path / "md"), model=torch.nn.Linear(2, 2), loop={key: 0})
    assert not (tmp_path / "md").exists()
