"""The suite holds on any x86-64 CPU and whatever signal dispositions it inherits (CI machines differ).

The golden tests (numbers recorded on one CPU) run once more in a pytest subprocess under another ATen
vector ISA than this CPU's best, and the interrupt tests once more with SIGINT and SIGQUIT ignored, as a
parent does for ``cmd &`` without job control. Only those tests run again, so this costs seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ["tests/optim/test_vendor_oracle.py", "tests/checkpoint/test_vendor_format.py",
          "tests/metrics/test_auc_vendor.py", "-k", "trajectory or continues or resumes or writer_still or auc"]
# the in-process tests: each signal path, CPU and CSX; the slow cs-run subprocess test starts its child
# from dispositions its fixture sets, so running it again would test nothing new
INTERRUPTS = ["tests/runners/test_interrupts.py", "-m", "not slow"]
IGNORE_SIGINT = ["sh", "-c", "trap '' INT QUIT; exec \"$@\"", "sh"]


def _other_isa() -> str:
    """ATen's scalar kernels ('default') unless they are already what runs: the farthest from any vector
    ISA, and available on every CPU."""
    best = torch.backends.cpu.get_cpu_capability()
    if best == "DEFAULT":
        pytest.skip("ATen runs its scalar kernels here already: no other ISA to compare against")
    return "default"


def _pytest(args: list[str], env: dict[str, str], prefix: list[str] = ()) -> None:
    """Run pytest on ``args`` in a subprocess; exit 0 with tests passed, or fail with its output (exit 5,
    nothing collected, fails too)."""
    run = subprocess.run([*prefix, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0 and re.search(r"\d+ passed", run.stdout), run.stdout[-4000:] + run.stderr[-2000:]


def _probe(code: str, env: dict[str, str], prefix: list[str] = ()) -> str:
    return subprocess.run([*prefix, sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_golden_tests_hold_under_another_vector_isa():
    env = {**os.environ, "ATEN_CPU_CAPABILITY": _other_isa()}
    assert _probe("import torch; print(torch.backends.cpu.get_cpu_capability())", env) == "DEFAULT"
    _pytest(GOLDEN, env)


def test_interrupt_tests_hold_with_sigint_ignored():
    env = dict(os.environ)
    assert _probe("import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)", env,
                  IGNORE_SIGINT) == "True"
    _pytest(INTERRUPTS, env, IGNORE_SIGINT)
