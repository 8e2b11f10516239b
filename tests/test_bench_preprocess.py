"""bench/bench_preprocess.py --quick --no-vendor keeps working: both workloads run and print their row.

The numbers are not checked (benchmarks are not tests); that each row ran, counted tokens and said it ran
without the vendor peer is.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_preprocess.py"


def test_quick_bench_without_the_peer_prints_tokens_per_second_per_workload():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(BENCH), "--quick", "--no-vendor"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "ran without the vendor peer" in out.stdout
    rows = dict(re.findall(r"^(pretraining, packed|multi-turn chat finetuning)\s+(\d+)\s+\d+\s+-\s+-$", out.stdout, re.M))
    assert set(rows) == {"pretraining, packed", "multi-turn chat finetuning"}, out.stdout
    assert all(int(n) > 1000 for n in rows.values()), rows
