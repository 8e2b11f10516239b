"""Per-command flags, one meaning per short option, --resume, --print_config, and the params file's folder
on sys.path."""

from __future__ import annotations

import sys

import click
import pytest
import yaml
from click.testing import CliRunner

from cs_run.frontends.cli import cli
from cs_run.frontends.flags import COMMAND_USES, command_options, run_options
from cs_run.params import load_params


def invoke(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def _one_error_line(result):
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def _refused():
    """(command, flag) for every declared cs-run flag a run command does not take."""
    return [(command, option) for command in COMMAND_USES for option in run_options()
            if option.cli and option not in command_options(command)]


@pytest.mark.parametrize("command, option", _refused(), ids=lambda x: x if isinstance(x, str) else x.name)
def test_a_flag_of_another_command_is_a_usage_error_naming_the_commands_that_take_it(command, option, tmp_path):
    value = [] if option.kind == "bool" else ["3"]
    result = invoke(command, "--model_dir", tmp_path / "md", f"--{option.name}", *value)
    assert result.exit_code == 2
    takers = [name for name in COMMAND_USES if option in command_options(name)]
    assert _one_error_line(result) == (f"Error: --{option.name} does not apply to 'cli {command}'; the commands that "
                                       f"take it: {', '.join(takers)} (see 'cli {command} --help')")
    assert not (tmp_path / "md").exists()


def test_eval_refuses_the_training_budget():
    for flag in ("--num_epochs", "--num_steps", "--max_steps", "--resume"):
        assert flag not in invoke("eval", "--help").output
        assert flag in invoke("train", "--help").output
    result = invoke("eval", "--num_epochs", 3)
    assert result.exit_code == 2 and "--num_epochs does not apply to 'cli eval'" in result.output


def _walk(command, path=()):
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _walk(sub, (*path, name))


def test_a_short_option_means_one_thing_in_every_command():
    meaning: dict[str, set] = {}
    for _path, command in _walk(cli):
        for param in (p for p in command.params if isinstance(p, click.Option)):
            longs = [o for o in param.opts + param.secondary_opts if o.startswith("--")]
            for short in (o for o in param.opts if not o.startswith("--")):
                meaning.setdefault(short, set()).add(longs[0])
    assert meaning, "no short options found"
    assert {short: names for short, names in meaning.items() if len(names) > 1} == {}
    assert "-o" not in {o for _, c in _walk(cli) for p in c.params if p.name == "model_dir" for o in p.opts}


def test_print_config_prints_the_resolved_params_and_runs_nothing(toy_project, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    md = tmp_path / "md"
    before = sorted(tmp_path.rglob("*"))
    result = invoke("train", "--params", toy_project, "--model_dir", md, "--seed", 11, "--set", "model.hidden=5",
                    "--print_config")
    assert result.exit_code == 0, result.output
    printed = yaml.safe_load(result.output)
    expected = load_params(toy_project, {"runconfig.model_dir": str(md), "runconfig.seed": 11, "model.hidden": 5})
    assert printed == expected.to_dict()
    assert printed["runconfig"]["seed"] == 11 and printed["model"]["hidden"] == 5
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, no model_dir


def test_print_config_of_a_bad_params_file_is_the_params_error(toy_project, tmp_path):
    result = invoke("eval", "--params", toy_project, "--set", "runconfig.log_stesp=3", "--print_config")
    assert result.exit_code == 2 and "did you mean 'log_steps'" in _one_error_line(result)


def _steps_of(output):
    return [line for line in output.splitlines() if "Training" in line and "steps (global step" in line]


def test_resume_auto_none_and_path(toy_project, tmp_path):
    md = tmp_path / "md"
    base = ["train", "--params", toy_project, "--model_dir", md, "--set", "runconfig.checkpoint_steps=2"]
    assert invoke(*base, "--max_steps", 4).exit_code == 0
    auto = invoke(*base, "--max_steps", 6, "--resume", "auto")
    assert auto.exit_code == 0, auto.output
    assert "(global step 4 -> 6)" in _steps_of(auto.output)[0]
    path = invoke(*base, "--max_steps", 5, "--resume", md / "checkpoint_2.mdl", "--model_dir", tmp_path / "branch")
    assert path.exit_code == 0, path.output
    assert "(global step 2 -> 5)" in _steps_of(path.output)[0]
    none = invoke(*base, "--max_steps", 3, "--resume", "none", "--model_dir", tmp_path / "fresh")
    assert none.exit_code == 0, none.output
    assert "(global step 0 -> 3)" in _steps_of(none.output)[0]
    # none ignores a checkpoint_path in the params file, and model_dir's own checkpoints
    again = invoke(*base, "--max_steps", 2, "--resume", "none", "--set", f"runconfig.checkpoint_path={md}/checkpoint_6.mdl",
                   "--model_dir", tmp_path / "fresh2")
    assert again.exit_code == 0 and "(global step 0 -> 2)" in _steps_of(again.output)[0]
    assert sorted(p.name for p in md.glob("checkpoint_*.mdl")) == ["checkpoint_2.mdl", "checkpoint_4.mdl",
                                                                    "checkpoint_6.mdl"]


@pytest.mark.parametrize("args, message", [
    (["--resume", "x.mdl", "--checkpoint_path", "y.mdl"], "--resume and --checkpoint_path: give one of them"),
    (["--resume", ""], "--resume: expected auto, none or a checkpoint file"),
])
def test_bad_resume_is_one_error_line(args, message, toy_project, tmp_path):
    result = invoke("train", "--params", toy_project, "--model_dir", tmp_path / "md", *args)
    assert result.exit_code == 2 and message in _one_error_line(result)
    assert not (tmp_path / "md").exists()


def test_resume_from_a_missing_file_names_the_flag(toy_project, tmp_path):
    result = invoke("train", "--params", toy_project, "--model_dir", tmp_path / "md", "--resume", tmp_path / "no.mdl")
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 2 and errors == [f"Error: --resume: checkpoint '{tmp_path / 'no.mdl'}' does not exist; "
                                                "give a checkpoint file, auto (the newest in model_dir) or none"]
    assert not (tmp_path / "md").exists()


def test_seed_flag_decides_the_run(toy_project, tmp_path):
    def losses(seed, name):
        result = invoke("train", "--params", toy_project, "--model_dir", tmp_path / name, "--max_steps", 3,
                        "--seed", seed, "--set", "model.dropout=0.5")
        assert result.exit_code == 0, result.output
        return [line.split("Loss=")[1].split(",")[0] for line in result.output.splitlines() if "Loss=" in line]

    assert losses(7, "a") == losses(7, "b") != losses(8, "c")


PROJECT_MODULE = '''
import torch
from torch.utils.data import DataLoader, TensorDataset


def build(width: int = 3):
    return Reg(width)


class Reg(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = torch.nn.Linear(width, 1)

    def forward(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self.fc(x), y)


def data(split, batch_size, width: int = 3):
    x = torch.randn(16, width)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=batch_size)
'''


def test_the_params_files_folder_is_on_sys_path(tmp_path, monkeypatch):
    """A project folder that is neither the current folder nor on PYTHONPATH: its module imports by name."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "beside_params_model.py").write_text(PROJECT_MODULE)
    (project / "params.yaml").write_text(
        "train_input: {data_fn: 'beside_params_model:data', batch_size: 4}\n"
        "model: {name: 'beside_params_model:build'}\n"
        "optimizer: {optimizer_type: SGD, learning_rate: 0.01}\n"
        "runconfig: {max_steps: 2, log_steps: 1}\n")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    monkeypatch.delitem(sys.modules, "beside_params_model", raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = invoke("train", "--params", project / "params.yaml", "--model_dir", tmp_path / "md")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "md" / "checkpoint_2.mdl").is_file()
    assert sys.path[0] == str(project)
