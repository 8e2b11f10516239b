"""Time per optimizer.step(): cs_run.optim vs torch.optim (foreach=True), AdamW and SGD with momentum.

~100 parameter tensors, ~25M parameters (50 square 700x700 weights + 50 biases), float32, CPU,
torch pinned to 1 thread (``--threads``). Variants are interleaved, each repeat times one step after a
warm-up, and the medians are printed side by side with their ratio (target: cs_run / torch <= 1.1).

Run: flock /tmp/cs_run_bench.lock .venv/bin/python bench/bench_optim.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import cs_run.optim as csoptim


def make_params(n_layers: int, width: int, seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    params = []
    for _ in range(n_layers):
        params.append(torch.nn.Parameter(torch.randn(width, width, generator=g) * 0.02))
        params.append(torch.nn.Parameter(torch.zeros(width)))
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 1e-3
    return params


VARIANTS = {
    "AdamW": (lambda ps: csoptim.AdamW(ps, lr=1e-3, eps=1e-8, weight_decay=0.01),
              lambda ps: torch.optim.AdamW(ps, lr=1e-3, eps=1e-8, weight_decay=0.01, foreach=True)),
    "SGD-momentum": (lambda ps: csoptim.SGD(ps, lr=1e-2, momentum=0.9),
                     lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, foreach=True)),
}


def time_step(opt: torch.optim.Optimizer) -> float:
    start = time.perf_counter()
    opt.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=50)
    parser.add_argument("--width", type=int, default=700)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    n_params = args.layers * (args.width * args.width + args.width)
    print(f"{2 * args.layers} tensors, {n_params / 1e6:.1f}M params, float32, torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s), {args.repeats} repeats (median)")
    print(f"{'optimizer':<14}{'cs_run ms':>11}{'torch ms':>10}{'ratio':>8}")
    for name, (ours, theirs) in VARIANTS.items():
        opts = {"cs_run": ours(make_params(args.layers, args.width)),
                "torch": theirs(make_params(args.layers, args.width))}
        times: dict[str, list[float]] = {k: [] for k in opts}
        for i in range(args.warmup + args.repeats):
            for key, opt in opts.items():  # interleaved: machine noise hits both alike
                elapsed = time_step(opt)
                if i >= args.warmup:
                    times[key].append(elapsed)
        ours_ms, theirs_ms = (statistics.median(times[k]) * 1e3 for k in ("cs_run", "torch"))
        print(f"{name:<14}{ours_ms:>11.2f}{theirs_ms:>10.2f}{ours_ms / theirs_ms:>8.3f}")


if __name__ == "__main__":
    main()
