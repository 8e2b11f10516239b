"""The cs-run command line: help, exit codes, one-line errors, resume, custom runners."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cs_run.frontends.cli import cli

SUBCOMMANDS = ["train", "eval", "train-and-eval", "eval-all", "validate-only", "compile-only"]
# In RunConfig's declaration order (its own fields, then ClusterOptions' in the vendor's order), then the
# flags that are not one key, --set last. Each command takes the flags that change what it does.
_CLUSTER = ["--num_csx", "--max_wgt_servers", "--max_act_per_csx", "--num_workers_per_csx", "--transfer_processes",
            "--mount_dirs", "--python_paths", "--job_labels", "--collective_timeout"]
FLAGS = {
    "train": ["--model_dir", "--max_steps", "--num_steps", "--num_epochs", "--seed", "--checkpoint_path", "--logging",
              "--runner", "--sharding", "--offload", "--compile_dir", "--compile_tier", *_CLUSTER, "--resume",
              "--print_config"],
    "eval": ["--model_dir", "--eval_steps", "--seed", "--checkpoint_path", "--logging", "--runner", "--sharding",
             "--offload", "--compile_dir", "--compile_tier", *_CLUSTER, "--print_config"],
    "train-and-eval": ["--model_dir", "--max_steps", "--num_steps", "--num_epochs", "--eval_steps", "--seed",
                       "--checkpoint_path", "--logging", "--runner", "--sharding", "--offload", "--compile_dir",
                       "--compile_tier", *_CLUSTER,
                       "--resume", "--print_config"],
    "eval-all": ["--model_dir", "--eval_steps", "--seed", "--logging", "--runner", "--sharding", "--offload",
                 "--compile_dir", "--compile_tier",
                 *_CLUSTER, "--print_config"],
    "validate-only": ["--mode", "--model_dir", "--logging", "--runner", "--compile_dir", "--compile_tier", *_CLUSTER,
                      "--print_config"],
}
FLAGS["compile-only"] = FLAGS["validate-only"]


def invoke(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def test_help_lists_only_working_subcommands():
    result = invoke("--help")
    assert result.exit_code == 0
    listed = [line.split()[0] for line in result.output.split("Commands:")[1].strip().splitlines()]
    assert set(SUBCOMMANDS) <= set(listed)
    assert {"checkpoint", "plot"} <= set(listed)


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_subcommand_flags_are_frozen(command):
    """Adding or removing a flag is a deliberate change: update this list with it."""
    result = invoke(command, "--help")
    assert result.exit_code == 0
    flags = [opt for param in cli.commands[command].params for opt in param.opts if opt.startswith("--")]
    assert flags == FLAGS[command][:1] * (command.endswith("-only")) + ["--params", "--device"] + \
        FLAGS[command][command.endswith("-only"):] + ["--set"]
    assert all(flag in result.output for flag in flags)


@pytest.mark.parametrize("args, message", [
    (["--set", "runconfig.max_stesp=5"], "params: unknown key runconfig.max_stesp; did you mean 'max_steps'?"),
    (["--set", "runconfig.log_steps=abc"], "params: runconfig.log_steps: expected an integer, got str 'abc'"),
    (["--params", "missing.yaml"], "params file not found"),
    (["--set", "novalue"], "--set expects KEY=VALUE"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, message):
    result = invoke("train", "--model_dir", tmp_path / "md", *args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0]
    assert "Traceback" not in result.output
    assert not (tmp_path / "md").exists()  # nothing was written


def test_misspelled_key_in_file_names_file_and_line(toy_project, tmp_path):
    text = toy_project.read_text().replace("log_steps:", "log_stesp:")
    toy_project.write_text(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "log_stesp" in t)
    result = invoke("train", "--params", toy_project, "--model_dir", tmp_path / "md")
    assert result.exit_code == 2
    assert f"({toy_project}:{line})" in result.output and "did you mean 'log_steps'" in result.output


def test_unknown_option_and_bad_choice_are_usage_errors():
    assert invoke("train", "--max_stesp", 5).exit_code == 2
    assert invoke("train", "--device", "TPU").exit_code == 2


def test_train_then_resume_from_cli(toy_project, tmp_path):
    md = tmp_path / "md"
    first = invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 5)
    assert first.exit_code == 0, first.output
    second = invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 8)
    assert second.exit_code == 0, second.output
    assert "Resuming from checkpoint" in second.output and "checkpoint_5.mdl at global step 5" in second.output
    assert "Training 3 steps (global step 5 -> 8)" in second.output
    assert (md / "checkpoint_8.mdl").is_file() and (md / "params_resolved.yaml").is_file()
    assert "Resuming" in (md / "run.log").read_text()


def test_eval_prints_results_and_nan_exits_1(toy_project, tmp_path):
    md = tmp_path / "md"
    result = invoke("train-and-eval", "--params", toy_project, "--model_dir", md, "--max_steps", 3)
    assert result.exit_code == 0, result.output
    assert "eval/loss = " in result.output
    nan = invoke("train", "--params", toy_project, "--model_dir", tmp_path / "nan", "--max_steps", 3,
                 "--set", "train_input.nan_at=0", "--set", "train_input.shuffle=false")
    assert nan.exit_code == 1 and "Error: loss is nan at step 1" in nan.output


def test_custom_runner_from_cli(toy_project, tmp_path):
    import importlib

    result = invoke("train", "--params", toy_project, "--model_dir", tmp_path / "md", "--max_steps", 2,
                    "--runner", "toy_models:RecordingRunner")
    assert result.exit_code == 0, result.output
    assert importlib.import_module("toy_models").CALLS[:2] == ["on_train_start", "on_train_epoch_start"]


def test_autoloading_an_incompatible_checkpoint_says_how_to_start_fresh(toy_project, tmp_path):
    md = tmp_path / "md"
    assert invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 2).exit_code == 0
    result = invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 4, "--set", "model.hidden=16")
    assert result.exit_code == 2
    assert "model.net.0.weight" in result.output and "--resume none" in result.output


def test_lazily_loaded_commands_are_listed_with_their_own_short_help():
    """cs-run --help lists the subsystems from cli.SUBSYSTEMS without importing them; that table must say
    what the commands themselves say."""
    import click

    from cs_run.frontends.cli import SUBSYSTEMS

    listed = invoke("--help").output.split("Commands:")[1]  # before any subsystem is imported by get_command
    for name, (_, summary) in SUBSYSTEMS.items():
        command = cli.get_command(None, name)
        assert command is not None and command.name == name
        assert command.get_short_help_str(1000) == click.Command(name, help=summary).get_short_help_str(1000)
        row = next(line for line in listed.splitlines() if line.startswith(f"  {name} "))
        assert summary.startswith(row.split(None, 1)[1].removesuffix("...").rstrip("."))
