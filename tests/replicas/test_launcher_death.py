"""SIGKILL of the process that launched the replicas (``cs-run train --num_csx 2``'s launcher, torchrun's
agent) ends every replica within seconds, and no checkpoint is committed after it (cs_run._launcher_watch).
Before, both replicas trained on, saved and pruned checkpoints with no parent.

A trial runs the bundled fc_mnist on 2 replicas (gloo), checkpointing every step and keeping 2, so a kill
during training lands in or next to a save and a prune. The replicas are found by a marker in their
environment (the launcher's, which torch's agent passes on), so a replica not yet started when the launcher
is killed is found too if it ever starts. The kill moment is when the launcher has been reaped: its replicas
have another parent from then on; the committed checkpoints then (names, inodes, mtimes) must be all there
is afterwards. Each process has a hard timeout: a hang fails the test, it never blocks the suite.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

TIMEOUT = 180  # seconds a run may take to reach its first checkpoint on a loaded 2-core host
GONE_WITHIN = 5.0  # seconds after the kill by which no replica may be alive
ARGS = ["train", "--num_csx", 2, "--max_steps", 1_000_000, "--set", "runconfig.checkpoint_steps=1",
        "--set", "runconfig.max_checkpoints=2", "--set", "runconfig.log_steps=1000000", "--collective_timeout", 60]
LINE = "has ended, so they end at once; the newest complete checkpoint is kept; rerun the same command to resume"


def _env(marker: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "OMP_NUM_THREADS": "1", "CS_RUN_TEST_LAUNCH": marker}


def _processes_with(marker: str, but: int) -> list[int]:
    """Live processes (not zombies) other than ``but`` whose environment holds the launch's marker."""
    entry = f"CS_RUN_TEST_LAUNCH={marker}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == but:
            continue
        try:
            if entry not in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                continue
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def _committed(md: Path) -> dict[str, tuple[int, int]]:
    """model_dir's committed checkpoints: name -> (inode, mtime); a re-commit of a name changes both."""
    out = {}
    for path in md.glob("checkpoint_*.mdl"):
        try:
            st = path.stat()
        except FileNotFoundError:  # pruned while listed
            continue
        out[path.name] = (st.st_ino, st.st_mtime_ns)
    return out


def _kill_the_launcher(command: list, md: Path, marker: str, delay: float,
                       after_checkpoint: bool) -> tuple[str, float, int]:
    """Start ``command``, SIGKILL it ``delay`` seconds after its start or its first committed checkpoint, and
    check the kill's outcome. Returns the launcher's stderr (the replicas' too), how long the last replica
    lived on after the kill and how many processes of the job there were besides the launcher then."""
    log = md.with_name(md.name + ".stderr")  # a file: a pipe nobody reads while it trains would stall the run
    with open(log, "w") as fh:
        proc = subprocess.Popen(list(map(str, command)), stdout=subprocess.DEVNULL, stderr=fh, env=_env(marker),
                                start_new_session=True)
    try:
        if after_checkpoint:
            deadline = time.monotonic() + TIMEOUT
            while not _committed(md) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert proc.poll() is None and _committed(md), log.read_text()[-3000:]
        time.sleep(delay)
        started = len(_processes_with(marker, proc.pid))
        assert started >= 2 or not after_checkpoint, "the replicas are not found by their marker"
        proc.kill()
        proc.wait(timeout=60)
        at_kill = _committed(md)
        killed = time.monotonic()
        while (alive := _processes_with(marker, proc.pid)) and time.monotonic() < killed + GONE_WITHIN:
            time.sleep(0.05)
        lived = time.monotonic() - killed
        assert alive == [], f"replicas {alive} alive {GONE_WITHIN} s after their launcher was killed"
        after = _committed(md)
        assert {name: stat for name, stat in after.items() if at_kill.get(name) != stat} == {}, \
            f"committed after the kill: {sorted(set(after) - set(at_kill))} (at the kill: {sorted(at_kill)})"
        return log.read_text(), lived, started
    finally:
        for pid in _processes_with(marker, proc.pid):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.sweep
def test_the_launcher_killed_at_random_times_leaves_no_replica_and_commits_nothing_after(tmp_path):
    # Seeded: 10 trials, 3 killed while the job starts (the launcher's imports, the rendezvous, the replicas
    # importing, joining, building), 7 up to 2 s into training, where each step is a checkpoint and a prune.
    rng = random.Random(38)
    for trial in range(10):
        starting = trial < 3
        delay = rng.uniform(0, 6.0 if starting else 2.0)
        md = tmp_path / f"trial{trial}"
        command = [sys.executable, "-m", "cs_run.frontends.cli", *ARGS, "--model_dir", md]
        err, _, _ = _kill_the_launcher(command, md, uuid.uuid4().hex, delay, after_checkpoint=not starting)
        # Each launcher's first replica says why it ended (none when it was killed before it started them).
        assert err.count(LINE) == (err.count(LINE) if starting else 1) <= 1, err[-3000:]


@pytest.mark.slow
def test_torchruns_agent_killed_ends_its_workers_and_they_commit_nothing_after(tmp_path):
    # torch's agent does not end its workers when it dies itself (they run in sessions of their own and it
    # asks for no parent-death signal): each worker watches the agent, its parent.
    torchrun = Path(sys.executable).with_name("torchrun")
    md = tmp_path / "md"
    command = [torchrun, "--standalone", "--nproc_per_node", 2, "-m", "cs_run.frontends.cli", *ARGS, "--model_dir", md]
    err, _, _ = _kill_the_launcher(command, md, uuid.uuid4().hex, 0.5, after_checkpoint=True)
    assert err.count(LINE) == 1, err[-3000:]
