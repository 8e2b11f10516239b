"""Atomic saves: kill -9 at many points mid-save leaves the previous checkpoint intact."""

from __future__ import annotations

import os
import random
import signal
import stat
import time

import pytest
import torch
from ckpt_helpers import assert_same

from cs_run.checkpoint import atomic, load, save
from cs_run.checkpoint.atomic import TMP_SUFFIX


def _state(seed: int, mb: int = 24) -> dict:
    g = torch.Generator().manual_seed(seed)
    n = mb * (1 << 20) // 4 // 8
    return {"model": {f"layer{i}.weight": torch.randn(n, generator=g) for i in range(8)}, "step": seed}


def _temps(folder) -> list[str]:
    return [n for n in os.listdir(folder) if n.endswith(TMP_SUFFIX)]


def _save_in_child(obj, path, report_fd: int | None = None) -> int:
    """Fork a child that saves ``obj``. With ``report_fd`` (a pipe's write end) the child writes a byte
    there once the temporary is written in full, before its rename, and waits there to be killed."""
    pid = os.fork()
    if pid == 0:  # child: save, then leave without running the parent's cleanup
        try:
            if report_fd is not None:
                def report_and_wait(_path, directory=False):
                    os.write(report_fd, b"w")
                    while True:
                        signal.pause()

                atomic.fsync_path = report_and_wait
            save(obj, path)
        finally:
            os._exit(0)
    return pid


def test_kill_9_at_many_points_keeps_previous_checkpoint(tmp_path):
    """Kills at random times: before, inside or after a save (where each lands depends on the machine's
    speed; the next test kills inside one for certain)."""
    path = tmp_path / "checkpoint_1.mdl"
    old, new = _state(1), _state(2)
    save(old, path)
    old_bytes = path.read_bytes()
    t0 = time.perf_counter()
    save(new, tmp_path / "timing.mdl")
    duration = time.perf_counter() - t0
    rng = random.Random(0)
    for i in range(24):
        pid = _save_in_child(new, path)
        time.sleep(rng.uniform(0, 1.1 * duration) if i % 6 else 0.0005 * i)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        got = load(path, lazy=False, verify=True)  # always a complete, valid checkpoint
        if got["step"] == 1:
            assert path.read_bytes() == old_bytes  # the previous file is untouched
        else:
            assert_same(new, got)
            save(old, path)  # start the next round from the old checkpoint again
            old_bytes = path.read_bytes()
    save({"x": 1}, tmp_path / "other.mdl")  # the next save into the folder cleans up
    assert _temps(tmp_path) == []


def test_kill_9_inside_a_save_keeps_previous_checkpoint(tmp_path):
    """The child says when its temporary is written in full (not yet renamed); the kill lands there."""
    path = tmp_path / "checkpoint_1.mdl"
    save(_state(1, mb=1), path)
    old_bytes = path.read_bytes()
    report_r, report_w = os.pipe()
    pid = _save_in_child(_state(2, mb=1), path, report_fd=report_w)
    os.close(report_w)
    try:
        assert os.read(report_r, 1) == b"w"  # blocks until the child is inside the save
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(report_r)
    assert path.read_bytes() == old_bytes and len(_temps(tmp_path)) == 1  # the temporary, abandoned
    assert load(path, lazy=False, verify=True)["step"] == 1
    save({"x": 1}, tmp_path / "other.mdl")  # the next save into the folder cleans up
    assert _temps(tmp_path) == []


@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_exception_mid_save_leaves_old_file_and_no_temp(tmp_path, monkeypatch, where):
    path = tmp_path / "c.h5"
    save({"v": torch.zeros(3)}, path)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full (simulated)")

    target = {"write": "cs_run.checkpoint.writer._LeafWriter.write", "fsync": "cs_run.checkpoint.atomic.fsync_path",
              "replace": "os.replace"}[where]
    monkeypatch.setattr(target, boom)
    with pytest.raises(Exception, match="disk full"):
        save({"v": torch.ones(3)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert _temps(tmp_path) == []


def test_permissions_follow_umask(tmp_path):
    old = os.umask(0o022)
    try:
        save({"a": 1}, tmp_path / "c.h5")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "c.h5").st_mode) == 0o644


def test_stale_temp_of_live_process_is_kept(tmp_path):
    live = tmp_path / f".x.mdl.{os.getpid()}.abcd{TMP_SUFFIX}"
    dead = tmp_path / f".x.mdl.999999999.abcd{TMP_SUFFIX}"
    live.write_bytes(b"")
    dead.write_bytes(b"")
    removed = atomic.clean_stale_temps(str(tmp_path))
    assert removed == [str(dead)] and live.exists()
