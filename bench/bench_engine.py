"""CSX engine vs eager PyTorch vs torch.compile vs the FLOP floor, per training step (ratios against peers in the same run).

Run: ``flock /tmp/cs_run_bench.lock .venv/bin/python bench/bench_engine.py`` (about 3-5 minutes on one
core; ``--quick`` skips the inductor variants and the cold/warm subprocesses).

Every variant trains the same MLP (Linear+ReLU stack, cross-entropy, SGD with momentum) on the same
fixed batch, with the step in the order cs-run's runners use (forward, backward, optimizer step,
zero_grad(set_to_none=True)): no gradients outlive the step, so the CSX graph has no gradient outputs.
Variants are timed interleaved (A B C D, A B C D, ...) and medians reported, because the hosts are
shared and noisy. Torch runs on ONE thread (``torch.set_num_threads(1)``) unless
``--threads`` says otherwise.

* eager:        model + torch.optim.SGD(foreach=True), the usual loop
* compile:      torch.compile(model) + torch.optim.SGD(foreach=True)
* csx-fx:       cstorch.trace step on the CSX backend, fx tier (bit-identical to eager)
* csx-inductor: the same, inductor tier
* csx-auto:     the same, compile_tier auto (the default): its first steps time fx against inductor
                and keep the faster; the row names the tier it kept. Warm-up runs until it has chosen.
                It shares csx-inductor's compile_dir, so its "1st call" is a warm-cache one; the
                cold/warm time-to-first-step lines at the end measure both in fresh processes.
* floor:        FLOPs of the step / measured matmul throughput

The GPT-2 rows train the bundled example's model (examples/gpt2/params.yaml: its model keys, batch
size and sequence length, dropout on) with AdamW on a fixed batch of random tokens, and report
tokens/s (eager and compile use torch.optim.AdamW(foreach=True), CSX cs_run.optim.AdamW).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import yaml

from cs_run.engine import CompiledStep, EngineOptions
from cs_run.models.common.lm import build_model
from cs_run.optim import SGD, AdamW

MODELS = {  # name: (in, depth, hidden, out, batch)
    "fc_mnist d10 h50": (784, 10, 50, 10, 128),
    "fc_mnist d10 h256": (784, 10, 256, 10, 128),
    "compute-bound d4 h1024 b512": (1024, 4, 1024, 1024, 512),
}


def build_mlp(d_in: int, depth: int, hidden: int, d_out: int) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    d = d_in
    for _ in range(depth):
        layers += [torch.nn.Linear(d, hidden), torch.nn.ReLU()]
        d = hidden
    layers.append(torch.nn.Linear(d, d_out))
    return torch.nn.Sequential(*layers)


def step_flops(d_in: int, depth: int, hidden: int, d_out: int, batch: int) -> float:
    """Matmul FLOPs: forward, grad-input (not for the first layer) and grad-weight of every Linear."""
    dims = [d_in] + [hidden] * depth + [d_out]
    total = 0.0
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        total += 2 * batch * a * b * (2 if i == 0 else 3)
    return total


def matmul_gflops() -> float:
    a, w = torch.randn(512, 1024), torch.randn(1024, 1024)
    for _ in range(3):
        a @ w
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        a @ w
        times.append(time.perf_counter() - t0)
    return 2 * 512 * 1024 * 1024 / statistics.median(times) / 1e9


def make_variants(spec, with_inductor: bool, with_compile: bool) -> dict:
    d_in, depth, hidden, d_out, batch = spec
    x, y = torch.randn(batch, d_in), torch.randint(0, d_out, (batch,))
    variants = {}

    def eager_like(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)

        def step():
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        return step

    torch.manual_seed(0)
    variants["eager"] = eager_like(build_mlp(d_in, depth, hidden, d_out))
    if with_compile:
        torch.manual_seed(0)
        variants["compile"] = eager_like(torch.compile(build_mlp(d_in, depth, hidden, d_out)))
    tiers = ["fx"] + (["inductor", "auto"] if with_inductor else [])
    dirs: dict[str, str] = {}
    for tier in tiers:
        torch.manual_seed(0)
        model = build_mlp(d_in, depth, hidden, d_out)
        opt = SGD(model.parameters(), lr=0.01, momentum=0.9)
        # auto reuses inductor's compile_dir: its 1st call is a warm-cache one
        compile_dir = dirs.setdefault("inductor" if tier == "auto" else tier, tempfile.mkdtemp(prefix="cs_run_bench_"))

        def csx_step(xb, yb, model=model, opt=opt):
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        compiled = CompiledStep(csx_step, EngineOptions(compile_tier=tier, compile_dir=compile_dir))
        variants[f"csx-{tier}"] = settled_call(compiled, x, y)
    return variants


def settled_call(compiled, *batch):
    """A bench variant for a CompiledStep; ``.tier()`` is the tier it runs (auto: once its trial chose)."""
    def run():
        return compiled(*batch)

    def tier():
        executable = next(iter(compiled._executables.values()))[1] if compiled._executables else None
        choice = getattr(executable, "choice", "")  # a TierTrial: None until the trial decided
        return choice if choice is not None else None

    run.tier = tier
    return run


class NanoBlock(torch.nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.d, self.heads = d, heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (u.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for u in self.qkv(self.ln1(x)).split(d, dim=-1))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class NanoGPT(torch.nn.Module):
    """nanoGPT-style decoder: token + position embeddings, pre-LN blocks (SDPA, GELU MLP), LM head."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, d), torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(NanoBlock(d, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.register_buffer("pos", torch.arange(seq), persistent=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(self.pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


NANO = {"vocab": 512, "d": 128, "heads": 4, "layers": 2, "seq": 64, "batch": 8}


def nano_flops(vocab: int, d: int, heads: int, layers: int, seq: int, batch: int) -> float:
    """Matmul FLOPs of one step: per token 12 d^2 per layer (qkv, proj, MLP) + 2 T d (scores, values,
    causal mask not exploited) + V d (head); backward twice the forward."""
    return 3 * 2 * batch * seq * (layers * (12 * d * d + 2 * seq * d) + vocab * d)


def nano_batch() -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The nanoGPT-style model's keyword arguments and one fixed batch (tokens, targets)."""
    cfg = {k: v for k, v in NANO.items() if k != "batch"}
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg["vocab"], (NANO["batch"], cfg["seq"]), generator=g)
    targets = torch.randint(0, cfg["vocab"], (NANO["batch"], cfg["seq"]), generator=g)
    return cfg, idx, targets


def nano_step(model, forward, opt):
    """The nanoGPT-style training step: forward, backward, clip_grad_norm_(1.0), the optimizer, zero_grad."""
    def step(idx, targets):
        loss = forward(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        return loss

    return step


def make_nano_variants(with_inductor: bool, with_compile: bool) -> tuple[dict, int]:
    """The nanoGPT-style step per variant; tokens per step."""
    cfg, idx, targets = nano_batch()
    step_of = nano_step
    variants = {}
    torch.manual_seed(0)
    model = NanoGPT(**cfg)
    eager = step_of(model, model, torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True))
    variants["eager"] = lambda: eager(idx, targets)
    if with_compile:
        torch.manual_seed(0)
        model = NanoGPT(**cfg)
        compiled_model = step_of(model, torch.compile(model),
                                 torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True))
        variants["compile"] = lambda: compiled_model(idx, targets)
    dirs: dict[str, str] = {}
    for tier in ["fx"] + (["inductor", "auto"] if with_inductor else []):
        torch.manual_seed(0)
        model = NanoGPT(**cfg)
        compile_dir = dirs.setdefault("inductor" if tier == "auto" else tier, tempfile.mkdtemp(prefix="cs_run_bench_"))
        compiled = CompiledStep(step_of(model, model, AdamW(model.parameters(), lr=1e-3)),
                                EngineOptions(compile_tier=tier, compile_dir=compile_dir))
        variants[f"csx-{tier}"] = settled_call(compiled, idx, targets)
    return variants, NANO["batch"] * cfg["seq"]


def nano_rows(args, peak: float) -> None:
    variants, tokens = make_nano_variants(with_inductor=not args.quick, with_compile=not args.quick)
    med, first = time_variants(variants, steps=max(2, args.steps // 4), repeats=args.repeats)
    name = "nanoGPT L{layers} d{d} T{seq} b{batch}".format(**NANO)
    floor = nano_flops(**NANO) / (peak * 1e9)
    for v, t in med.items():
        vs_c = f"{med['compile'] / t:9.2f}x" if "compile" in med else f"{'-':>10s}"
        label = f"{v}({variants[v].tier()})" if v == "csx-auto" else v
        print(f"{name:30s} {label:18s} {t * 1e3:8.3f} {med['eager'] / t:8.2f}x {vs_c} {t / floor:8.2f}x "
              f"{first[v]:10.2f}")
    print(f"{name:30s} {'floor':18s} {floor * 1e3:8.3f}   ({nano_flops(**NANO) / 1e6:.0f} MFLOP/step, "
          f"{tokens} tokens/step)")


def gpt2_example() -> tuple[dict, int, int]:
    """The bundled gpt2 example's model keys, batch size and sequence length."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "gpt2", "params.yaml")
    with open(path) as f:
        params = yaml.safe_load(f)
    keys = {k: v for k, v in params["model"].items() if k not in ("name", "mixed_precision")}
    return keys, params["train_input"]["batch_size"], keys["max_position_embeddings"]


def make_gpt2_variants(with_inductor: bool, with_compile: bool) -> tuple[dict, int]:
    """GPT-2 training steps (forward with the loss mask, backward, AdamW, zero_grad); tokens per step."""
    keys, batch, msl = gpt2_example()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, keys["vocab_size"], (batch, msl + 1), generator=g, dtype=torch.int32)
    data = {"input_ids": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous(),
            "attention_mask": torch.ones(batch, msl, dtype=torch.int32)}
    variants = {}

    def eager_like(model, forward):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)

        def step():
            loss = forward(data)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        return step

    torch.manual_seed(0)
    model = build_model(**keys).train()
    variants["eager"] = eager_like(model, model)
    if with_compile:
        torch.manual_seed(0)
        model = build_model(**keys).train()
        variants["compile"] = eager_like(model, torch.compile(model))
    dirs: dict[str, str] = {}
    for tier in ["fx"] + (["inductor", "auto"] if with_inductor else []):
        torch.manual_seed(0)
        model = build_model(**keys).train()
        opt = AdamW(model.parameters(), lr=1e-3)

        def csx_step(batch, model=model, opt=opt):
            loss = model(batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        # auto reuses inductor's compile_dir: its 1st call is a warm-cache one
        compile_dir = dirs.setdefault("inductor" if tier == "auto" else tier, tempfile.mkdtemp(prefix="cs_run_bench_"))
        compiled = CompiledStep(csx_step, EngineOptions(compile_tier=tier, compile_dir=compile_dir))
        variants[f"csx-{tier}"] = settled_call(compiled, data)
    return variants, batch * msl


def gpt2_rows(args) -> None:
    keys, batch, msl = gpt2_example()
    variants, tokens = make_gpt2_variants(with_inductor=not args.quick, with_compile=not args.quick)
    med, first = time_variants(variants, steps=max(2, args.steps // 4), repeats=args.repeats)
    name = f"gpt2 example L{keys['num_hidden_layers']} h{keys['hidden_size']} b{batch}x{msl}"
    for v, t in med.items():
        vs_c = f"{med['compile'] / t:9.2f}x" if "compile" in med else f"{'-':>10s}"
        label = f"{v}({variants[v].tier()})" if v == "csx-auto" else v
        print(f"{name:30s} {label:18s} {t * 1e3:8.3f} {med['eager'] / t:8.2f}x {vs_c} {tokens / t:9.0f} "
              f"{first[v]:10.2f}")


def time_variants(variants: dict, steps: int, repeats: int, sync=lambda: None,
                  skip_failed: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per step of each variant over interleaved repeats, and each one's first call.

    ``sync`` waits for queued device work (``torch.cuda.synchronize`` on a GPU) around every timing;
    ``skip_failed``: a variant whose first call raises (a compiler that cannot build its graph) is
    reported and dropped instead of ending the bench.
    """
    first = {}
    for name, fn in list(variants.items()):  # warm-up (includes trace/compile), timed separately
        sync()
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:
            if not skip_failed:
                raise
            print(f"    {name}: FAILED to build: {type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}")
            del variants[name]
            continue
        sync()
        first[name] = time.perf_counter() - t0
        for _ in range(3):
            fn()
        for _ in range(200):  # auto: the trial's steps are part of the warm-up
            if getattr(fn, "tier", lambda: "")() is not None:
                break
            fn()
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            sync()
            samples[name].append((time.perf_counter() - t0) / steps)
    return {k: statistics.median(v) for k, v in samples.items()}, first


_TTFS_SCRIPT = r"""
import json, resource, time, sys
t0 = time.perf_counter()
import torch
torch.set_num_threads(1)
import cs_run as cstorch
t1 = time.perf_counter()
sys.path.insert(0, {bench_dir!r})
from bench_engine import build_mlp
from cs_run.optim import SGD
from cs_run.engine import compile as engine_compile
cstorch.backend("CSX", compile_dir={compile_dir!r}, compile_tier={tier!r})
torch.manual_seed(0)
model = cstorch.compile(build_mlp(784, 10, 50, 10))
opt = SGD(model.parameters(), lr=0.01, momentum=0.9)
@cstorch.trace
def step(x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    return loss
x, y = torch.randn(128, 784), torch.randint(0, 10, (128,))
t_dynamo = time.perf_counter()
import torch._dynamo  # the trace's fake tensors import it anyway; timed on its own here
t_dynamo = time.perf_counter() - t_dynamo
float(step(x, y))
t2 = time.perf_counter()
cpu = sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
          for f in ("ru_utime", "ru_stime"))
print(json.dumps({{"counts": dict(engine_compile.COUNTS), "wall": t2 - t0, "imports": t1 - t0,
                  "after_imports": t2 - t1, "dynamo_import": t_dynamo, "cpu": cpu}}))
"""


def time_to_first_step(threads: int, tier: str = "inductor") -> tuple[dict, dict]:
    """Cold (empty compile_dir) then warm (same compile_dir) time to first step, in fresh processes:
    wall seconds from before ``import torch`` to the first step's loss, the part after ``import torch,
    cs_run``, and the process's CPU seconds (children included: a loaded host inflates wall time, not
    CPU time). The warm process must not compile."""
    compile_dir = tempfile.mkdtemp(prefix="cs_run_ttfs_")
    script = _TTFS_SCRIPT.format(bench_dir=os.path.dirname(os.path.abspath(__file__)), compile_dir=compile_dir,
                                 tier=tier)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    out = []
    for _ in range(2):
        res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
        out.append(json.loads(res.stdout.strip().splitlines()[-1]))
    if "inductor_compile" in out[1]["counts"]:
        raise RuntimeError(f"the warm process compiled again: {out[1]['counts']}")
    return out[0], out[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fx tier and eager only, no subprocesses")
    parser.add_argument("--models", choices=("all", "mlp", "gpt2", "nano", "ttfs"), default="all",
                        help="mlp: the MLP rows and time to first step; gpt2: the GPT-2 example's rows; "
                             "nano: the nanoGPT-style step's rows; ttfs: time to first step only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    peak = matmul_gflops()
    print(f"torch {torch.__version__}, {args.threads} thread(s); matmul 512x1024x1024: {peak:.1f} GFLOP/s")
    header = (f"{'model':30s} {'variant':18s} {'ms/step':>8s} {'vs eager':>9s} {'vs compile':>10s} "
              f"{'vs floor':>9s} {'1st call s':>10s}")
    if args.models in ("all", "gpt2"):
        print(header.replace("vs floor", "tokens/s"))
        gpt2_rows(args)
    if args.models in ("all", "nano"):
        print(header)
        nano_rows(args, peak)
    if args.models in ("all", "mlp"):
        print(header)
    for name, spec in MODELS.items() if args.models in ("all", "mlp") else ():
        big = spec[2] >= 1024
        variants = make_variants(spec, with_inductor=not args.quick, with_compile=not args.quick)
        med, first = time_variants(variants, steps=max(3, args.steps // (4 if big else 1)), repeats=args.repeats)
        floor = step_flops(*spec) / (peak * 1e9)
        for v, t in med.items():
            vs_c = f"{med['compile'] / t:9.2f}x" if "compile" in med else f"{'-':>10s}"
            label = f"{v}({variants[v].tier()})" if v == "csx-auto" else v
            print(f"{name:30s} {label:18s} {t * 1e3:8.3f} {med['eager'] / t:8.2f}x {vs_c} {t / floor:8.2f}x "
                  f"{first[v]:10.2f}")
        print(f"{name:30s} {'floor':18s} {floor * 1e3:8.3f}   ({step_flops(*spec) / 1e6:.0f} MFLOP/step)")
    if not args.quick and args.models in ("all", "mlp", "ttfs"):
        for tier in ("inductor", "auto"):
            cold, warm = time_to_first_step(args.threads, tier)
            print(f"time to first step, fc_mnist d10 h50, tier {tier}, fresh processes (the warm one loads, "
                  f"compiles nothing):")
            for what, key in (("wall", "wall"), ("wall after import torch+cs_run", "after_imports"),
                              ("CPU (incl. children)", "cpu")):
                print(f"    {what:32s} cold {cold[key]:7.2f}s  warm {warm[key]:6.2f}s  "
                      f"({warm[key] / cold[key]:.2f} of cold)")
            print(f"    {'import torch+cs_run (wall)':32s} cold {cold['imports']:7.2f}s  warm {warm['imports']:6.2f}s")
            print(f"    {'import torch._dynamo (wall)':32s} cold {cold['dynamo_import']:7.2f}s  "
                  f"warm {warm['dynamo_import']:6.2f}s  (torch's fake tensors need it for the trace; in 'after')")
    print("(speed-ups >1 mean the variant is faster; 'vs floor' is how many times the FLOP floor it takes)")


if __name__ == "__main__":
    main()
