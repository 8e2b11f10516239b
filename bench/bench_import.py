"""Start-up time of ``import cs_run`` and ``cs-run --help`` against their peers, in fresh processes.

A newcomer's first commands are ``cs-run --help`` and ``cs-run train --help``; neither needs torch, so
neither should pay for it (``import torch`` alone is ~1.5 s on a loaded 2-core host). Each variant is
a new interpreter; variants are interleaved, each repeat times every variant once, and the medians are
printed with their ratio to ``python -c pass`` (interpreter start) and to ``import torch``.

Run: flock /tmp/cs_run_bench.lock .venv/bin/python bench/bench_import.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

CLI = "from cs_run.frontends.cli import main; main()"
VARIANTS = {
    "python -c pass": ["-c", "pass"],
    "import torch": ["-c", "import torch"],
    "import cs_run": ["-c", "import cs_run"],
    "cs-run --help": ["-c", CLI, "--help"],
    "cs-run train --help": ["-c", CLI, "train", "--help"],
    "cs-run --version": ["-c", CLI, "--version"],
    "import cs_run; cs_run.backend": ["-c", "import cs_run; cs_run.backend"],
}


def run_once(args: list[str]) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{args} failed: {done.stderr.decode()[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for argv in VARIANTS.values():  # warm the page cache once
        run_once(argv)
    for _ in range(args.repeats):
        for name, argv in VARIANTS.items():
            times[name].append(run_once(argv))
    base = statistics.median(times["python -c pass"])
    torch_time = statistics.median(times["import torch"])
    print(f"{'variant':34} {'median s':>9} {'- start s':>9} {'/ import torch':>15}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:34} {median:9.3f} {median - base:9.3f} {median / torch_time:14.2f}x")


if __name__ == "__main__":
    main()
