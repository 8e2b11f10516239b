"""A Model Zoo decoder language model's training step: eager vs torch.compile vs the CSX engine, in tokens/s and MFU.

Run: ``python bench/bench_lm.py`` on a CUDA machine (GPT-2 small, 124M parameters, sequence 1024, bf16
autocast; ``make bench-gpu``), or ``python bench/bench_lm.py --quick`` anywhere (the same rows at tiny
sizes, float32 on a CPU, a few minutes).

The model is the registry's ``gpt2`` built from its Model Zoo ``model:`` keys (the bundled params file,
sizes overridden as printed), or with ``--model llama`` the ``llama`` family with the keys of the Model
Zoo's Llama-3.2-1B file (GQA, rotary, RMSNorm, SwiGLU) at sequence 2048, trained on a fixed batch of
random tokens. Every row runs the same
step as cs-run's runners: forward under autocast (bf16 on CUDA), backward, gradient clipping at 1.0
(``cstorch.amp.optimizer_step``), the optimizer step, zero_grad. Rows:

* eager:            the model + cs_run.optim.AdamW (the vendor's rule), eagerly: the vendor GPU backend's way
* eager-torch:      the model + torch.optim.AdamW(fused on CUDA, foreach on CPU) + clip_grad_norm_(foreach)
* compile:          torch.compile(model) + torch.optim.AdamW as eager-torch (the usual torch.compile loop)
* csx-fx / csx-inductor:        the whole step traced once by the CSX engine and replayed (cs_run.optim.AdamW)
* csx-fx-cg / csx-inductor-cg:  the same replayed as one CUDA graph (CUDA only; the engine's default there)

Reported per row, from interleaved repeats (A B C ..., A B C ...) and their medians:
tokens/s; MFU = tokens/s x FLOPs per token / peak, with FLOPs per token = 6 N + 12 L d T (PaLM appendix B,
nanoGPT's ``estimate_mfu``: N parameters without the position table, L layers, d width, T sequence;
causal attention counted in full); the peak is the device's dense bf16 datasheet figure on a known GPU,
else the measured matmul throughput of this machine in the step's dtype (named in the header); peak
device memory (CUDA: the row's own allocations from its build to the end of its warm-up); time to first
step (build + trace/compile + first call). Ratios are against eager in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import yaml

import cs_run as cstorch
from cs_run.engine import CompiledStep, EngineOptions
from cs_run.optim import AdamW
from cs_run.registry import get_model_spec, resolve_object

ROOT = Path(__file__).resolve().parent.parent
PARAMS = ROOT / "examples" / "gpt2" / "params.yaml"

# gpt2: GPT-2 small (Radford et al. 2019; the Model Zoo's params_gpt2_small.yaml) over the bundled params file's
# keys. llama: the model keys of the Model Zoo's Release_2.10.0 llama/configs/params_llama3p2_1b_msl_8k.yaml
# (GQA, rotary with llama3 scaling, RMSNorm, SwiGLU, tied embeddings) at sequence 2048. Each has a tiny
# twin for --quick.
LLAMA_3P2_1B = dict(
    attention_dropout_rate=0.0, attention_module="multiquery_attention", attention_type="scaled_dot_product",
    dropout_rate=0.0, embedding_dropout_rate=0.0, embedding_layer_norm=False,
    extra_attention_params={"num_kv_groups": 8}, initializer_range=0.02, layer_norm_epsilon=1.0e-05,
    loss_scaling="num_tokens", nonlinearity="swiglu", norm_type="rmsnorm",
    pos_scaling_extra_args={"high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192},
    pos_scaling_factor=32.0, pos_scaling_type="llama3", position_embedding_type="rotary", rope_theta=500000.0,
    share_embedding_weights=True, use_bias_in_output=False, use_ffn_bias=False, use_ffn_bias_in_attention=False,
    use_projection_bias_in_attention=False)
SIZES = {
    ("gpt2", "full"): dict(vocab_size=50257, hidden_size=768, num_hidden_layers=12, num_heads=12, filter_size=3072,
                           max_position_embeddings=1024, batch=16),
    ("gpt2", "quick"): dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_heads=4, filter_size=256,
                            max_position_embeddings=64, batch=4),
    ("llama", "full"): dict(vocab_size=128256, hidden_size=2048, num_hidden_layers=16, num_heads=32, filter_size=8192,
                            max_position_embeddings=2048, rotary_dim=64, batch=4),
    ("llama", "quick"): dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_heads=4, filter_size=128,
                             max_position_embeddings=64, rotary_dim=16, batch=4,
                             extra_attention_params={"num_kv_groups": 2}),
}
# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, FLOP/s.
DATASHEET_BF16_PEAK = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}
_COMPILE_DIRS: dict[str, str] = {}  # per tier: a -cg row reuses its tier's build (its 1st step is a warm one)
ROWS = ("eager", "eager-torch", "compile", "csx-fx", "csx-inductor", "csx-fx-cg", "csx-inductor-cg")


@dataclass
class Row:
    """One bench row: its step (a no-argument call) and what its build cost."""

    call: Callable[[], torch.Tensor]
    build_s: float
    mem_before: int


def model_keys(model: str, size: str) -> tuple[dict, int, int]:
    """The model's keys with the bench's sizes, the batch size and the sequence length."""
    if model == "gpt2":
        keys = dict(yaml.safe_load(PARAMS.read_text())["model"])
        keys.pop("name")
        keys.pop("mixed_precision", None)  # the bench sets the precision itself
    else:
        keys = dict(LLAMA_3P2_1B)
    sizes = dict(SIZES[model, size])
    batch = sizes.pop("batch")
    keys.update(sizes, dropout_rate=0.0, attention_dropout_rate=0.0, compute_eval_metrics=False)
    return keys, batch, sizes["max_position_embeddings"]


def build_lm(keys: dict, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device(device):  # built in place: no host copy of a large model first
        return resolve_object(get_model_spec(keys.get("name", "gpt2")).model_fn, key="model.name")(
            **{k: v for k, v in keys.items() if k != "name"})


def flops_per_token(model: torch.nn.Module, keys: dict, seq: int) -> float:
    """6 N + 12 L d T, N without the position table (it is a lookup, not a matmul)."""
    n = sum(p.numel() for name, p in model.named_parameters() if "position_embeddings" not in name)
    # (a tied output layer is one parameter here and counts once: its matmul is the lm head's)
    return 6 * n + 12 * keys["num_hidden_layers"] * keys["hidden_size"] * seq


def measured_peak(device: torch.device, dtype: torch.dtype) -> float:
    """Matmul throughput of this device in ``dtype``: the best of a few large products, FLOP/s."""
    n = 4096 if device.type == "cuda" else 512
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(8):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def resolve_peak(device: torch.device, dtype: torch.dtype, override: float | None) -> tuple[float, str]:
    if override:
        return override * 1e12, f"given --peak_tflops {override:g}"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in DATASHEET_BF16_PEAK.items():
            if key in name and dtype == torch.bfloat16:
                return peak, f"{name} dense bf16 datasheet peak {peak / 1e12:.1f} TFLOP/s"
    peak = measured_peak(device, dtype)
    return peak, f"measured {str(dtype).removeprefix('torch.')} matmul throughput {peak / 1e12:.3f} TFLOP/s"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync point: the timers must see the queued kernels finish


def batch_of(keys: dict, batch: int, seq: int, device: torch.device) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, keys["vocab_size"], (batch, seq + 1), generator=g)
    return {"input_ids": ids[:, :-1].contiguous().to(device), "labels": ids[:, 1:].contiguous().to(device),
            "attention_mask": torch.ones(batch, seq, dtype=torch.int32, device=device)}


def make_row(name: str, keys: dict, data: dict, device: torch.device, dtype: torch.dtype | None) -> Row:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    mem_before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    t0 = time.perf_counter()
    model = build_lm(keys, device)
    autocast = (lambda: cstorch.amp.autocast(device_type=device.type, dtype=dtype)) if dtype else contextlib.nullcontext
    if name in ("eager-torch", "compile"):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01,
                                **({"fused": True} if device.type == "cuda" else {"foreach": True}))
        forward = torch.compile(model) if name == "compile" else model

        def torch_step():
            with autocast():
                loss = forward(data)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        return Row(torch_step, time.perf_counter() - t0, mem_before)
    cs_opt = AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01)

    def step(batch):
        with autocast():
            loss = model(batch)
        cstorch.amp.optimizer_step(loss, cs_opt, None, max_gradient_norm=1.0)  # backward, clip, step, zero_grad
        return loss

    if name == "eager":
        return Row(lambda: step(data), time.perf_counter() - t0, mem_before)
    tier = name.split("-")[1]
    compile_dir = _COMPILE_DIRS.setdefault(tier, tempfile.mkdtemp(prefix=f"cs_run_bench_lm_{tier}_"))
    compiled = CompiledStep(step, EngineOptions(compile_tier=tier, compile_dir=compile_dir, cuda_graphs=name.endswith("-cg")))
    return Row(lambda: compiled(data), time.perf_counter() - t0, mem_before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (any machine, a few minutes)")
    parser.add_argument("--model", choices=("gpt2", "llama"), default="gpt2",
                        help="gpt2 (GPT-2 small) or llama (Llama-3.2-1B's Model Zoo keys at sequence 2048)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated subset of {', '.join(ROWS)}")
    parser.add_argument("--steps", type=int, default=None, help="steps per timed repeat (default 10; quick 5)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=None, help="override the batch size")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                        help="autocast dtype (default: bfloat16 on CUDA, float32 on a CPU)")
    parser.add_argument("--peak_tflops", type=float, default=None, help="the peak to divide by, TFLOP/s")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--profile", type=int, nargs="?", const=12, default=0, metavar="TOP",
                        help="after the table, profile each row: its kernels by class and its TOP (default 12) "
                             "costliest kernels, device time per step (CPU time on a CPU)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype_name = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    dtype = getattr(torch, dtype_name)
    keys, batch, seq = model_keys(args.model, "quick" if args.quick else "full")
    keys["name"] = args.model
    batch = args.batch or batch
    steps = args.steps or (5 if args.quick else 10)
    names = [r for r in args.rows.split(",") if r and (device.type == "cuda" or not r.endswith("-cg"))]
    unknown = sorted(set(names) - set(ROWS))
    if unknown:
        parser.error(f"--rows: unknown {', '.join(unknown)}; choose from {', '.join(ROWS)}")
    data = batch_of(keys, batch, seq, device)
    peak, peak_note = resolve_peak(device, dtype, args.peak_tflops)
    probe = build_lm(keys, torch.device("meta"))
    fpt = flops_per_token(probe, keys, seq)
    n_params = sum(p.numel() for p in probe.parameters())
    del probe
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} thread(s)"
    print(f"bench_lm: {args.model} {n_params / 1e6:.1f}M params (L{keys['num_hidden_layers']} d{keys['hidden_size']} "
          f"h{keys['num_heads']} T{seq} V{keys['vocab_size']}), batch {batch}, "
          f"{'float32, no autocast' if dtype == torch.float32 else dtype_name + ' autocast'}; torch "
          f"{torch.__version__}, {where}")
    print(f"  FLOPs/token 6N+12LdT = {fpt / 1e6:.1f} MFLOP; peak: {peak_note}; medians of {args.repeats} "
          f"interleaved repeats x {steps} steps")
    rows = run_rows(names, keys, data, device, dtype if dtype != torch.float32 else None, steps, args.repeats,
                    batch * seq, fpt, peak)
    if args.profile:
        for name, row in rows.items():
            profile_row(name, row, device, steps, args.profile)


def run_rows(names, keys, data, device, dtype, steps, repeats, tokens, fpt, peak) -> dict[str, Row]:
    rows, first, mem = {}, {}, {}
    for name in names:  # build + warm up one row at a time, so its memory peak is its own
        try:
            row = make_row(name, keys, data, device, dtype)
            sync(device)
            t0 = time.perf_counter()
            row.call()
            sync(device)
            first[name] = row.build_s + time.perf_counter() - t0
            for _ in range(3):
                row.call()
            sync(device)
        except Exception as e:  # a compiler that cannot build this step: report the row and go on
            print(f"  {name}: FAILED: {type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}")
            continue
        if device.type == "cuda":
            mem[name] = torch.cuda.max_memory_allocated(device) - row.mem_before
        rows[name] = row
        print(f"  built {name}: first step after {first[name]:.1f} s", flush=True)
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(repeats):
        for name, row in rows.items():
            sync(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                row.call()
            sync(device)
            samples[name].append((time.perf_counter() - t0) / steps)
    med = {name: statistics.median(s) for name, s in samples.items()}
    base = med.get("eager")
    print(f"  {'row':18s} {'ms/step':>9s} {'tokens/s':>11s} {'MFU':>7s} {'vs eager':>9s} {'peak mem GB':>12s} "
          f"{'1st step s':>10s}")
    for name, t in med.items():
        mfu = tokens / t * fpt / peak
        ratio = f"{base / t:8.2f}x" if base else "      n/a"
        memory = f"{mem[name] / 2**30:12.2f}" if name in mem else f"{'n/a':>12s}"
        print(f"  {name:18s} {t * 1e3:9.2f} {tokens / t:11.0f} {mfu:7.1%} {ratio} {memory} {first[name]:10.1f}")
    return rows


# Kernel classes by name: cuBLAS/cuBLASLt/CUTLASS GEMMs, flash/cuDNN/efficient attention, torch's own
# multi-tensor kernels (fused AdamW, foreach), inductor's generated kernels by kind, copies, ATen's eager
# elementwise and reduction kernels, then everything else. On a CPU the events are ATen ops and the
# profiler does not see inside an ahead-of-time compiled step library.
KERNEL_CLASSES = (
    ("gemm", re.compile(r"gemm|nvjet|cutlass|xmma|cublas|\b(addmm|mm|bmm|matmul|linear)\b", re.I)),
    ("attention", re.compile(r"flash|fmha|sdpa|attention|attn", re.I)),
    ("torch multi-tensor", re.compile(r"multi_tensor|foreach|fused_adam|FusedAdam", re.I)),
    ("inductor pointwise", re.compile(r"^triton_poi|^cpp_fused")),
    ("inductor reduction", re.compile(r"^triton_(red|per)")),
    ("copies, fills", re.compile(r"copy|memcpy|memset|fill|\bcat\b", re.I)),
    ("eager elementwise", re.compile(r"elementwise_kernel|reduce_kernel")),
)


def kernel_class(name: str) -> str:
    return next((label for label, pattern in KERNEL_CLASSES if pattern.search(name)), "other")


def profile_row(name: str, row: Row, device: torch.device, steps: int, top: int) -> None:
    """Where one row's step time goes: device time per step by kernel class, its costliest kernels, and
    its kernel launches per step (CPU time and ops on a CPU, where the compiled tiers show as one call)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            row.call()
        sync(device)
    on_device = device.type == "cuda"
    kernels = []  # (name, self time per step in us, calls per step)
    for event in prof.key_averages():
        if on_device:
            self_us = getattr(event, "self_device_time_total", None)
            self_us = self_us if self_us is not None else event.self_cuda_time_total
            if self_us <= 0 or event.device_type != torch.autograd.DeviceType.CUDA:
                continue
        else:
            self_us = event.self_cpu_time_total
            if self_us <= 0:
                continue
        kernels.append((event.key, self_us / steps, event.count / steps))
    total = sum(us for _, us, _ in kernels) or 1.0
    by_class: dict[str, list[float]] = {}
    for kernel, us, calls in kernels:
        spent = by_class.setdefault(kernel_class(kernel), [0.0, 0.0])
        spent[0] += us
        spent[1] += calls
    where = "device" if on_device else "CPU"
    print(f"  profile {name}: {total / 1e3:.2f} ms {where} time per step in {sum(c for *_, c in kernels):.0f} "
          f"{'kernels' if on_device else 'op calls'}")
    for label, (us, calls) in sorted(by_class.items(), key=lambda item: -item[1][0]):
        print(f"    {label:20s} {us / 1e3:8.2f} ms {us / total:6.1%} {calls:7.0f} calls")
    for kernel, us, calls in sorted(kernels, key=lambda k: -k[1])[:top]:
        print(f"      {us / 1e3:8.3f} ms {calls:5.0f}x  {kernel[:110]}")


if __name__ == "__main__":
    main()
