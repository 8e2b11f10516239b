"""Two real replicas (processes on gloo) of the bundled fc_mnist: the same result as one process, the
same bits under torchrun, checkpoints that resume on 1 and 2 replicas, and a killed replica that ends
the job with one line. Every process has a hard timeout: a hang fails the test, it never blocks CI.

Tolerance of the 1-vs-2 comparisons: 2 replicas x batch 32 average two half-batch gradient means in
DDP, 1 process takes the mean over the 64 samples at once; the same sum in another order, so float32
rounding (~6e-8 relative per operation) compounds over the 50 SGD-with-momentum steps. Observed
differences are ~2e-7 on weights of magnitude <= 0.4; the tests allow 2e-6 (atol) + 1e-5 (rtol).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import cs_run as cstorch
from cs_run.frontends.cli import cli
from tests.processes import finish

NO_HALF = "model.mixed_precision with the float16 half type: no effect on the CPU device"
TIMEOUT = 240  # seconds for any one multi-process run (a hang fails, it never blocks the suite)
COMMON = ["--set", "model.dropout=0.0", "--set", "runconfig.log_steps=25", "--set", "runconfig.checkpoint_steps=25",
          "--collective_timeout", "180"]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(command: list, timeout: int = TIMEOUT) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(list(map(str, command)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), start_new_session=True)
    return subprocess.CompletedProcess(command, *finish(proc, timeout, what=str(command)))


def _cs_run(*args) -> list:
    return [sys.executable, "-m", "cs_run.frontends.cli", *args]


def _invoke(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def _tensors(path: Path) -> dict:
    state = cstorch.load(path)
    flat = {f"model.{k}": v for k, v in state["model"].items()}
    for index, slot in state["optimizer"]["state"].items():
        flat.update({f"optimizer.{index}.{k}": v for k, v in slot.items() if isinstance(v, torch.Tensor)})
    return flat


def _assert_close(a: Path, b: Path, exact: bool = False) -> None:
    ta, tb = _tensors(a), _tensors(b)
    assert ta.keys() == tb.keys()
    for key in ta:
        if exact:
            assert torch.equal(ta[key], tb[key]), key
        else:
            torch.testing.assert_close(ta[key], tb[key], atol=2e-6, rtol=1e-5, msg=key)


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory):
    """``cs-run train-and-eval --num_csx 2`` on fc_mnist, self-launched: 100 steps, checkpoints every 25
    (model.mixed_precision with float16: the CPU runs float32 and the creation logs a line, NO_HALF)."""
    md = tmp_path_factory.mktemp("two") / "md"
    result = _run(_cs_run("train-and-eval", "--num_csx", 2, "--model_dir", md, "--max_steps", 100, *COMMON,
                          "--set", "model.mixed_precision=true"))
    assert result.returncode == 0, result.stderr
    return md, result


def test_two_replicas_train_fc_mnist_like_one_process(two_replicas, tmp_path):
    md, result = two_replicas
    # Ordinal 0 alone logs, reports and writes: each checkpoint and eval line once.
    assert sorted(p.name for p in md.glob("checkpoint_*.mdl")) == [f"checkpoint_{s}.mdl" for s in (100, 25, 50, 75)]
    assert result.stderr.count("Saved checkpoint") == 4 and result.stderr.count("| Eval ") == 1
    # The runner creation's line (before model_dir is opened) also once, on the console and in run.log.
    assert result.stderr.count(NO_HALF) == 1 and (md / "run.log").read_text().count(NO_HALF) == 1
    accuracy = float(result.stdout.split("eval/accuracy = ")[1].split()[0])
    assert accuracy >= 0.90
    # 1 process x batch 64 for 50 steps = 2 replicas x batch 32 (within the reduction-order tolerance).
    one = tmp_path / "one"
    assert _invoke("train", "--model_dir", one, "--max_steps", 50, *COMMON).exit_code == 0
    _assert_close(one / "checkpoint_50.mdl", md / "checkpoint_50.mdl")
    # The metric states were summed over the replicas' shards before compute(): one process evaluating the
    # same weights on all the data gets exactly the same accuracy.
    shutil.copy(md / "checkpoint_100.mdl", tmp_path / "final.mdl")
    single = _invoke("eval", "--model_dir", tmp_path / "eval", "--checkpoint_path", tmp_path / "final.mdl")
    assert single.exit_code == 0, single.output
    assert f"eval/accuracy = {accuracy:.5f}" in single.output


def test_a_two_replica_checkpoint_resumes_on_one_replica(two_replicas, tmp_path):
    md, _ = two_replicas
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copy(md / "checkpoint_50.mdl", resumed / "checkpoint_50.mdl")
    result = _invoke("train", "--model_dir", resumed, "--max_steps", 100, *COMMON)
    assert result.exit_code == 0, result.output
    assert "Resuming from checkpoint" in result.output and "at global step 50" in result.output
    # Same data position (the global batches are the same samples), so the same weights at step 100.
    _assert_close(resumed / "checkpoint_100.mdl", md / "checkpoint_100.mdl")


def test_torchrun_runs_the_same_command_to_the_same_bits(two_replicas, tmp_path):
    md, _ = two_replicas
    torchrun = Path(sys.executable).with_name("torchrun")
    result = _run([torchrun, "--standalone", "--nproc_per_node", 2, "-m", "cs_run.frontends.cli", "train-and-eval",
                   "--num_csx", 2, "--model_dir", tmp_path / "md", "--max_steps", 100, *COMMON])
    assert result.returncode == 0, result.stderr
    for step in (25, 50, 75, 100):
        _assert_close(tmp_path / "md" / f"checkpoint_{step}.mdl", md / f"checkpoint_{step}.mdl", exact=True)


def _replica_pid(launcher: int, rank: int) -> int | None:
    for pid in subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True).stdout.split():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return int(pid)
    return None


def _train_until_checkpoint(md: Path, args: list, stop) -> tuple[subprocess.Popen, str]:
    """Start a long 2-replica run, call ``stop(launcher)`` once a new checkpoint is there, return its stderr."""
    before = set(md.glob("checkpoint_*.mdl"))
    proc = subprocess.Popen(list(map(str, _cs_run("train", "--num_csx", 2, "--max_steps", 1_000_000, *args))),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while set(md.glob("checkpoint_*.mdl")) <= before and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1]
        stop(proc)
        _, err = proc.communicate(timeout=60)  # bounded: the agent stops the replicas at once
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc, err


def _kill_replica_1(launcher: subprocess.Popen) -> None:
    victim = _replica_pid(launcher.pid, 1)
    assert victim is not None, "no replica 1"
    os.kill(victim, signal.SIGKILL)


def test_a_killed_replica_ends_the_job_with_one_line_and_a_rerun_resumes(tmp_path):
    md = tmp_path / "md"
    args = ["--model_dir", md, "--set", "model.dropout=0.0", "--set", "runconfig.checkpoint_steps=10",
            "--set", "runconfig.max_checkpoints=2", "--set", "runconfig.log_steps=1000", "--collective_timeout", 120]
    proc, err = _train_until_checkpoint(md, args, _kill_replica_1)
    assert proc.returncode == 1
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: replica 1 of 2 was killed by signal SIGKILL (all replicas were stopped; rerun the "
                      "same command to resume from the newest checkpoint)"], err
    saved = sorted(int(p.stem.split("_")[1]) for p in md.glob("checkpoint_*.mdl"))
    for step in saved:  # every checkpoint under its final name is whole (CRC-checked on load)
        assert cstorch.load(md / f"checkpoint_{step}.mdl")["global_step"] == step
    # The rerun resumes from the newest checkpoint; a Ctrl-C of the launcher (passed on to both replicas) stops
    # both after the same step, with a checkpoint of it and no Error: line (exit 130, as one process).
    rerun, err = _train_until_checkpoint(md, args, lambda launcher: os.killpg(launcher.pid, signal.SIGINT))
    assert f"Resuming from checkpoint {md / f'checkpoint_{saved[-1]}.mdl'} at global step {saved[-1]}" in err
    assert rerun.returncode == 130 and "Error:" not in err, err
    stopped = [line for line in err.splitlines() if "interrupted (SIGINT) at step" in line]
    assert len(stopped) == 1, err
    step = int(stopped[0].split("at step ")[1].split(";")[0])
    assert f"checkpoint {md / f'checkpoint_{step}.mdl'}; rerun to resume" in stopped[0]
    assert cstorch.load(md / f"checkpoint_{step}.mdl")["global_step"] == step > saved[-1]
