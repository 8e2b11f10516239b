#!/usr/bin/env bash
# Issue 37's checks on a lent CUDA machine, in one call: the CUDA tests, GPT-2 small's step (eager, compile,
# CSX inductor + CUDA graph) at batch 32 and 16, and the runner paths (fp16 + dynamic scaling, host/device
# overlap, fsdp + cpu offload on the Llama-3.2-1B keys). Each part gets a share of a deadline (BUDGET_S,
# default 560 s) and writes its log to OUT (default ./gpu_out); a part that runs out of time is cut, the
# rest still run. PARTS picks and orders the parts (default: cuda_tests lm_b32 lm_llama lm_b16 paths: what
# 2026-11-27's run left unmeasured first; one lent session's 15 device minutes fit about four). Run from the
# repository root: bash bench/gpu_checks.sh
set -u
PARTS=${PARTS:-cuda_tests lm_b32 lm_llama lm_b16 paths}
OUT=${OUT:-./gpu_out}; mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-560}; START=$(date +%s)
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cache
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
part() {  # part NAME CAP_S CMD...: run CMD with min(CAP_S, time left - 5) seconds, log to OUT/NAME.log
  local name=$1 cap=$2; shift 2
  local t=$(( $(left) - 5 )); (( t > cap )) && t=$cap
  if (( t < 20 )); then echo "== $name: skipped, $(left) s left" | tee -a "$OUT/summary.log"; return; fi
  echo "== $name (up to $t s, $(left) s left): $*" | tee -a "$OUT/summary.log"
  local t0=$(date +%s)
  timeout -k 5 "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "== $name: exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.log"
  grep -E "passed|failed|error|FAILED|bench_lm|^  [a-z{]|row|^[a-z0-9]+:$" "$OUT/$name.log" | grep -v INFO | tail -40 >> "$OUT/summary.log"
}
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } > "$OUT/env.log" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$OUT/env.log" 2>&1 || { echo "pip install failed: PYTHONPATH=." >> "$OUT/env.log"; export PYTHONPATH=$PWD; }
python3 -c "import cs_run.runners, cs_run.optim; print(\"cs_run imports\")" >> "$OUT/env.log" 2>&1
cat "$OUT/env.log"
for p in $PARTS; do
  case $p in
    cuda_tests) part cuda_tests 220 env CS_RUN_TEST_CUDA=1 python3 -m pytest -q -m cuda -p no:cacheprovider tests/engine/test_cuda.py tests/runners/test_cuda_runs.py ;;
    lm_b32) part lm_b32 240 python3 bench/bench_lm.py --batch 32 --rows eager,compile,csx-inductor-cg --repeats 3 --profile 10 ;;
    paths) part paths 200 python3 bench/bench_gpu_paths.py --out "$OUT/paths.jsonl" ;;
    lm_b16) part lm_b16 200 python3 bench/bench_lm.py --batch 16 --rows eager,compile,csx-inductor-cg --repeats 3 ;;
    lm_llama) part lm_llama 240 python3 bench/bench_lm.py --model llama --rows eager,compile,csx-inductor-cg --repeats 3 ;;
    *) echo "unknown part $p (choose from cuda_tests lm_b32 paths lm_b16 lm_llama)" | tee -a "$OUT/summary.log" ;;
  esac
done
echo "total $(( $(date +%s) - START )) s" | tee -a "$OUT/summary.log"
