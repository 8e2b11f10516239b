"""A replica ends with its launcher however the launcher ends, and commits no checkpoint after it
(cs_run._launcher_watch), shown without torch: a launcher process starts a "replica" (its own session and
an elastic agent's variables, as torch's agent starts one) that imports cs_run and waits; the harness above
them is their subreaper (PR_SET_CHILD_SUBREAPER), so the orphaned replica becomes its child and its exit
status can be read. The launched 2-replica runs are in test_launcher_death.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cs_run import _launcher_watch
from cs_run.checkpoint import atomic

HARNESS = r'''
import ctypes, json, os, signal, subprocess, sys, threading, time
case, folder = sys.argv[1], sys.argv[2]
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: the orphan is ours to wait for
launcher_code = r"""
import os, subprocess, sys, threading
case, folder, replica_code = sys.argv[1], sys.argv[2], sys.argv[3]
env = dict(os.environ, TORCHELASTIC_RUN_ID="test", CS_RUN_LAUNCHER_PID=str(os.getpid()), LOCAL_RANK="0")
def start():
    proc = subprocess.Popen([sys.executable, "-c", replica_code, case, folder], env=env, start_new_session=True,
                            stderr=open(os.path.join(folder, "replica.err"), "w"))
    print(proc.pid, flush=True)
if case == "started by a thread that ended":
    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
else:
    start()
sys.stdin.read()  # until the harness closes it: "exits"
"""
replica_code = r"""
import os, sys, time
case, folder = sys.argv[1], sys.argv[2]
if case == "no pidfd":
    del os.pidfd_open
while case == "gone before the replica imports cs_run" and not os.path.exists(os.path.join(folder, "go")):
    time.sleep(0.01)
import cs_run
open(os.path.join(folder, "ready"), "w").close()
if case == "exits while its replica finalizes":
    class Finalizer:  # the replica's interpreter finalizes (daemon threads stopped) for 30 s
        def __del__(self, mark=os.path.join(folder, "finalizing"), open=open, sleep=time.sleep):
            open(mark, "w").close()
            sleep(30)
    keep = Finalizer()
    sys.exit(3)
time.sleep(30)
sys.exit(3)
"""
launcher = subprocess.Popen([sys.executable, "-c", launcher_code, case, folder, replica_code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
replica = int(launcher.stdout.readline())
def wait_for(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        assert time.monotonic() < deadline, "the replica did not start"
        time.sleep(0.01)
alive_with_launcher = None
if case != "gone before the replica imports cs_run":
    wait_for(os.path.join(folder, "finalizing" if case == "exits while its replica finalizes" else "ready"))
    time.sleep(0.5)
    alive_with_launcher = open(f"/proc/{replica}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX"
if case == "exits":
    launcher.stdin.close()
else:
    launcher.send_signal(signal.SIGTERM if case == "SIGTERM" else signal.SIGKILL)
launcher.wait()
ended = time.monotonic()
open(os.path.join(folder, "go"), "w").close()
while True:
    pid, status = os.waitpid(replica, os.WNOHANG)
    if pid or time.monotonic() > ended + 10:
        break
    time.sleep(0.01)
if not pid:
    os.kill(replica, signal.SIGKILL)
    os.waitpid(replica, 0)
print(json.dumps({"code": os.waitstatus_to_exitcode(status) if pid else None, "after": time.monotonic() - ended,
                  "alive_with_launcher": alive_with_launcher}))
'''

CASES = ["SIGKILL", "SIGTERM", "exits", "gone before the replica imports cs_run", "no pidfd",
         "started by a thread that ended", "exits while its replica finalizes"]


@pytest.mark.parametrize("case", CASES)
def test_a_replica_ends_with_its_launcher_however_it_ends(case, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHELASTIC_RUN_ID", "CS_RUN_LAUNCHER_PID")}
    result = subprocess.run([sys.executable, "-c", HARNESS, case, str(tmp_path)], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    # 129 (128 + SIGHUP) is the watch's own exit; the replica would sleep 30 s and exit 3 without it. A replica
    # that finalizes cannot run its watching thread: the kernel kills it (armed at exit, PR_SET_PDEATHSIG).
    finalizing = case == "exits while its replica finalizes"
    assert outcome["code"] == (-9 if finalizing else 128 + 1), outcome
    assert outcome["after"] < 3, outcome  # a pidfd wakes at once, the fallback polls every 0.2 s
    # A parent-death signal would have ended the replica with the thread that started it.
    assert outcome["alive_with_launcher"] is (None if case == "gone before the replica imports cs_run" else True)
    err = (tmp_path / "replica.err").read_text()
    if finalizing:
        return
    assert err.startswith("Error: the launcher (pid ") and "has ended, so they end at once" in err, err


def test_a_process_no_agent_started_watches_nothing(tmp_path):
    # One process, a process started by hand, a replica's own children: no launcher to end with.
    code = ("import os, cs_run; from cs_run import _launcher_watch as w; "
            "print(w._watched is None, w.gone())")
    for extra in ({}, {"TORCHELASTIC_RUN_ID": "x"}):  # the second: not the leader of its own session
        env = {**{k: v for k, v in os.environ.items() if k not in ("TORCHELASTIC_RUN_ID", "CS_RUN_LAUNCHER_PID")},
               **extra}
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
        assert (result.returncode, result.stdout) == (0, "True False\n"), result.stderr


def _gone(monkeypatch) -> None:
    """This process as a replica whose launcher has ended: its parent is not the watched pid."""
    monkeypatch.setattr(_launcher_watch, "_watched", (os.getppid() + 1_000_000, os.getpid()))


@pytest.mark.parametrize("before", ["nothing", "a file", "a folder"])
def test_no_checkpoint_is_committed_after_the_launcher_ended(before, tmp_path, monkeypatch):
    final = tmp_path / "checkpoint_10.mdl"
    if before == "a file":
        final.write_bytes(b"old")
    elif before == "a folder":
        final.mkdir()
        (final / "index.json").write_text("old")
    new = tmp_path / "new"
    new.mkdir() if before == "a folder" else new.write_bytes(b"new")
    _gone(monkeypatch)
    with pytest.raises(_launcher_watch.LauncherGone, match=r"launcher of this replica \(pid \d+\) has ended: "
                                                             rf"checkpoint {final} is not committed"):
        atomic.replace(str(new), final, folder_ok=True)
    assert new.exists() and sorted(p.name for p in tmp_path.iterdir()) == sorted({final.name, "new"} - (
        {final.name} if before == "nothing" else set()))
    if before == "a file":
        assert final.read_bytes() == b"old"
    elif before == "a folder":
        assert (final / "index.json").read_text() == "old"
    # atomic_path's whole write: refused, its temporary removed, nothing under the final name.
    with pytest.raises(_launcher_watch.LauncherGone):
        with atomic.atomic_path(str(tmp_path / "checkpoint_20.mdl")) as tmp, open(tmp, "wb") as fh:
            fh.write(b"x")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(atomic.TMP_SUFFIX) or "checkpoint_20" in p.name]


@pytest.mark.parametrize("watched", ["this process's parent", "another process's watch (a forked child)"])
def test_a_live_launcher_or_another_process_commits(watched, tmp_path, monkeypatch):
    launcher = (os.getppid(), os.getpid()) if watched == "this process's parent" else (os.getppid() + 1_000_000, 1)
    monkeypatch.setattr(_launcher_watch, "_watched", launcher)
    (tmp_path / "new").write_bytes(b"new")
    atomic.replace(str(tmp_path / "new"), tmp_path / "checkpoint_1.mdl")
    assert (tmp_path / "checkpoint_1.mdl").read_bytes() == b"new" and not _launcher_watch.gone()
