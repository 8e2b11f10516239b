"""Preprocessing benchmark: tokens per second of ``cs-run data preprocess --config`` and of the Model Zoo's own
tool (``preprocess_data --config``, Release_2.10.0) on the same generated input, config and tokenizer.

Three workloads: packed pretraining (hf_autoregressive_lm_preprocessing.yaml) over seeded jsonl documents, the same
with processing.shuffle and dataset.use_vsl, and multi-turn chat finetuning (multi_turn_dialogue_preprocessing.yaml)
over seeded dialogues, all with the tiny byte-level BPE of tests/data/vendor_preprocess/tokenizer
(tools/vendor_oracle/preprocess_cases.py) and ``processes: 1``. Each tool runs as its own process (start-up
included, as a user waits for it); a warm-up run of each checks that both wrote the same .h5 files with equal
arrays before any timing counts. Each repeat runs both, in alternating order; the report is the median tokens per
second (data_params.json's non_pad_tokens) and cs-run's ratio to the vendor. The vendor peer needs the oracle venv
and source of tools/vendor_oracle/record_preprocess.py; without it the bench runs cs-run alone and says so.

Run: ``flock /tmp/cs-run-heavy.lock .venv/bin/python bench/bench_preprocess.py [--quick]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from machine_info import cpu_name

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "data" / "vendor_preprocess"
sys.path.insert(0, str(ROOT / "tools" / "vendor_oracle"))
import preprocess_cases as pc  # noqa: E402
from record_preprocess import _RUN_VENDOR  # noqa: E402

WORKLOADS = {  # name: (the recorded case whose config is run, input folder, max_seq_length)
    "pretraining, packed": ("hf_pretraining_packed", "text", 2048),
    "multi-turn chat finetuning": ("multi_turn_dialogue", "chat", 512),
    "pretraining, shuffled VSL": ("hf_pretraining_vsl_shuffle_token_limit", "text", 2048),
}


def write_inputs(folder: Path, size: int) -> None:
    """Seeded jsonl of about `size` bytes per workload: documents and dialogues from the cases' words."""
    rng = random.Random(0)
    words = " ".join(pc.TEXT_DOCS).replace(".", " .").replace(",", " ,").split()

    def sentence(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."

    for name, record in (("text", lambda: {"text": " ".join(sentence(rng.randint(5, 20))
                                                              for _ in range(rng.randint(3, 30)))}),
                         ("chat", lambda: {"messages": [
                             {"role": "user" if i % 2 == 0 else "assistant", "content": sentence(rng.randint(3, 25))}
                             for i in range(2 * rng.randint(1, 4))]})):
        (folder / name).mkdir(parents=True)
        with open(folder / name / "data.jsonl", "w") as f:
            while f.tell() < size:
                f.write(json.dumps(record()) + "\n")


def write_config(case: str, source: Path, out: Path, msl: int, path: Path) -> Path:
    params = yaml.safe_load((GOLDEN / case / "config.yaml").read_text())
    params["setup"]["data"]["source"] = str(source)
    params["setup"]["output_dir"] = str(out)
    params["processing"]["huggingface_tokenizer"] = str(GOLDEN / "tokenizer")
    params["processing"]["max_seq_length"] = msl
    for key in ("token_limit", "read_chunk_size", "write_chunk_size"):  # the whole input, in the default 1 MB chunks
        params["processing"].pop(key, None)
    path.write_text(yaml.safe_dump(params))
    return path


def run_ours(config: Path, work: Path) -> float:
    cmd = [str(Path(sys.executable).parent / "cs-run"), "data", "preprocess", "--config", str(config)]
    return _timed(cmd, dict(os.environ), work)


def run_vendor(python: str, src: str):
    def run(config: Path, work: Path) -> float:
        env = dict(os.environ, PYTHONPATH=os.path.join(src, "src"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        return _timed([python, "-c", _RUN_VENDOR, str(config)], env, work)
    return run


def _timed(cmd: list[str], env: dict, work: Path) -> float:
    start = time.perf_counter()
    out = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"Error: {' '.join(cmd[:3])} failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return elapsed


def read_h5(folder: Path) -> dict[str, dict[str, np.ndarray]]:
    import h5py

    found = {}
    for f in sorted(folder.rglob("*.h5")):
        with h5py.File(f, "r") as h:
            found[str(f.relative_to(folder))] = {k: h[k][()] for k in h}
    return found


def tokens(out: Path) -> int:
    """The tokens written (padding not counted): data_params.json's post-process non_pad_tokens."""
    return int(json.loads((out / "data_params.json").read_text())["post-process"]["non_pad_tokens"])


def same(a: dict, b: dict) -> bool:
    """The samples written, in file order, are equal (the files' names are compared apart: see main)."""
    def samples(x: dict) -> np.ndarray:
        return np.concatenate([x[f]["data"] for f in x]) if x else np.zeros((0,))
    return np.array_equal(samples(a), samples(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 kB of input per workload and 1 repeat")
    parser.add_argument("--mb", type=float, default=2.0, help="input size per workload in MB (default 2)")
    parser.add_argument("--repeats", type=int, default=5)
    default = "/tmp/mzprep/bin/python" if os.path.exists("/tmp/mzprep/bin/python") else None
    parser.add_argument("--vendor-python", default=default,
                        help="the oracle venv's python (default /tmp/mzprep/bin/python if it exists)")
    parser.add_argument("--vendor-src", default="/tmp/mzsrc", help="the Model Zoo source (its src/ is put on PYTHONPATH)")
    parser.add_argument("--no-vendor", action="store_true", help="run cs-run alone")
    args = parser.parse_args()
    size, repeats = (20_000, 1) if args.quick else (int(args.mb * 1e6), args.repeats)
    vendor = None if args.no_vendor or not args.vendor_python else run_vendor(args.vendor_python, args.vendor_src)
    print(f"{cpu_name()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', 'unset')}; "
          f"{size / 1e6:g} MB of jsonl per workload, {repeats} repeats, processes: 1")
    if vendor is None:
        print("ran without the vendor peer (no --vendor-python): cs-run's tokens/s only")
    print(f"{'workload':<30} {'tokens':>10} {'cs-run tok/s':>13} {'vendor tok/s':>13} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_inputs(tmp / "in", size)
        for name, (case, folder, msl) in WORKLOADS.items():
            runs = {"cs-run": run_ours, **({"vendor": vendor} if vendor else {})}
            outputs, counts, times = {}, {}, {tool: [] for tool in runs}
            for r in range(repeats + 1):  # run 0 is the warm-up, whose outputs are compared
                for tool in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                    out = tmp / f"out_{tool}_{r}"
                    config = write_config(case, tmp / "in" / folder, out, msl, tmp / f"{tool}_{r}.yaml")
                    elapsed = runs[tool](config, tmp)
                    if r == 0:
                        outputs[tool] = read_h5(out)
                        counts[tool] = tokens(out)
                    else:
                        times[tool].append(elapsed)
                    shutil.rmtree(out)
            n = counts["cs-run"]
            if vendor and (not same(outputs["cs-run"], outputs["vendor"]) or counts["vendor"] != n):
                raise SystemExit(f"Error: {name}: cs-run's .h5 arrays differ from the vendor's; no timing reported")
            if vendor and list(outputs["cs-run"]) != list(outputs["vendor"]):
                print(f"note: {name}: same samples, other file names: cs-run {list(outputs['cs-run'])}, "
                      f"vendor {list(outputs['vendor'])}")
            ours = n / statistics.median(times["cs-run"])
            if vendor:
                theirs = n / statistics.median(times["vendor"])
                print(f"{name:<30} {n:>10} {ours:>13.0f} {theirs:>13.0f} {ours / theirs:>7.2f}")
            else:
                print(f"{name:<30} {n:>10} {ours:>13.0f} {'-':>13} {'-':>7}")


if __name__ == "__main__":
    main()
