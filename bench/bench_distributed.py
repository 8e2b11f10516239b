"""Steps/s and samples/s of 1 vs 2 data-parallel replicas on this machine, and a model of N = 1..64.

Each run is the cstorch custom loop (``cstorch.backend("CPU", cluster_config=ClusterConfig(num_csx=N))``,
``cstorch.compile``: the replicas are launched by cs-run's own launcher, torch DDP on gloo), each replica
pinned to one core and one thread. The model is fc_mnist's MLP (784-128-128-10, 118k parameters) on
synthetic batches of ``--batch`` samples per replica (weak scaling: the global batch grows with N).
The time of ``--steps`` steps after ``--warmup`` is taken between two barriers on ordinal 0.

Scaling efficiency = samples/s of N replicas / (N x samples/s of 1). The model below prints the step
time of N replicas as compute (the measured 1-replica step) + a ring all-reduce of the gradient bytes,
2 (N - 1) / N x bytes / bandwidth + 2 (N - 1) x latency, at ``--bandwidth`` GB/s and ``--latency`` us.

Run: /work/notes/heavy .venv/bin/python bench/bench_distributed.py   (or make bench)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

import cs_run as cstorch
from cs_run.distributed import ClusterConfig


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def worker(args: argparse.Namespace) -> None:
    """One replica (the launcher reruns this command in each): time the steady state, print on ordinal 0."""
    torch.set_num_threads(1)
    backend = cstorch.backend("CPU", cluster_config=ClusterConfig(num_csx=args.num_csx))
    cstorch.manual_seed(0)
    model = _mlp()
    compiled = cstorch.compile(model, backend)  # launches the replicas here (never returns in the launcher)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {local % os.cpu_count()})
    optimizer = cstorch.optim.SGD(compiled.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(local)
    x = torch.randn(args.batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        loss = loss_fn(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(args.warmup):
        step()
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    if world > 1:
        torch.distributed.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    if world > 1:
        torch.distributed.barrier()
    elapsed = time.perf_counter() - start
    if cstorch.distributed.is_master_ordinal():
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        print(json.dumps({"replicas": world, "steps_per_s": args.steps / elapsed,
                          "samples_per_s": args.steps * args.batch * world / elapsed, "grad_bytes": grad_bytes}),
              flush=True)


def ring_step_time(compute_s: float, grad_bytes: int, n: int, bandwidth_gbs: float, latency_us: float) -> float:
    """Compute + ring all-reduce (reduce-scatter then all-gather) of the gradients over n replicas."""
    if n == 1:
        return compute_s
    return compute_s + 2 * (n - 1) / n * grad_bytes / (bandwidth_gbs * 1e9) + 2 * (n - 1) * latency_us * 1e-6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="samples per replica per step")
    parser.add_argument("--bandwidth", type=float, default=12.5, help="GB/s per link (100 Gb/s Ethernet)")
    parser.add_argument("--latency", type=float, default=10.0, help="microseconds per ring hop")
    parser.add_argument("--num_csx", type=int, default=None, help=argparse.SUPPRESS)  # worker mode
    args = parser.parse_args()
    if args.num_csx is not None:
        worker(args)
        return
    results = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for n in (1, 2):
        command = [sys.executable, __file__, "--num_csx", str(n), "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--batch", str(args.batch)]
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            sys.exit(f"{n} replica(s) failed:\n{out.stderr}")
        results[n] = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    one = results[1]
    print(f"fc_mnist MLP, {one['grad_bytes'] / 1e6:.2f} MB of gradients, batch {args.batch} per replica, "
          f"{args.steps} steps after {args.warmup}, 1 thread per replica, {os.cpu_count()} cores, torch "
          f"{torch.__version__}")
    print(f"{'replicas':>8}{'steps/s':>10}{'samples/s':>11}{'efficiency':>12}")
    for n, r in results.items():
        efficiency = r["samples_per_s"] / (n * one["samples_per_s"])
        print(f"{n:>8}{r['steps_per_s']:>10.1f}{r['samples_per_s']:>11.0f}{efficiency:>11.0%}")
    compute = 1 / one["steps_per_s"]
    extra = 1 / results[2]["steps_per_s"] - compute
    print(f"2 replicas add {extra * 1e3:.2f} ms per step: as a ring all-reduce of the gradients that is "
          f"{one['grad_bytes'] / max(extra, 1e-9) / 1e9:.2f} GB/s effective (gloo over loopback TCP here)")
    print(f"\nModel: step = {compute * 1e3:.2f} ms compute (measured, 1 replica) + ring all-reduce of "
          f"{one['grad_bytes'] / 1e6:.2f} MB at {args.bandwidth:g} GB/s, {args.latency:g} us per hop")
    print(f"{'replicas':>8}{'step ms':>10}{'samples/s':>11}{'efficiency':>12}")
    for n in (1, 2, 4, 8, 16, 32, 64):
        t = ring_step_time(compute, one["grad_bytes"], n, args.bandwidth, args.latency)
        print(f"{n:>8}{t * 1e3:>10.3f}{n * args.batch / t:>11.0f}{compute / t:>11.0%}")


if __name__ == "__main__":
    main()
