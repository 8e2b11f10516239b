"""Run policy at the front door: ``--set`` against flags, one writer per model_dir, no bad weights saved."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

import pytest
import torch
import yaml
from click.testing import CliRunner

from cs_run import checkpoint
from cs_run.frontends.cli import cli
from cs_run.frontends.flags import COMMAND_USES, command_options, run_options
from cs_run.runners import PyTorchBaseRunner
from cs_run.runners._model_dir import LOCK_NAME


def invoke(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


# ------------------------------------------------------------------------------ overrides precedence

# Every runconfig key that also has a flag: (key, flag, a --set value, the flag's value, the expected
# params value of each). Paths are compared after resolving against the current folder.
def _flag_cases(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    return [
        ("model_dir", "--model_dir", a, b, str(a), str(b)),
        ("checkpoint_path", "--checkpoint_path", a / "c.mdl", b / "c.mdl", str(a / "c.mdl"), str(b / "c.mdl")),
        ("max_steps", "--max_steps", 5, 7, 5, 7),
        ("num_steps", "--num_steps", 5, 7, 5, 7),
        ("num_epochs", "--num_epochs", 2, 3, 2, 3),
        ("eval_steps", "--eval_steps", 2, 3, 2, 3),
        ("logging", "--logging", "WARNING", "error", "WARNING", "ERROR"),
        ("compile_dir", "--compile_dir", a, b, str(a), str(b)),
        ("num_csx", "--num_csx", 2, 3, 2, 3),
        ("num_workers_per_csx", "--num_workers_per_csx", 2, 3, 2, 3),
        ("max_wgt_servers", "--max_wgt_servers", 2, 3, 2, 3),
        ("max_act_per_csx", "--max_act_per_csx", 2, 3, 2, 3),
        ("transfer_processes", "--transfer_processes", 2, 3, 2, 3),
        ("mount_dirs", "--mount_dirs", f"[{a}]", b, [str(a)], [str(b)]),
        ("python_paths", "--python_paths", f"[{a}]", b, [str(a)], [str(b)]),
        ("job_labels", "--job_labels", "[x=1]", "y=2", ["x=1"], ["y=2"]),
        ("seed", "--seed", 5, -7, 5, -7),
        ("collective_timeout", "--collective_timeout", 30, 40, 30, 40),
        ("runner", "--runner", "a:One", "b:Two", "a:One", "b:Two"),
        ("compile_tier", "--compile_tier", "fx", "INDUCTOR", "fx", "inductor"),
        ("sharding", "--sharding", "fsdp", "none", "fsdp", "none"),
        ("offload", "--offload", "cpu", "none", "cpu", "none"),
    ]


FLAG_KEYS = ["model_dir", "checkpoint_path", "max_steps", "num_steps", "num_epochs", "eval_steps", "logging",
             "compile_dir", "num_csx", "num_workers_per_csx", "max_wgt_servers", "max_act_per_csx",
             "transfer_processes", "mount_dirs", "python_paths", "job_labels", "seed", "compile_tier", "runner", "collective_timeout",
             "sharding", "offload"]


def test_every_key_with_a_flag_has_a_precedence_case():
    assert set(FLAG_KEYS) == {o.key for o in run_options() if o.key is not None and o.cli}


@pytest.fixture
def captured(monkeypatch):
    """The params the CLI hands to the runner factory (no run)."""
    seen = []

    class _Done:
        def run(self, mode):
            return {}

    def create(params, **kwargs):
        seen.append(params)
        return _Done()

    monkeypatch.setattr(PyTorchBaseRunner, "create", staticmethod(create))
    return seen


@pytest.mark.parametrize("key", FLAG_KEYS)
def test_set_wins_over_file_and_flag_wins_over_set(key, toy_project, tmp_path, captured):
    """params file < --set < explicit flag; a flag the user did not give overrides nothing."""
    _, flag, set_value, flag_value, expect_set, expect_flag = next(c for c in _flag_cases(tmp_path) if c[0] == key)
    command = next(name for name in COMMAND_USES if any(o.key == key for o in command_options(name)))
    base = [command, "--params", toy_project, "--set", f"runconfig.{key}={set_value}"]
    if key == "num_epochs":
        base += ["--set", "runconfig.max_steps=null"]
    result = invoke(*base)
    assert result.exit_code == 0, result.output
    assert getattr(captured[-1].runconfig, key) == expect_set
    result = invoke(*base, flag, flag_value)
    assert result.exit_code == 0, result.output
    assert getattr(captured[-1].runconfig, key) == expect_flag


def test_set_of_a_flag_key_is_validated_like_the_file(toy_project):
    result = invoke("train", "--params", toy_project, "--set", "runconfig.max_steps=-1")
    assert result.exit_code == 2
    assert "Error: params: runconfig.max_steps: must be >= 1, got -1 (set on the command line)" in result.output


def test_set_max_steps_trains_that_many_steps_into_set_model_dir(toy_project, tmp_path):
    md = tmp_path / "set_dir"
    result = invoke("train", "--params", toy_project, "--set", "runconfig.max_steps=5",
                    "--set", f"runconfig.model_dir={md}")
    assert result.exit_code == 0, result.output
    assert "Training 5 steps (global step 0 -> 5)" in result.output
    assert [p.name for p in md.glob("checkpoint_*.mdl")] == ["checkpoint_5.mdl"]
    assert yaml.safe_load((md / "params_resolved.yaml").read_text())["runconfig"]["max_steps"] == 5
    assert not (toy_project.parent / "model_dir").exists()


# ----------------------------------------------------------------------------- one writer per model_dir

def test_second_run_on_a_locked_model_dir_fails_at_once_and_touches_nothing(toy_project, tmp_path):
    md = tmp_path / "md"
    assert invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 3).exit_code == 0
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in md.rglob("*") if p.is_file()}
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(md / LOCK_NAME)!r}, os.O_RDWR)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.ftruncate(fd, 0); os.write(fd, f'{os.getpid()}\\n'.encode())\n"
        "print('locked', flush=True); time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before[LOCK_NAME] = ((md / LOCK_NAME).stat().st_mtime_ns, (md / LOCK_NAME).read_bytes())
        start = time.monotonic()
        result = invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 6)
        assert time.monotonic() - start < 10
    finally:
        holder.kill()
        holder.wait()
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: model_dir ") and "in use by another cs-run run" in lines[0]
    assert f"pid {holder.pid}" in lines[0] and "another --model_dir" in lines[0]
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in md.rglob("*") if p.is_file()}
    assert after == before
    # The holder is gone: the kernel dropped its lock, the next run resumes.
    again = invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 6)
    assert again.exit_code == 0 and "checkpoint_3.mdl at global step 3" in again.output


def test_the_lock_is_held_for_the_run_and_released_after(toy_project, tmp_path):
    """While a run is inside its loop, model_dir's lock is taken; after it returns it is free."""
    md = tmp_path / "md"
    held = []

    def probe():
        fd = os.open(md / LOCK_NAME, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            held.append(False)
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(fd)

    import cs_run.runners.base as base

    original = base.PyTorchBaseRunner.train
    try:
        base.PyTorchBaseRunner.train = lambda self: (probe(), original(self))
        assert invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 1).exit_code == 0
    finally:
        base.PyTorchBaseRunner.train = original
    probe()
    assert held == [True, False]
    assert (md / LOCK_NAME).read_text().strip() == str(os.getpid())


def test_stale_temporaries_of_killed_saves_are_removed_at_start(toy_project, tmp_path):
    md = tmp_path / "md"
    md.mkdir()
    stale = [md / ".checkpoint_4.mdl.999999.abcd1234.cs-run-tmp", md / "params_resolved.yaml.tmp"]
    for path in stale:
        path.write_bytes(b"partial")
    keep = md / "notes.txt"
    keep.write_text("mine")
    assert invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 1).exit_code == 0
    assert not any(p.exists() for p in stale) and keep.read_text() == "mine"


# ------------------------------------------------------------------------------ never save bad weights

def _finite(path):
    state = checkpoint.load(str(path), map_location="cpu")
    tensors = [t for group in ("model", "optimizer") for t in _leaves(state.get(group))]
    return all(torch.isfinite(t).all() for t in tensors if t.is_floating_point())


def _leaves(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from _leaves(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _leaves(value)


@pytest.mark.parametrize("device", ["CPU", "CSX"])
def test_infinite_learning_rate_saves_no_bad_weights_and_a_rerun_resumes(device, toy_project, tmp_path):
    """lr=1e300 (finite in the file, inf in float32) with checkpoint_steps=1: step 4's update makes the
    weights inf/nan while its loss (computed before the update) is finite; nothing of it is saved."""
    md = tmp_path / "md"
    common = ["--params", toy_project, "--model_dir", md, "--device", device, "--set", "runconfig.checkpoint_steps=1"]
    assert invoke("train", *common, "--max_steps", 3).exit_code == 0
    bad = invoke("train", *common, "--max_steps", 6, "--set", "optimizer.learning_rate=1.0e+300")
    assert bad.exit_code == 1, bad.output
    error = [line for line in bad.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1
    assert "weights are not finite after step 4" in error[0]
    assert f"the newest checkpoint with finite weights is {md / 'checkpoint_3.mdl'}" in error[0]
    names = sorted(p.name for p in md.glob("checkpoint_*.mdl"))
    assert names == ["checkpoint_1.mdl", "checkpoint_2.mdl", "checkpoint_3.mdl"]
    assert all(_finite(md / name) for name in names)
    again = invoke("train", *common, "--max_steps", 5)
    assert again.exit_code == 0, again.output
    assert f"Resuming from checkpoint {md / 'checkpoint_3.mdl'} at global step 3" in again.output
    assert _finite(md / "checkpoint_5.mdl")


def test_newest_finite_checkpoint_skips_bad_and_unreadable_files(tmp_path):
    from cs_run.runners._checkpoint_files import newest_finite_checkpoint, nonfinite_keys

    good = {"model": {"w": torch.ones(3)}, "optimizer": {"state": {0: {"m": torch.zeros(2)}}}, "global_step": 1}
    checkpoint.save(good, str(tmp_path / "checkpoint_1.mdl"))
    bad = {"model": {"w": torch.ones(3)}, "optimizer": {"state": {0: {"m": torch.tensor([1.0, float("inf")])}}}}
    assert nonfinite_keys(bad) == ["optimizer.state.0.m"]
    checkpoint.save(bad, str(tmp_path / "checkpoint_2.mdl"))
    (tmp_path / "checkpoint_3.mdl").write_bytes(b"not a checkpoint")
    assert newest_finite_checkpoint(tmp_path) == tmp_path / "checkpoint_1.mdl"
    assert nonfinite_keys({"step": torch.tensor(3), "x": torch.tensor([float("nan")], dtype=torch.bfloat16)}) == ["x"]
