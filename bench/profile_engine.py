"""Where the nanoGPT-style training step's time goes: eager PyTorch vs the CSX inductor tier, per kernel class.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python bench/profile_engine.py`` (about 2 minutes with one inductor
compile; one torch thread). Prints

* the unprofiled step times (interleaved, medians) and their ratio;
* a table of self CPU ms per step under torch.profiler for each kernel class, eager and CSX side by
  side (the CSX step is compiled with inductor's ``cpp.enable_kernel_profile`` so its fused kernels are
  named; profiled rounds alternate between the two and the medians are shown; the profiler adds some
  overhead per recorded op, so these sum to more than the unprofiled times);
* what CSX's GEMM and attention calls take of its profiled step, and the step's own GEMMs and attention
  calls timed alone at their shapes and strides (each on its own inputs: colder caches than inside the
  step), i.e. what any tier that keeps ATen's GEMM and flash-attention kernels needs; the FLOP count at
  the rate of those GEMMs.

The step is bench_engine.py's (make_nano_variants): 2 layers, d=128, 4 heads, T=64, B=8, vocab 512,
clip_grad_norm_(1.0) + AdamW.
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import tempfile
import time

import torch
from bench_engine import NANO, NanoGPT, nano_batch, nano_flops, nano_step
from torch.profiler import ProfilerActivity, profile

from cs_run.engine import CompiledStep, EngineOptions
from cs_run.engine.state import discover_state
from cs_run.engine.trace import trace_step
from cs_run.optim import AdamW

aten = torch.ops.aten

# (class, pattern on the profiler event name), first match wins. CSX's fused kernels are named after the
# aten ops they contain (cpp_fused_<ops>_<n>); eager's events are aten ops.
CLASSES = [
    ("GEMM (mm, addmm, bmm)", r"(aten::|aoti_torch_cpu_)(mm|addmm|bmm)(_out)?$"),
    ("attention forward (flash)", r"scaled_dot_product.*(?<!backward)$"),
    ("attention backward (flash)", r"scaled_dot_product.*backward"),
    ("clip-norm + optimizer update", r"_foreach|lerp|addcdiv|addcmul|Optimizer|clip|aten::sqrt|aten::div_|reciprocal"),
    ("cross-entropy fwd+bwd", r"log_softmax|nll_loss"),
    ("GELU fwd+bwd", r"gelu|erf|fused_add_exp_mul"),
    ("layer norm fwd+bwd (+ residual adds)", r"layer_norm"),
    ("gradient norms (clip-norm partial sums)", r"linalg_vector_norm|aten::stack"),
    ("embedding fwd+bwd", r"embedding|index_select|index_add|index_put"),
    ("copies (addmm's bias broadcast, casts)", r"aten::(copy_|_to_copy|to|expand)$"),
    ("allocation and zero fills", r"aten::(empty|empty_like|empty_strided|zeros|zero_|fill_|ones_like|new_zeros)$"),
    ("other fused kernels", r"cpp_fused"),
    ("other aten ops (views, adds, sums)", r"^aten::"),
]


def classify(name: str) -> str:
    for label, pattern in CLASSES:
        if re.search(pattern, name):
            return label
    return "framework (autograd engine, Python, wrappers)"


def make_steps(compile_dir: str):
    cfg, idx, targets = nano_batch()

    def step_of(model, opt):
        return nano_step(model, model, opt)

    torch.manual_seed(0)
    model = NanoGPT(**cfg)
    eager = step_of(model, torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True))
    torch.manual_seed(0)
    model = NanoGPT(**cfg)
    csx_fn = step_of(model, AdamW(model.parameters(), lr=1e-3))
    csx = CompiledStep(csx_fn, EngineOptions(compile_tier="inductor", compile_dir=compile_dir))
    torch.manual_seed(0)
    model = NanoGPT(**cfg)
    probe = step_of(model, AdamW(model.parameters(), lr=1e-3))
    traced = trace_step(probe, discover_state(probe), (idx, targets), {})
    return {"eager": lambda: eager(idx, targets), "csx": lambda: csx(idx, targets)}, traced


def interleaved(fns: dict, repeats: int, steps: int) -> dict[str, float]:
    """Median ms per call (thread CPU time: the host is shared) over interleaved repeats."""
    samples = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            f()
            t0 = time.thread_time()
            for _ in range(steps):
                f()
            samples[k].append((time.thread_time() - t0) / steps * 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}


def profiled(fns: dict, rounds: int, steps: int) -> dict[str, dict[str, float]]:
    """Median self CPU ms per step of each kernel class, profiled rounds alternating between ``fns``."""
    acc = {k: collections.defaultdict(list) for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            f()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(steps):
                    f()
            per_class: dict[str, float] = collections.defaultdict(float)
            for event in prof.key_averages():
                per_class[classify(event.key)] += event.self_cpu_time_total / steps / 1e3
            for label in {c for c, _ in CLASSES} | set(per_class) | {"framework (autograd engine, Python, wrappers)"}:
                acc[k][label].append(per_class.get(label, 0.0))
    return {k: {label: statistics.median(v) for label, v in classes.items()} for k, classes in acc.items()}


def floor_calls(traced) -> tuple[dict, float]:
    """Callables running the step's own GEMMs alone and its attention calls alone (same shapes and strides,
    GEMMs into preallocated outputs as inside the step), and the GEMMs' FLOPs."""
    calls, flops = {"GEMMs alone": [], "attention alone": []}, 0.0
    for node in traced.gm.graph.nodes:
        if node.target in (aten.mm.default, aten.addmm.default, aten.bmm.default,
                           aten._scaled_dot_product_flash_attention_for_cpu.default,
                           aten._scaled_dot_product_flash_attention_for_cpu_backward.default):
            args = [torch.empty_strided(a.meta["val"].shape, a.meta["val"].stride()).normal_()
                    if isinstance(a, torch.fx.Node) else a for a in node.args]
            kwargs = dict(node.kwargs)
            if "flash" in str(node.target):
                calls["attention alone"].append((node.target, args, kwargs))
                continue
            a, b = args[-2], args[-1]
            flops += 2 * a.shape[-2] * a.shape[-1] * b.shape[-1] * (a.shape[0] if a.dim() == 3 else 1)
            kwargs["out"] = torch.empty(node.meta["val"].shape)
            out_op = {aten.mm.default: aten.mm.out, aten.addmm.default: aten.addmm.out, aten.bmm.default: aten.bmm.out}
            calls["GEMMs alone"].append((out_op[node.target], args, kwargs))

    def runner(group):
        def run():
            for target, args, kwargs in group:
                target(*args, **kwargs)
        return run

    return {name: runner(group) for name, group in calls.items()}, flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="interleaved timing repeats")
    parser.add_argument("--rounds", type=int, default=3, help="profiled rounds per variant (alternating)")
    parser.add_argument("--steps", type=int, default=10, help="steps per repeat / profiled round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import torch._inductor.config as inductor_config  # noqa: PLC0415, TID253  (heavy; name the fused kernels)

    with tempfile.TemporaryDirectory(prefix="cs_run_profile_") as compile_dir, \
            inductor_config.patch({"cpp.enable_kernel_profile": True}):
        fns, traced = make_steps(compile_dir)
        t0 = time.perf_counter()
        fns["csx"]()  # the compile
        print(f"torch {torch.__version__}, 1 thread; CSX inductor build {time.perf_counter() - t0:.1f} s")
        for f in fns.values():
            for _ in range(3):
                f()
        alone, gemm_flops = floor_calls(traced)
        timed = interleaved({**fns, **alone}, args.repeats, args.steps)
        table = profiled(fns, args.rounds, args.steps)
    eager, csx, gemm_ms, attn_ms = timed["eager"], timed["csx"], timed["GEMMs alone"], timed["attention alone"]
    print(f"unprofiled step (thread CPU ms, median of {args.repeats} interleaved): eager {eager:.2f}, "
          f"CSX inductor {csx:.2f} ({eager / csx:.2f}x eager)")
    print(f"\n{'kernel class (profiled self CPU ms/step)':48s} {'eager':>8s} {'CSX':>8s}")
    labels = sorted(table["eager"], key=lambda c: -(table["eager"][c] + table["csx"].get(c, 0.0)))
    for label in labels:
        e, c = table["eager"].get(label, 0.0), table["csx"].get(label, 0.0)
        if e >= 0.005 or c >= 0.005:
            print(f"{label:48s} {e:8.2f} {c:8.2f}")
    total_e, total_c = sum(table["eager"].values()), sum(table["csx"].values())
    print(f"{'total (profiled)':48s} {total_e:8.2f} {total_c:8.2f}")
    kept = sum(v for k, v in table["csx"].items() if k.startswith(("GEMM", "attention")))
    print(f"CSX's GEMM and attention calls take {kept:.2f} of its {total_c:.2f} profiled ms: were everything else "
          f"free, the step would run at {total_e / kept:.2f}x eager (profiled totals)")
    rate = gemm_flops / (gemm_ms / 1e3) / 1e9
    both = gemm_ms + attn_ms
    print(f"\nfloors (unprofiled, timed in the same interleaved loop; each call on its own inputs, so colder caches "
          f"than inside the step): the step's {gemm_flops / 1e6:.0f} MFLOP of GEMMs alone "
          f"{gemm_ms:.2f} ms ({rate:.1f} GFLOP/s), its attention calls alone {attn_ms:.2f} ms; together "
          f"{both:.2f} ms = {both / eager:.2f} of eager: a ceiling of {eager / both:.2f}x eager for any tier that "
          f"keeps ATen's GEMM and flash-attention kernels; all matmul FLOPs incl. attention "
          f"({nano_flops(**NANO) / 1e6:.0f} MFLOP) take {nano_flops(**NANO) / (rate * 1e9) * 1e3:.2f} ms at that rate")


if __name__ == "__main__":
    main()
