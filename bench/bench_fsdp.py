"""Memory per replica with ``sharding: fsdp``: the parameter and optimizer-state bytes each replica holds,
for 1 (unsharded), 2 and 4 replicas (gloo on the CPU), against the ideal 1/N of one replica's.

Each replica builds the same gpt2 (``--layers`` blocks of width ``--hidden``, vocab ``--vocab``), shards it
with cs-run's strategy (:class:`cs_run.parallel.FullyShardedStrategy`; N = 1 is the data-parallel
``Strategy``, the whole model), builds AdamW on it and takes one step, then counts the bytes of its own
tensors: the local shards of the DTensor parameters and of the optimizer state (``exp_avg``,
``exp_avg_sq``), plus the optimizer's per-parameter scalars (``beta1_power``, ``beta2_power``, which every
replica keeps whole). Overhead = held - (one replica's) / N: the scalars and the padding of dim-0 shards
that do not divide evenly. Gradients are freed by the step (``zero_grad(set_to_none=True)``), and the
whole parameters of a block exist only while its forward / backward runs (not counted: a peak, not a hold).

The counts are exact (byte sizes of tensors), not timings. Run: .venv/bin/python bench/bench_fsdp.py
(each N is its own launch of cs-run's replica launcher, so the time is mostly 7 processes importing
torch: about 1 min on 2 idle cores, under 3 min loaded).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
from torch.distributed.tensor import DTensor

from cs_run import replicas
from cs_run.optim import AdamW
from cs_run.parallel import FullyShardedStrategy, Strategy
from cs_run.registry import get_model_spec, resolve_object

_TAG = "bench_fsdp "


def _local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def worker(args: argparse.Namespace) -> None:
    """One replica: shard, one AdamW step, print this replica's bytes as one JSON line."""
    replicas.start(args.num_csx, "CPU", 120)  # launches args.num_csx processes of this command, or joins
    torch.manual_seed(0)
    build = resolve_object(get_model_spec("gpt2").model_fn)  # as a run builds model.name: gpt2
    model = build(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                        num_heads=4, filter_size=4 * args.hidden, max_position_embeddings=64, dropout_rate=0.0)
    strategy = FullyShardedStrategy() if args.num_csx > 1 else Strategy()
    model = strategy.shard(model, torch.device("cpu"))
    optimizer = AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, args.vocab, (2, 32))
    loss = model({"input_ids": ids, "labels": ids, "attention_mask": torch.ones_like(ids)})
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    params = sum(_local_bytes(p) for p in model.parameters())
    whole = sum(p.numel() * p.element_size() for p in model.parameters())  # a DTensor's numel is the global one
    sharded = scalars = 0
    for slot in optimizer.state.values():
        for value in slot.values():
            if isinstance(value, DTensor) or value.ndim > 0:
                sharded += _local_bytes(value)
            else:
                scalars += _local_bytes(value)
    print(_TAG + json.dumps({"n": args.num_csx, "rank": replicas.ordinal(), "params": params, "whole": whole,
                             "state": sharded, "scalars": scalars}), flush=True)


def _measure(n: int, args: argparse.Namespace) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, __file__, "--worker", "--num_csx", str(n), "--hidden", str(args.hidden),
               "--layers", str(args.layers), "--vocab", str(args.vocab)]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode:
        raise SystemExit(f"{n} replicas failed:\n{out.stderr[-2000:]}")
    return [json.loads(line[len(_TAG):]) for line in out.stdout.splitlines() if line.startswith(_TAG)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--num_csx", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    mib = 2.0**20
    base = None
    print(f"gpt2 {args.layers} blocks x {args.hidden} wide, vocab {args.vocab}; AdamW after one step; "
          "bytes held by each replica (the largest of the replicas)")
    print(f"{'replicas':>8} {'params MiB':>11} {'opt state MiB':>14} {'total MiB':>10} {'of 1':>7} {'ideal':>6} "
          f"{'overhead KiB':>13}")
    for n in args.replicas:
        rows = _measure(n, args)
        if len(rows) != n:
            raise SystemExit(f"{n} replicas printed {len(rows)} results")
        worst = max(rows, key=lambda r: r["params"] + r["state"] + r["scalars"])
        total = worst["params"] + worst["state"] + worst["scalars"]
        base = base or total
        overhead = total - base / n
        print(f"{n:>8} {worst['params'] / mib:>11.3f} {(worst['state'] + worst['scalars']) / mib:>14.3f} "
              f"{total / mib:>10.3f} {total / base:>7.4f} {1 / n:>6.3f} {overhead / 1024:>13.1f}")


if __name__ == "__main__":
    main()
