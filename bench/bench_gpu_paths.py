"""Training paths on a CUDA GPU through cs-run's own Trainer and runners: fp16 with the dynamic loss scaler,
host/device overlap with a slow data loader, and ``sharding: fsdp`` + ``offload: cpu`` on one GPU.

Run: ``python bench/bench_gpu_paths.py`` on a CUDA machine (``--only fp16,overlap,offload`` picks sections);
``--quick`` runs the same sections at tiny sizes on any machine (float32/bfloat16 on a CPU, where fp16
and the overlap row mean little: it checks the script, not the numbers).

Every run is ``cs_run.Trainer(...).fit(loader)`` (the runners' loop, the precision and layout keys as a
params file sets them); a runner subclass records each step's loss (a device tensor, read at the end) and
the host time when the step returned. Sections:

* fp16: GPT-2 shaped (L4 d256 T256, batch 8) for 50 steps on 50 different batches: eager fp32 (the
  reference), eager fp16 + dynamic loss scaling (``fp16_type: float16, loss_scaling_factor: dynamic``) and
  CSX (fx tier) with the same; the largest relative loss difference to fp32 over the 50 steps.
* overlap: GPT-2 small (batch 8, sequence 1024, bf16) on GPU (eager) and CSX (fx with a CUDA graph), with a
  fast loader and with a loader that spends ``--slow_ms`` on the host per batch (pinned memory, in the
  main process: ``num_workers: 0``). Overlapped, the slow loader's time hides under the step; serial, it
  adds to it. Time per step = host time from step 5 to the last step (synchronised) / steps.
* offload: the Model Zoo's Llama-3.2-1B keys (bench_lm.py's), batch 4 x 2048, bf16, 20 steps: unsharded
  against ``sharding: fsdp, offload: cpu``: peak device memory (the run's own: above what was allocated
  before it, after a garbage collection), tokens/s (steps 3..20), and the largest relative loss
  difference over the 20 steps.

One JSON line per run goes to ``--out`` (default: print only), for the README's tables.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

import cs_run as cstorch
from cs_run.backend import _reset_for_tests as fresh_backend  # one backend type per process, as the vendor's
from cs_run.runners import PyTorchBaseRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lm import model_keys  # noqa: E402  (the bench's own model keys, one copy)

_RECORD: dict = {}


class RecordingRunner(PyTorchBaseRunner):
    """Keeps each step's loss on the device and the host time when its step returned; writes no checkpoint
    (the bench times steps: a 1.2B model's final checkpoint would be 15 GB of disk time per run)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.checkpoints.save = lambda *a, **k: None

    def on_train_batch_end(self, loss, epoch=None, step=None):
        super().on_train_batch_end(loss, epoch, step)
        _RECORD["losses"].append(loss.detach().float().clone())  # a CUDA graph's output is overwritten
        if step == _RECORD["steps"] and loss.is_cuda:
            torch.cuda.synchronize()  # the last step's time is when the device finished it
        _RECORD["times"].append(time.perf_counter())


class TokenBatches(torch.utils.data.Dataset):
    """``count`` fixed random-token batches (one item = one whole batch), each ``delay_s`` of host time."""

    def __init__(self, vocab: int, batch: int, seq: int, count: int, delay_s: float = 0.0):
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, vocab, (count, batch, seq + 1), generator=g)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        if self.delay_s:
            end = time.perf_counter() + self.delay_s
            while time.perf_counter() < end:  # host work (tokenizing, decoding), not a sleep the GIL skips
                pass
        ids = self.ids[i]
        return {"input_ids": ids[:, :-1].contiguous(), "labels": ids[:, 1:].contiguous(),
                "attention_mask": torch.ones(ids.shape[0], ids.shape[1] - 1, dtype=torch.int32)}


class ReadEveryStepRunner(RecordingRunner):
    """The GPU runner's rule before the loss check was deferred on a GPU: the loss read every step."""

    _defers_loss_check = False


def fit(device: str, keys: dict, data: TokenBatches, steps: int, precision: dict, runner=RecordingRunner,
        **trainer_kw) -> dict:
    """One Trainer.fit; the losses (floats), per-step host times and the device's peak memory."""
    _RECORD.update(losses=[], times=[], steps=steps)
    cuda = torch.cuda.is_available() and device != "CPU"
    held = 0
    if cuda:
        gc.collect()  # the previous run's runner, model and optimizer state (reference cycles) go now
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated()  # what is still allocated: not this run's
    loader = torch.utils.data.DataLoader(data, batch_size=None, shuffle=False, num_workers=0, pin_memory=cuda)
    backend = {"backend_type": device}
    if device == "CSX":
        backend["compile_tier"] = trainer_kw.pop("compile_tier", "fx")
    error = None
    with tempfile.TemporaryDirectory(prefix="bench_gpu_paths_") as model_dir, fresh_backend():
        t0 = time.perf_counter()
        try:  # (the final step's checkpoint is part of the wall time, not of the per-step times)
            trainer = cstorch.Trainer(backend=backend, model_dir=model_dir, model=dict(keys),
                                      optimizer={"optimizer_type": "AdamW", "learning_rate": 3e-4,
                                                 "weight_decay": 0.01},
                                      precision=precision, loop={"num_steps": steps}, logging={"log_steps": steps},
                                      seed=0, runner=runner, **trainer_kw)
            trainer.fit(loader)
        except Exception as e:  # report what the steps recorded, and why the run ended
            error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"
            print(f"  FAILED after {len(_RECORD['losses'])} steps: {error}", flush=True)
        wall = time.perf_counter() - t0
    return {"losses": [float(x) for x in _RECORD["losses"]], "times": list(_RECORD["times"]), "wall_s": wall,
            "peak_gb": (torch.cuda.max_memory_allocated() - held) / 2**30 if cuda else None,
            "held_before_gb": held / 2**30, "error": error}


def per_step(times: list[float], first: int) -> float:
    """Seconds per step from the end of step ``first`` to the end of the last one."""
    return (times[-1] - times[first - 1]) / (len(times) - first)


def max_rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def emit(out, section: str, row: str, **fields) -> None:
    line = {"section": section, "row": row, **fields}
    print("  " + json.dumps(line), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(line) + "\n")


def gpt2_keys(quick: bool, **sizes) -> dict:
    keys, _, _ = model_keys("gpt2", "quick" if quick else "full")
    keys.update(sizes)
    return {"name": "gpt2", **keys}


def section_fp16(args, gpu: str) -> None:
    seq, batch, steps = (32, 4, 10) if args.quick else (256, 8, 50)
    keys = gpt2_keys(args.quick, **({} if args.quick else dict(
        hidden_size=256, num_hidden_layers=4, num_heads=4, filter_size=1024, vocab_size=8192,
        max_position_embeddings=seq)))
    data = TokenBatches(keys["vocab_size"], batch, seq, steps)
    half = "float16" if not args.quick else "bfloat16"  # fp16 autocast is a CUDA feature here
    fp16 = {"mixed_precision": True, "fp16_type": half, "loss_scaling_factor": "dynamic"}
    ref = fit(gpu, keys, data, steps, {"mixed_precision": False})
    emit(args.out, "fp16", f"{gpu} fp32", first_loss=ref["losses"][0], last_loss=ref["losses"][-1])
    for device in (gpu, "CSX"):
        run = fit(device, keys, data, steps, fp16)
        emit(args.out, "fp16", f"{device} {half} dynamic scaling", first_loss=run["losses"][0],
             last_loss=run["losses"][-1], max_rel_vs_fp32=max_rel(run["losses"], ref["losses"]),
             finite=all(x == x and abs(x) != float("inf") for x in run["losses"]))


def section_overlap(args, gpu: str) -> None:
    seq, batch, steps = (64, 4, 12) if args.quick else (1024, 8, 30)
    keys = gpt2_keys(args.quick)
    precision = {"mixed_precision": True, "fp16_type": "bfloat16"} if not args.quick else {"mixed_precision": False}
    rows = [(gpu, RecordingRunner, ""), (gpu, ReadEveryStepRunner, ", loss read every step (the old rule)"),
            ("CSX", RecordingRunner, "")]
    for device, runner, note in rows:
        kw = {"compile_tier": "fx"} if device == "CSX" else {}
        for label, delay in (("fast loader", 0.0), (f"slow loader {args.slow_ms:g} ms", args.slow_ms / 1e3)):
            data = TokenBatches(keys["vocab_size"], batch, seq, steps, delay)
            run = fit(device, keys, data, steps, precision, runner=runner, **dict(kw))
            emit(args.out, "overlap", f"{device} {label}{note}", ms_per_step=per_step(run["times"], 5) * 1e3,
                 loader_ms=delay * 1e3)


def section_offload(args, gpu: str) -> None:
    keys, batch, seq = model_keys("llama", "quick" if args.quick else "full")
    keys = {"name": "llama", **keys}
    steps = 8 if args.quick else 20
    data = TokenBatches(keys["vocab_size"], batch, seq, steps)
    precision = {"mixed_precision": True, "fp16_type": "bfloat16"} if not args.quick else {"mixed_precision": False}
    runs = {}
    for layout in (("none", "none"), ("fsdp", "cpu")):
        run = fit(gpu, keys, data, steps, precision, sharding=layout[0], offload=layout[1])
        runs[layout] = run
        step_s = per_step(run["times"], 3)
        emit(args.out, "offload", f"sharding {layout[0]}, offload {layout[1]}", peak_gb=run["peak_gb"],
             held_before_gb=run["held_before_gb"],
             ms_per_step=step_s * 1e3, tokens_per_s=batch * seq / step_s, first_loss=run["losses"][0],
             last_loss=run["losses"][-1], wall_s=run["wall_s"])
    emit(args.out, "offload", "fsdp+offload vs unsharded",
         max_rel_loss=max_rel(runs["fsdp", "cpu"]["losses"], runs["none", "none"]["losses"]))


SECTIONS = {"fp16": section_fp16, "overlap": section_overlap, "offload": section_offload}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, any machine (checks the script)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {', '.join(SECTIONS)}")
    parser.add_argument("--slow_ms", type=float, default=30.0, help="host time of the slow loader per batch")
    parser.add_argument("--out", default=None, help="append one JSON line per run to this file")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gpu = "GPU" if torch.cuda.is_available() else "CPU"
    where = torch.cuda.get_device_name() if gpu == "GPU" else "CPU"
    print(f"bench_gpu_paths: torch {torch.__version__}, {where}, {time.strftime('%Y-%m-%d')}", flush=True)
    for name in args.only.split(","):
        t0 = time.perf_counter()
        print(f"{name}:", flush=True)
        SECTIONS[name](args, gpu)
        print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
