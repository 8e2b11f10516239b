"""The signal watchdog of cs_run/interrupts.py: a process whose main thread waits inside a C++ call (where
Python cannot run its signal handler) still ends on a second SIGINT / SIGTERM, or ``grace`` seconds after
the first. The children set every signal disposition they rely on themselves and say when they are
waiting; the parent waits on that line, never on a sleep. (The loop's own behaviour on signals is in
tests/runners/test_interrupts.py.)"""

from __future__ import annotations

import multiprocessing
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cs_run import interrupts

# The child: handlers as a training loop has them, then a wait inside C++ with the GIL released (a torch
# future nobody completes: what a collective whose peers are gone looks like to Python).
CHILD = """
import signal, sys
import torch
from cs_run import interrupts

interrupts.ABORT_WAIT = {abort_wait}
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, signal.default_int_handler)
with interrupts.stop_on_signal(grace={grace}):
    print("waiting", flush=True)
    torch.futures.Future().wait()
print("the wait returned", flush=True)
"""
LIMIT = 120  # seconds; far above what any case needs, so a hang fails the test instead of blocking the suite


def _child(grace, abort_wait: float = 1.0) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", CHILD.format(grace=grace, abort_wait=abort_wait)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "waiting\n", proc.communicate()[1]
    return proc


def _deliver(proc: subprocess.Popen, signum: int) -> None:
    """Sends ``signum`` and waits until the kernel has delivered it (no longer pending): a second signal sent
    while the first is still pending would merge with it."""
    proc.send_signal(signum)
    bit = 1 << (signum - 1)
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        pending = [int(line.split()[1], 16) for line in status if line.startswith(("SigPnd:", "ShdPnd:"))]
        if not any(p & bit for p in pending):
            return
    pytest.fail(f"signal {signum} still pending after {LIMIT} s")


def _end(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the child still ran {LIMIT} s after its signals")
    return proc.returncode, err


# (signals sent, grace, expected exit code, expected line)
CASES = {
    "second SIGTERM": ([signal.SIGTERM, signal.SIGTERM], None, 143, "still running 1 s after a second SIGTERM"),
    "SIGINT then SIGTERM": ([signal.SIGINT, signal.SIGTERM], None, 143, "still running 1 s after a second SIGTERM"),
    "one SIGTERM, grace 2 s": ([signal.SIGTERM], 2, 143, "still running 2 s after SIGTERM"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_process_stuck_in_cpp_ends_on_a_second_signal_or_after_the_grace(case):
    signals, grace, code, line = CASES[case]
    proc = _child(grace)
    for signum in signals:
        _deliver(proc, signum)
    returncode, err = _end(proc)
    assert returncode == code, err
    errors = [x for x in err.splitlines() if x.startswith("Error:")]
    assert errors == [f"Error: {line}; ended at once, the last complete checkpoint is kept; rerun to resume from it"]


def test_one_signal_without_grace_leaves_the_process_to_finish_its_work():
    """The first signal only asks (the loop stops after its step); without a grace the watchdog waits on,
    so the process is still there (the second signal ends it)."""
    proc = _child(None, abort_wait=0.1)
    _deliver(proc, signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=3)  # no sleep to synchronise: this only shows nothing ended it meanwhile
    _deliver(proc, signal.SIGTERM)
    assert _end(proc)[0] == 143


@pytest.mark.parametrize("child", [False, True], ids=["alone", "with-a-forked-child"])
def test_the_block_leaves_no_watchdog_and_gives_the_wakeup_fd_back(child):
    """Also when a process forked inside the block outlives it (a DataLoader's persistent workers keep
    their copy of the watchdog's pipe open, so closing the parent's end is no end of file)."""
    before = set(threading.enumerate())
    forked = None
    try:
        with interrupts.stop_on_signal():
            watchdogs = [t for t in threading.enumerate() if t.name == "cs_run-signal-watchdog"]
            assert len(watchdogs) == 1
            if child:
                forked = multiprocessing.get_context("fork").Process(target=threading.Event().wait, daemon=True)
                forked.start()
        watchdogs[0].join(LIMIT)
        assert not watchdogs[0].is_alive()
        assert forked is None or forked.is_alive()  # it still holds the pipe: the watchdog ended regardless
        assert set(threading.enumerate()) <= before
        assert signal.set_wakeup_fd(-1) == -1  # nobody's fd left installed
    finally:
        if forked is not None:
            forked.kill()
            forked.join()


def test_a_wakeup_fd_in_use_is_left_alone():
    """An asyncio loop (or anyone) that owns Python's wakeup fd keeps it; the block then has no watchdog."""
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        signal.set_wakeup_fd(a.fileno())
        with interrupts.stop_on_signal():
            assert not [t for t in threading.enumerate() if t.name == "cs_run-signal-watchdog"]
            assert signal.set_wakeup_fd(a.fileno()) == a.fileno()
    finally:
        assert signal.set_wakeup_fd(-1) == a.fileno()
        a.close()
        b.close()


# A program that catches Aborted and goes on (a notebook, a test session, a Trainer inside a larger
# program) has left the block: the watchdog must not end it ABORT_WAIT seconds later.
SURVIVOR = """
import os, signal, threading
from cs_run import interrupts

interrupts.ABORT_WAIT = 0.5
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, signal.default_int_handler)
try:
    with interrupts.stop_on_signal() as flag:
        os.kill(os.getpid(), signal.SIGINT)
        while not flag.requested:
            pass
        os.kill(os.getpid(), signal.SIGINT)
        while True:
            pass
except interrupts.Aborted:
    pass
threading.Event().wait(3 * interrupts.ABORT_WAIT)  # the watchdog's wait, three times over
print("alive", flush=True)
"""


def test_a_program_that_catches_aborted_is_not_ended_later():
    done = subprocess.run([sys.executable, "-c", SURVIVOR], capture_output=True, text=True, timeout=LIMIT)
    assert (done.returncode, done.stdout) == (0, "alive\n"), done.stderr
