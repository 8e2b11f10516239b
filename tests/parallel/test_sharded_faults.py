"""A sharded run's replica that is killed (kill -9) while training, or while writing its shard of a
checkpoint, ends the whole job: the launcher exits 1 within the collective timeout with one line naming the
replica, no checkpoint is left half-written under its final name, and the previous checkpoint loads. A
replica that hangs inside a save ends the job after the collective timeout the same way. A nan in one
replica's shard only stops every replica before the save (``agree_keys``), with one line naming the key.

Each run is 2 sharded replicas of the tiny Llama-style decoder of fsdp_helpers, checkpointing every 10 steps, in its own
session under a hard limit (a hang fails the test, it never blocks the suite)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fsdp_helpers import HARD_LIMIT, write_params
from sharded_runners import STALL_STEP

import cs_run as cstorch
from cs_run.checkpoint import sharded
from cs_run.runners._checkpoint_files import list_checkpoints
from tests.processes import finish

TIMEOUT = 60  # --collective_timeout of these runs
KILLED = ("Error: replica 1 of 2 was killed by signal SIGKILL (all replicas were stopped; rerun the same command "
          "to resume from the newest checkpoint)")


def _start(tmp_path: Path, *args, timeout: int = TIMEOUT) -> tuple[subprocess.Popen, Path]:
    params = write_params(tmp_path / "params.yaml", checkpoint_steps=10, max_steps=100_000, log_steps=1000)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    md = tmp_path / "md"
    proc = subprocess.Popen([sys.executable, "-m", "cs_run", "train", "--params", str(params), "--model_dir",
                             str(md), "--num_csx", "2", "--sharding", "fsdp", "--collective_timeout", str(timeout),
                             *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    return proc, md


def _wait_for(proc: subprocess.Popen, ready) -> None:
    deadline = time.monotonic() + HARD_LIMIT
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is not None or not ready():
        _, _, err = finish(proc, 1)
        pytest.fail(f"the run ended or stalled before the test could act: {err[-3000:]}")


def _replica_pid(launcher: int, rank: int) -> int:
    for pid in subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True).stdout.split():
        try:
            if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return int(pid)
        except OSError:
            continue
    raise AssertionError(f"no replica {rank} under launcher {launcher}")


def _assert_committed_only(md: Path) -> list[int]:
    """Every checkpoint under its final name is a whole sharded one (CRC-checked load); returns the steps."""
    steps = [step for step, _ in list_checkpoints(md)]
    for step, path in list_checkpoints(md):
        assert path.is_dir() and cstorch.load(path)["global_step"] == step
    return steps


def test_a_replica_killed_while_training_ends_the_sharded_job(tmp_path):
    proc, md = _start(tmp_path)
    _wait_for(proc, lambda: sharded.is_sharded(md / "checkpoint_10.mdl"))
    os.kill(_replica_pid(proc.pid, 1), signal.SIGKILL)
    code, _, err = finish(proc, TIMEOUT)
    assert code == 1 and [line for line in err.splitlines() if line.startswith("Error:")] == [KILLED], err
    assert _assert_committed_only(md)[0] == 10


def test_a_replica_killed_inside_a_sharded_save_leaves_no_checkpoint_and_the_previous_loads(tmp_path):
    proc, md = _start(tmp_path, "--runner", "sharded_runners:StallingSaveRunner")
    stalled = tmp_path / "stalled"
    _wait_for(proc, stalled.exists)
    temps = [p for p in md.iterdir() if p.name.startswith(f".checkpoint_{STALL_STEP}.mdl.")]
    assert len(temps) == 1 and (temps[0] / "shard_00001_of_00002.h5").is_file()  # replica 1 wrote, nothing committed
    os.kill(int(stalled.read_text()), signal.SIGKILL)
    code, _, err = finish(proc, TIMEOUT)
    assert code == 1 and [line for line in err.splitlines() if line.startswith("Error:")] == [KILLED], err
    assert _assert_committed_only(md) == [10]  # no checkpoint_20 folder: the save never committed
    assert not (md / f"checkpoint_{STALL_STEP}.mdl").exists()
    # The next save into model_dir removes the killed save's folder (its writer, ordinal 0, is gone).
    sharded.discard(sharded.new_temp_folder(md / "checkpoint_99.mdl"))
    assert not temps[0].exists()


def test_a_replica_hanging_inside_a_sharded_save_ends_the_job_after_the_collective_timeout(tmp_path):
    timeout = 30  # the whole wait is this twice; 30 s still outlasts any step or save of this tiny run
    proc, md = _start(tmp_path, "--runner", "sharded_runners:StallingSaveRunner", timeout=timeout)
    _wait_for(proc, (tmp_path / "stalled").exists)
    # Ordinal 0 gives up after `timeout` s in the commit's all-gather; the agent then stops replica 1, which
    # sleeps through SIGTERM, with SIGKILL (at most `timeout` s later): the line names the replica that hung.
    code, _, err = finish(proc, timeout * 2 + 30)
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert code == 1 and len(errors) == 1 and errors[0].startswith("Error: replica 1 of 2 "), err
    assert _assert_committed_only(md) == [10]


def test_a_nan_in_one_replicas_shard_only_stops_every_replica_before_the_save(tmp_path):
    """Replica 1 finds a nan in its shard of one tensor at step 20's checkpoint, replica 0 none in its own:
    both must stop (one would otherwise wait for the other in the save's collectives until the timeout),
    with the one line of a non-finite checkpoint naming the key and the newest finite checkpoint (step 10),
    and no checkpoint of step 20, committed or temporary: without the agreement ordinal 0 goes on into the
    save and makes its temporary folder before the job is stopped (seen: this test then fails there)."""
    proc, md = _start(tmp_path, "--runner", "sharded_runners:NonFiniteShardRunner")
    code, _, err = finish(proc, HARD_LIMIT)
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert code == 1 and len(errors) == 1, err
    key = (tmp_path / "nan_key").read_text()
    assert f"weights are not finite after step {STALL_STEP} ({key} hold nan or inf)" in errors[0], errors[0]
    assert f"the newest checkpoint with finite weights is {md / 'checkpoint_10.mdl'}" in errors[0], errors[0]
    assert _assert_committed_only(md) == [10]
    assert not [p for p in md.iterdir() if p.name.startswith(f".checkpoint_{STALL_STEP}.mdl")]
