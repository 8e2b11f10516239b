"""Waiting for a launched ``cs-run`` job in a test: a hang fails the test, it never blocks the suite.

A job of several replicas is a process group (the launcher and the replicas it starts), so the test starts
the launcher with ``start_new_session=True`` and a hung job is killed as a whole group, no replica left
behind holding a port or model_dir's lock.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

__all__ = ["finish"]


def finish(proc: subprocess.Popen, within: float, what: str = "the job") -> tuple[int, str, str]:
    """``proc``'s exit code, stdout and stderr once it has ended. It must end within ``within`` seconds; else
    its process group (``proc`` was started with ``start_new_session=True``) is killed with SIGKILL and the
    test fails with the end of what it wrote to stderr."""
    try:
        out, err = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"{what} did not end within {within} s (a hang); its stderr ended with:\n{(err or '')[-3000:]}")
    return proc.returncode, out, err
