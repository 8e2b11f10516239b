"""bench/bench_lm.py --quick keeps working: it prints the table with its MFU column for the rows asked.

The numbers are not checked (benchmarks are not tests); the table's shape and that every row ran are.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_lm.py"


@pytest.mark.parametrize("model, profile", [("gpt2", []), ("llama", ["--profile", "3"])])
def test_quick_bench_prints_tokens_per_second_and_mfu_per_row(model, profile):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(BENCH), "--quick", "--model", model, "--device", "cpu",
                          "--rows", "eager,csx-fx", "--steps", "1", "--repeats", "1", *profile],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    header = next(line for line in out.stdout.splitlines() if "ms/step" in line)
    assert header.split()[:4] == ["row", "ms/step", "tokens/s", "MFU"]
    assert "FAILED" not in out.stdout
    rows = {m.group(1): m for m in re.finditer(r"^\s+(eager|csx-fx)\s+([\d.]+)\s+(\d+)\s+([\d.]+)%", out.stdout, re.M)}
    assert set(rows) == {"eager", "csx-fx"}, out.stdout
    assert all(float(m.group(2)) > 0 and int(m.group(3)) > 0 and float(m.group(4)) > 0 for m in rows.values())
    if profile:  # per row: its total, then its kernel classes (GEMMs at least: both rows run matmuls), then its top 3
        for name in ("eager", "csx-fx"):
            block = out.stdout.split(f"profile {name}: ", 1)[1].split("\n  profile ")[0].splitlines()
            assert re.match(r"[\d.]+ ms CPU time per step in \d+ op calls", block[0]), block[0]
            classes = {line.split()[0] for line in block[1:] if re.match(r"\s{4}\S.*%", line)}
            assert "gemm" in classes, block
            assert len([line for line in block[1:] if re.match(r"\s+[\d.]+ ms\s+\d+x  \S", line)]) == 3, block
