"""A user's runner subclass, chosen with --runner, sees its hooks in the documented order."""

from __future__ import annotations

import importlib

import pytest

from cs_run.errors import ParamsError
from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner


def make_runner(params_path, overrides=None, runner="toy_models:RecordingRunner"):
    params = load_params(params_path, overrides)
    return PyTorchBaseRunner.create(params, device="CPU", runner=runner)


def train_calls(steps, per_epoch, checkpoints):
    """The expected hook sequence of a fresh training run (the vendor's runner hook order plus on_checkpoint_saved)."""
    calls = ["on_train_start"]
    for step in range(1, steps + 1):
        if (step - 1) % per_epoch == 0:
            calls.append("on_train_epoch_start")
        calls += ["on_train_batch_start", f"on_train_batch_end({step})"]
        if step in checkpoints:
            calls.append(f"on_checkpoint_saved({step})")
        if step % per_epoch == 0 or step == steps:
            calls.append(f"on_train_epoch_end(early_exit={step % per_epoch != 0})")
    return calls + ["on_train_end"]


def eval_calls(batches):
    calls = ["on_eval_start", "on_eval_epoch_start"]
    for step in range(1, batches + 1):
        calls += ["on_eval_batch_start", f"on_eval_batch_end({step})"]
    return calls + ["on_eval_epoch_end", "on_eval_end"]


@pytest.fixture
def calls(toy_project):
    module = importlib.import_module("toy_models")
    module.CALLS.clear()
    return module.CALLS


def test_train_hook_order(toy_project, calls, tmp_path):
    # 64 samples / batch 4 = 16 steps per epoch; 20 steps = one full epoch and 4 steps of the next.
    runner = make_runner(toy_project, {"runconfig.model_dir": str(tmp_path / "md")})
    assert type(runner).__name__ == "RecordingRunner"
    runner.run("train")
    assert calls == train_calls(20, 16, checkpoints={10, 20})


def test_train_and_eval_hook_order(toy_project, calls, tmp_path):
    runner = make_runner(toy_project, {"runconfig.model_dir": str(tmp_path / "md"), "runconfig.max_steps": 4,
                                       "runconfig.checkpoint_steps": 0})
    runner.run("train_and_eval")
    assert calls == train_calls(4, 16, checkpoints={4}) + eval_calls(32 // 8)


def test_nan_stop_runs_no_end_hooks_and_keeps_earlier_checkpoints(toy_project, calls, tmp_path):
    # Sample 44 is NaN: without shuffle it is in batch 12, so step 12 fails after the step-10 checkpoint.
    md = tmp_path / "md"
    runner = make_runner(toy_project, {"runconfig.model_dir": str(md), "train_input.nan_at": 44,
                                       "train_input.shuffle": False})
    with pytest.raises(Exception, match=r"loss is nan at step 12; training stopped and the newest "
                                        r"checkpoint with finite weights is .*checkpoint_10.mdl") as err:
        runner.run("train")
    assert err.value.exit_code == 1
    expected = train_calls(12, 16, checkpoints={10})
    assert calls == expected[: expected.index("on_train_batch_end(12)") + 1]
    assert sorted(p.name for p in md.glob("checkpoint_*")) == ["checkpoint_10.mdl"]


def test_runner_must_subclass_a_cs_run_runner(toy_project, tmp_path):
    expected = r"'toy_models:NotARunner' must be a subclass of cs_run.runners.PyTorchRunner"
    with pytest.raises(ParamsError, match=expected):
        make_runner(toy_project, runner="toy_models:NotARunner")
    with pytest.raises(ParamsError, match=r"module 'toy_models' has no attribute 'Missing'"):
        make_runner(toy_project, runner="toy_models:Missing")
