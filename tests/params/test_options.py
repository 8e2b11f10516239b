"""The run/cluster options are declared once (RunConfig embedding ClusterOptions) and every front door is
generated from that declaration: cs-run's click options, run.py's argparse options, the Trainer's keys."""

from __future__ import annotations

import dataclasses
import typing

import click
import pytest

from cs_run.distributed import ClusterConfig, ClusterOptions
from cs_run.frontends.cli import cli
from cs_run.frontends.flags import COMMAND_USES, command_options, field_docs, flag_overrides, run_options, trainer_keys
from cs_run.frontends.modelzoo import _parser
from cs_run.params import RunConfig


def test_runconfig_embeds_every_cluster_option_with_the_same_default_and_range():
    rc = {f.name: f for f in dataclasses.fields(RunConfig)}
    for f in dataclasses.fields(ClusterOptions):
        assert rc[f.name].metadata == f.metadata
        assert getattr(RunConfig(), f.name) == getattr(ClusterConfig(), f.name)
    assert [f.name for f in dataclasses.fields(ClusterConfig)][:len(dataclasses.fields(ClusterOptions))] == \
        [f.name for f in dataclasses.fields(ClusterOptions)]


def test_every_field_has_its_doc_under_it():
    docs = field_docs(RunConfig)
    assert set(docs) == {f.name for f in dataclasses.fields(RunConfig)}
    assert docs["num_csx"].startswith("Data-parallel replicas, one process each")
    assert set(field_docs(ClusterConfig)) == {f.name for f in dataclasses.fields(ClusterConfig)}


@pytest.mark.parametrize("command", ["train", "eval", "train-and-eval", "eval-all", "validate-only", "compile-only"])
def test_click_options_are_the_declaration(command):
    params = {p.name: p for p in cli.commands[command].params}
    hints = typing.get_type_hints(RunConfig)
    taken = command_options(command)
    for option in run_options():
        if option not in taken:
            assert option.dest not in params
            assert not option.cli or not set(option.uses) & set(COMMAND_USES[command])
            continue
        p = params[option.dest]
        assert p.opts == [f"--{option.name}"]  # cs-run spells run flags out (short options are run.py's)
        if option.key is None:
            assert p.help == option.help
            continue
        assert p.help.startswith(field_docs(RunConfig)[option.name])
        meta = RunConfig.__dataclass_fields__[option.name].metadata
        if "min" in meta:
            assert isinstance(p.type, click.IntRange) and p.type.min == meta["min"] and p.type.max == meta.get("max")
        if "choices" in meta:
            assert tuple(p.type.choices) == meta["choices"]
        assert p.multiple == (typing.get_origin(hints[option.name]) is list)


def test_run_py_options_are_the_declaration():
    actions = {a.dest: a for a in _parser(None)._actions}
    for option in run_options():
        if not option.run_py:
            assert option.dest not in actions
            continue
        action = actions[option.dest]
        assert action.help == (field_docs(RunConfig)[option.name] if option.key else option.help)
        if option.kind == "list":
            assert action.nargs == "+"
        if option.kind == "bool":
            assert action.const is True and action.default is None
        if option.kind == "choice":  # any case, stored as declared
            assert [action.type(c.swapcase()) for c in option.choices] == list(option.choices)
    flagged = {f.name for f in dataclasses.fields(RunConfig) if "flag" in f.metadata}
    assert flagged <= set(actions)


def test_trainer_keys_are_the_declaration():
    assert trainer_keys("loop") == {k: k for k in ("max_steps", "num_steps", "num_epochs", "steps_per_epoch",
                                                   "eval_steps", "eval_frequency", "early_stopping_metric",
                                                   "early_stopping_mode", "early_stopping_patience",
                                                   "early_stopping_min_delta")}
    assert trainer_keys("checkpoint") == {"steps": "checkpoint_steps", "save_initial_checkpoint":
                                          "save_initial_checkpoint", "max_checkpoints": "max_checkpoints",
                                          "autoload": "autoload_checkpoint"}
    assert trainer_keys("logging") == {"log_steps": "log_steps", "log_level": "logging",
                                       "disable_progress_bar": "disable_progress_bar"}


def test_flag_overrides_keep_only_given_flags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    given = {"model_dir": "out", "max_steps": 0, "num_steps": None, "mount_dirs": ("/m",), "python_paths": ("p",),
             "job_labels": (), "logging": "INFO", "compile_only": None}
    assert flag_overrides(given) == {"runconfig.model_dir": str(tmp_path / "out"), "runconfig.max_steps": 0,
                                     "runconfig.logging": "INFO", "runconfig.mount_dirs": ["/m"],
                                     "runconfig.python_paths": [str(tmp_path / "p")]}


@pytest.mark.parametrize("given,flag", [({"model_dir": ""}, "--model_dir"), ({"model_dir": "  "}, "--model_dir"),
                                        ({"checkpoint_path": ""}, "--checkpoint_path"),
                                        ({"python_paths": ("p", "")}, "--python_paths")])
def test_an_empty_path_flag_is_refused(tmp_path, monkeypatch, given, flag):
    """run.py (argparse) gives strings: '' would be made the current folder (a run wrote its checkpoints there)."""
    from cs_run.errors import ParamsError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ParamsError, match=f"^{flag}: an empty path \\(it would be the current folder\\); give a name$"):
        flag_overrides(given)


def test_csx_backend_gets_every_cluster_option(toy_project, tmp_path):
    from cs_run.params import load_params
    from cs_run.runners.cs_runner import create_backend

    values = {"num_csx": 3, "max_wgt_servers": 7, "max_act_per_csx": 2, "num_workers_per_csx": 4,
              "transfer_processes": 9, "mount_dirs": [str(tmp_path)], "python_paths": [str(tmp_path)],
              "job_labels": ["a=b"], "collective_timeout": 30}
    assert set(values) == {f.name for f in dataclasses.fields(ClusterOptions)}
    params = load_params(toy_project, {f"runconfig.{k}": v for k, v in values.items()} |
                         {"runconfig.model_dir": str(tmp_path / "md")})
    backend = create_backend(params)
    assert {k: getattr(backend.cluster_config, k) for k in values} == values
