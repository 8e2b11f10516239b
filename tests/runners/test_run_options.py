"""Run options are checked once, when the run is resolved, and carried typed (docs/architecture.md#run-options);
the train loop's counters are one Progress.

The counts are the point: a `cs-run train` checks its step options once at load and once when the run is
resolved (which adds the training rule), computes its step budget once, resolves its start checkpoint once
(one broadcast among replicas), and a `compile_tier` reaches the engine as the CompileTier the params load
checked, with no second check on the way.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import cs_run
from cs_run import parallel, replicas, schedule
from cs_run import params as params_module
from cs_run.backend import BACKEND_TYPES
from cs_run.engine import EngineOptions
from cs_run.errors import ParamsError
from cs_run.frontends import modelzoo
from cs_run.frontends.cli import cli
from cs_run.params import CompileTier, RunConfig, load_params
from cs_run.runners import MODES, PyTorchBaseRunner
from cs_run.runners import _run_options as options_module
from cs_run.runners._progress import Progress
from cs_run.runners._run_options import RunOptions


@pytest.fixture
def counted(monkeypatch):
    """Calls of the checks and resolutions a run should make once, counted where they are defined."""
    calls: collections.Counter[str] = collections.Counter()

    def count(owner, name, label):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            calls[label] += 1
            return original(*args, **kwargs)
        monkeypatch.setattr(owner, name, wrapper)

    count(schedule, "check_step_options", "check_step_options")  # what StepOptions runs
    count(params_module, "check_step_options", "check_step_options")  # the params load's, by its own import
    count(schedule.StepOptions, "budget", "budget")
    count(replicas, "broadcast_object", "broadcast")
    parse = CompileTier.parse.__func__

    def counted_parse(cls, *args, **kwargs):
        calls["parse"] += 1
        return parse(cls, *args, **kwargs)
    monkeypatch.setattr(CompileTier, "parse", classmethod(counted_parse))
    return calls


def _train(toy_project, model_dir, *more):
    result = CliRunner().invoke(cli, list(map(str, ["train", "--params", toy_project, "--model_dir", model_dir,
                                                    *more])))
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("resumed", [False, True], ids=["fresh", "resumed"])
def test_a_cli_train_checks_its_options_once(resumed, counted, toy_project, tmp_path):
    if resumed:
        _train(toy_project, tmp_path / "md", "--max_steps", 2)
        counted.clear()
    _train(toy_project, tmp_path / "md", "--max_steps", 4)
    assert dict(counted) == {"check_step_options": 2, "budget": 1, "broadcast": 1}  # load + run; no tier given
    assert sorted(p.name for p in (tmp_path / "md").glob("checkpoint_*.mdl")) == \
        (["checkpoint_2.mdl", "checkpoint_4.mdl"] if resumed else ["checkpoint_4.mdl"])


def test_compile_tier_reaches_the_engine_typed_and_unchecked(counted, toy_project, tmp_path):
    params = load_params(toy_project, {"runconfig.model_dir": str(tmp_path / "md"), "runconfig.compile_tier": "fx"})
    runner = PyTorchBaseRunner.create(params, device="CSX", mode="train")
    assert runner.options.compile_tier is CompileTier.FX
    assert runner.backend.compile_tier is CompileTier.FX
    assert runner._cs_train_step.options.compile_tier is CompileTier.FX
    assert counted["parse"] == 0  # the params load checked it: nothing after it checks it again


def test_compile_tier_choices_are_spelled_once():
    field = next(f for f in dataclasses.fields(RunConfig) if f.name == "compile_tier")
    assert field.metadata["choices"] == ("auto", "fx", "inductor") == tuple(CompileTier)
    flag = next(p for p in cli.commands["train"].params if p.name == "compile_tier")
    assert isinstance(flag.type, click.Choice) and tuple(flag.type.choices) == tuple(CompileTier)
    assert cs_run.CompileTier is CompileTier and "CompileTier" in cs_run.__all__  # the public name, re-exported


def test_sharding_and_offload_choices_are_spelled_once():
    # the params' choices and the flags' are the enums of cs_run.parallel, which the strategy is built from
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    for key, kind in (("sharding", parallel.Sharding), ("offload", parallel.Offload)):
        assert fields[key].metadata["choices"] == tuple(kind) and fields[key].default == next(iter(kind))
        flag = next(p for p in cli.commands["train"].params if p.name == key)
        assert isinstance(flag.type, click.Choice) and tuple(flag.type.choices) == tuple(kind)


def test_sharding_is_resolved_once_into_the_layout_the_runner_uses(monkeypatch, toy_project, tmp_path):
    calls = []
    resolve = options_module.resolve_layout
    monkeypatch.setattr(options_module, "resolve_layout", lambda *a, **k: calls.append(a) or resolve(*a, **k))
    params = load_params(toy_project, {"runconfig.model_dir": str(tmp_path / "md"), "runconfig.max_steps": 1})
    runner = PyTorchBaseRunner.create(params, device="CPU", mode="train")
    assert calls == [("none", "none", 1, "CPU")]  # create() resolves it; the runner builds its strategy from it
    assert runner.options.layout == parallel.Layout(parallel.Sharding.NONE, parallel.Offload.NONE)
    assert type(runner.strategy) is parallel.Strategy and runner.strategy.sharding is parallel.Sharding.NONE


def test_the_step_keys_are_carried_in_the_options_and_the_loop_reads_them_there(toy_project, tmp_path):
    params = load_params(toy_project, {"runconfig.model_dir": str(tmp_path / "md"), "runconfig.max_steps": 3,
                                       "runconfig.log_steps": 7, "runconfig.checkpoint_steps": 0,
                                       "runconfig.max_checkpoints": 5, "runconfig.eval_steps": 2,
                                       "runconfig.eval_frequency": 0.5, "runconfig.save_initial_checkpoint": False})
    options = RunOptions.resolve(params, "CPU")
    assert (options.log_steps, options.checkpoint_steps, options.max_checkpoints, options.eval_steps,
            options.eval_frequency, options.save_initial_checkpoint) == (7, 0, 5, 2, 0.5, False)
    # The loop reads the options, not the runconfig: options that say otherwise than the runconfig win.
    runner = PyTorchBaseRunner.create(params, device="CPU", mode="train")
    runner.options = dataclasses.replace(runner.options, checkpoint_steps=1, max_checkpoints=2,
                                         save_initial_checkpoint=True)
    runner.run("train")
    assert sorted(p.name for p in (tmp_path / "md").glob("checkpoint_*.mdl")) == ["checkpoint_2.mdl",
                                                                                 "checkpoint_3.mdl"]


def test_the_model_zoo_parser_takes_the_runners_modes_and_the_backends_devices():
    # run()'s argparse spells neither list itself: the vendor's modes and devices, as the runners and backend take them
    actions = {a.dest: a for a in modelzoo._parser(None)._actions}
    assert tuple(actions["mode"].choices) == ("train", "eval", "train_and_eval", "eval_all") == MODES
    assert tuple(actions["device"].choices) == tuple(actions["device_word"].choices) == ("CPU", "GPU", "CSX")
    assert actions["device"].choices is BACKEND_TYPES


@pytest.mark.parametrize("door", [
    lambda: EngineOptions(compile_tier="fast"),
    lambda: CompileTier.parse("fast"),
], ids=["EngineOptions", "CompileTier.parse"])
def test_a_string_tier_from_outside_a_params_file_is_checked_at_its_door(door):
    with pytest.raises(ParamsError, match=r"^Invalid compile_tier 'fast'; must be one of auto, fx, inductor$"):
        door()


@pytest.mark.parametrize("value, states", [
    ("all", None), (" ALL ", None), ("model", {"model"}), ("model, optimizer", {"model", "optimizer"}),
    (["global_step", " rng"], {"global_step", "rng"}),
])
def test_load_checkpoint_states_become_a_set_once(value, states, toy_project, tmp_path):
    params = load_params(toy_project, {"runconfig.model_dir": str(tmp_path), "runconfig.load_checkpoint_states": value})
    options = RunOptions.resolve(params, "CPU")
    assert options.load_states == (None if states is None else frozenset(states))
    assert options.loads_step == (states is None or "global_step" in states)


def test_resolve_types_the_options_and_for_mode_adds_the_steps(toy_project, tmp_path):
    ckpt = tmp_path / "c.mdl"
    params = load_params(toy_project, {"runconfig.model_dir": str(tmp_path / "md"),
                                       "runconfig.checkpoint_path": str(ckpt), "runconfig.max_steps": 7})
    options = RunOptions.resolve(params, "CPU")
    assert (options.mode, options.steps, options.checkpoint_path, options.compile_tier) == (None, None, ckpt, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.mode = "train"
    train = options.for_mode("train", params)
    assert train.training and train.steps.max_steps == 7 and train.steps.names["max_steps"] == "runconfig.max_steps"
    assert options.for_mode("eval", params).steps is None
    with pytest.raises(ParamsError, match="--mode: 'fit' is not one of train, eval, train_and_eval, eval_all"):
        options.for_mode("fit", params)


def test_progress_counts_steps_epochs_and_the_run():
    progress = Progress(global_step=10, epoch=2, epoch_step=3)
    progress.start_run(5)
    assert (progress.run_start, progress.run_steps, progress.run_step, progress.samples_streamed) == (10, 5, 0, 0)
    for samples in (4, 4, 3):
        progress.step_done(samples)
    assert (progress.global_step, progress.epoch_step, progress.run_step, progress.samples_streamed) == (13, 6, 3, 11)
    progress.epoch_done()
    assert (progress.epoch, progress.epoch_step, progress.global_step) == (3, 0, 13)


def test_the_runners_global_step_is_its_progress(toy_project, tmp_path):
    params = load_params(toy_project, {"runconfig.model_dir": str(tmp_path / "md"), "runconfig.max_steps": 3})
    runner = PyTorchBaseRunner.create(params, device="CPU", mode="train")
    runner.run("train")
    assert runner.global_step == runner.progress.global_step == 3
    assert (runner.progress.run_start, runner.progress.run_steps) == (0, 3)
    assert Path(runner.model_dir, "checkpoint_3.mdl").is_file()
