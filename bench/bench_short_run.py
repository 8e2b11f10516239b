"""A short fc_mnist CSX run on the default tier (auto) against the fx tier: whole-command wall time.

Run: ``flock /tmp/cs-run-heavy.lock .venv/bin/python bench/bench_short_run.py`` (about 2 minutes on a
2-core host; ``--inductor`` adds the inductor tier, the build auto used to make on every run: +1-2 min
per repeat).

Each run is ``cs-run train --device CSX`` of examples/fc_mnist/params.yaml for ``--steps`` steps in a fresh
model_dir and a fresh, empty compile cache (CS_RUN_CACHE_DIR): a first run, nothing saved to load. Runs
are interleaved in ABBA order (default, fx, [inductor], then the reverse, ...) because the host is
shared and noisy; the medians of the wall time and of the run's own "Compile time" line and their
ratios are printed, with the tier auto chose and why (its log line).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from machine_info import cpu_name

ROOT = Path(__file__).resolve().parent.parent
PARAMS = ROOT / "examples" / "fc_mnist" / "params.yaml"
TIERS = {"default": [], "fx": ["--compile_tier", "fx"], "inductor": ["--compile_tier", "inductor"]}


def one_run(tier: str, steps: int, work: Path, index: int) -> tuple[float, float, str]:
    """Wall seconds of one whole command, its logged compile seconds (trace + compile, in the run's own
    words: less noisy than the wall time) and its 'compile_tier auto:' line(s)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", CS_RUN_CACHE_DIR=str(work / f"cache-{tier}-{index}"))
    cli = Path(sys.executable).with_name("cs-run")
    cmd = [str(cli), "train", "--device", "CSX", "--params", str(PARAMS), "--model_dir",
           str(work / f"md-{tier}-{index}"), "--max_steps", str(steps), *TIERS[tier]]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    lines = (res.stdout + res.stderr).splitlines()
    said = [line.split("INFO: ", 1)[-1] for line in lines if "compile_tier auto:" in line]
    compile_s = next(float(line.split("Compile time ", 1)[1].split()[0]) for line in lines if "Compile time " in line)
    return seconds, compile_s, "; ".join(said)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--inductor", action="store_true", help="also time the inductor tier")
    args = parser.parse_args()
    tiers = ["default", "fx"] + (["inductor"] if args.inductor else [])
    print(f"CPU: {cpu_name()} ({os.cpu_count()} cores visible); torch {torch.__version__}; OMP_NUM_THREADS=1")
    print(f"fc_mnist, cs-run train --device CSX --max_steps {args.steps}, fresh model_dir and empty compile cache "
          f"each run, {args.repeats} interleaved repeats")
    times: dict[str, list[float]] = {t: [] for t in tiers}
    compiles: dict[str, list[float]] = {t: [] for t in tiers}
    with tempfile.TemporaryDirectory(prefix="cs_run_bench_short_") as tmp:
        for i in range(args.repeats):
            for tier in tiers if i % 2 == 0 else tiers[::-1]:  # ABBA: no tier always runs first
                seconds, compile_s, said = one_run(tier, args.steps, Path(tmp), i)
                times[tier].append(seconds)
                compiles[tier].append(compile_s)
                print(f"  repeat {i} {tier:8s} {seconds:7.2f} s, compile {compile_s:6.2f} s" +
                      (f"  [{said}]" if said else ""), flush=True)
    med = {t: statistics.median(v) for t, v in times.items()}
    med_c = {t: statistics.median(v) for t, v in compiles.items()}
    for tier in tiers:
        print(f"{tier:8s} median {med[tier]:7.2f} s wall, {med_c[tier]:6.2f} s compile  "
              f"(wall: {', '.join(f'{s:.2f}' for s in times[tier])})  {med[tier] / med['fx']:.2f}x of fx")
    print(f"default / fx: wall {med['default'] / med['fx']:.3f}, compile {med_c['default'] / med_c['fx']:.3f} "
          "(1 plus noise: the default tier spends nothing fx does not)")


if __name__ == "__main__":
    main()
