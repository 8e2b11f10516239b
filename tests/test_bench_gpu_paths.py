"""bench/bench_gpu_paths.py --quick keeps working on a CPU: its fp16 and offload sections run through the
Trainer and print one JSON line per run. The speeds are not checked (benchmarks are not tests); what the
runs must agree on is: on a CPU, ``offload: cpu`` moves nothing, so the fsdp run's losses equal the
unsharded run's within float32 rounding of a different reduction order (1e-5 relative)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_gpu_paths.py"


@pytest.mark.slow
def test_quick_sections_print_a_json_line_per_run(tmp_path):
    out_file = tmp_path / "runs.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(BENCH), "--quick", "--threads", "1", "--only", "fp16,offload",
                          "--out", str(out_file)], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "FAILED" not in out.stdout
    rows = {line["row"]: line for line in map(json.loads, out_file.read_text().splitlines())}
    assert set(rows) == {"CPU fp32", "CPU bfloat16 dynamic scaling", "CSX bfloat16 dynamic scaling",
                         "sharding none, offload none", "sharding fsdp, offload cpu", "fsdp+offload vs unsharded"}
    assert rows["CPU bfloat16 dynamic scaling"]["finite"] and rows["CSX bfloat16 dynamic scaling"]["finite"]
    assert rows["fsdp+offload vs unsharded"]["max_rel_loss"] < 1e-5
    assert rows["sharding fsdp, offload cpu"]["tokens_per_s"] > 0
