"""The CSX engine on a CUDA device: eager vs torch.compile vs CSX, with and without CUDA-graph replay.

Run: ``python bench/bench_engine_cuda.py`` on a machine with a CUDA GPU (prints "skipped" and exits 0
without one, so ``make bench`` runs everywhere).

Per training step (forward, backward, optimizer step, zero_grad), medians of interleaved repeats
(A B C ..., A B C ..., each timed over ``--steps`` calls between two ``torch.cuda.synchronize()``):

* eager:           model + torch.optim (foreach), the usual loop
* compile:         torch.compile(model) + torch.optim (foreach)
* compile-cg:      torch.compile(model, mode="reduce-overhead"): forward/backward as CUDA graphs
* csx-fx / csx-inductor:       the whole step traced once and replayed, no CUDA graph
* csx-fx-cg / csx-inductor-cg: the same, replayed as one CUDA graph (the engine's default on CUDA)
* csx-auto:        the default tier choice (with CUDA graphs)

Before timing, each model's CSX step is checked: with and without the CUDA graph, fx tier, the
same 8 steps give bitwise-identical losses and parameters (a graph replays the same kernels).
The models are the MLP and nanoGPT-style step of ``bench_engine.py`` (same shapes, same optimizers).
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from bench_engine import MODELS, NANO, NanoGPT, build_mlp, settled_call, time_variants

from cs_run.engine import CompiledStep, EngineOptions
from cs_run.optim import SGD, AdamW

CSX_VARIANTS = {  # name: (tier, cuda_graphs)
    "csx-fx": ("fx", False), "csx-fx-cg": ("fx", True),
    "csx-inductor": ("inductor", False), "csx-inductor-cg": ("inductor", True),
    "csx-auto": ("auto", True),
}


def mlp_case(spec, device):
    """(model factory, loss of (model, batch), batch, torch optimizer, cs-run optimizer) for an MLP row."""
    d_in, depth, hidden, d_out, batch = spec
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(batch, d_in, generator=g).to(device), torch.randint(0, d_out, (batch,), generator=g).to(device))
    return (lambda: build_mlp(d_in, depth, hidden, d_out),
            lambda forward, x, y: torch.nn.functional.cross_entropy(forward(x), y), data,
            lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, foreach=True),
            lambda p: SGD(p, lr=0.01, momentum=0.9), batch)


def nano_case(device):
    cfg = {k: v for k, v in NANO.items() if k != "batch"}
    g = torch.Generator().manual_seed(0)
    data = tuple(torch.randint(0, cfg["vocab"], (NANO["batch"], cfg["seq"]), generator=g).to(device)
                 for _ in range(2))
    return (lambda: NanoGPT(**cfg), lambda forward, idx, targets: forward(idx, targets), data,
            lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True), lambda p: AdamW(p, lr=1e-3),
            NANO["batch"] * cfg["seq"])


def step_of(model, forward, loss_of, opt, clip: bool):
    def step(*batch):
        loss = loss_of(forward, *batch)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        return loss
    return step


def fresh(make_model, device):
    torch.manual_seed(0)
    return make_model().to(device)


def csx_step(case, device, tier, cuda_graphs, clip, compile_dir):
    make_model, loss_of, data, _, cs_opt, _ = case
    model = fresh(make_model, device)
    compiled = CompiledStep(step_of(model, model, loss_of, cs_opt(model.parameters()), clip),
                            EngineOptions(compile_tier=tier, compile_dir=compile_dir, cuda_graphs=cuda_graphs))
    return model, settled_call(compiled, *data)


def check_graph_replay(case, device, clip) -> str:
    """fx with and without the CUDA graph: 8 steps, bitwise-equal losses and parameters."""
    runs = []
    for graphs in (False, True):
        model, call = csx_step(case, device, "fx", graphs, clip, tempfile.mkdtemp(prefix="cs_run_cuda_"))
        losses = [call().detach().clone() for _ in range(8)]
        runs.append((torch.stack(losses), [p.detach().clone() for p in model.parameters()]))
    (l0, p0), (l1, p1) = runs
    same = torch.equal(l0, l1) and all(torch.equal(a, b) for a, b in zip(p0, p1))
    return "bitwise equal" if same else (f"DIFFER: max loss diff {float((l0 - l1).abs().max()):.3g}, "
                                         f"max param diff {max(float((a - b).abs().max()) for a, b in zip(p0, p1)):.3g}")


def variants_for(case, device, clip, names):
    make_model, loss_of, data, torch_opt, _, _ = case
    variants = {}
    model = fresh(make_model, device)
    eager = step_of(model, model, loss_of, torch_opt(model.parameters()), clip)
    variants["eager"] = lambda: eager(*data)
    for name, mode in (("compile", "default"), ("compile-cg", "reduce-overhead")):
        model = fresh(make_model, device)
        fn = step_of(model, torch.compile(model, mode=mode), loss_of, torch_opt(model.parameters()), clip)
        variants[name] = (lambda fn=fn: fn(*data))
    for name in names:
        tier, graphs = CSX_VARIANTS[name]
        variants[name] = csx_step(case, device, tier, graphs, clip, tempfile.mkdtemp(prefix="cs_run_cuda_"))[1]
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--variants", default=",".join(CSX_VARIANTS),
                        help="CSX variants to time (comma-separated; default all)")
    parser.add_argument("--models", default="",
                        help="only the models whose name contains one of these (comma-separated; default all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_engine_cuda: skipped (no CUDA device)")
        return
    device = torch.device("cuda")
    names = [n for n in args.variants.split(",") if n]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; medians of {args.repeats} interleaved "
          f"repeats x {args.steps} steps")
    cases = {name: (mlp_case(spec, device), False) for name, spec in MODELS.items()}
    cases["nanoGPT L{layers} d{d} T{seq} b{batch}".format(**NANO)] = (nano_case(device), True)
    wanted = [m for m in args.models.split(",") if m]
    cases = {k: v for k, v in cases.items() if not wanted or any(w in k for w in wanted)}
    print(f"{'model':30s} {'variant':22s} {'ms/step':>8s} {'vs eager':>9s} {'vs compile':>10s} "
          f"{'samples/s':>10s} {'1st call s':>10s}")
    for model_name, (case, clip) in cases.items():
        print(f"{model_name:30s} check: CSX fx with vs without CUDA graph, 8 steps: "
              f"{check_graph_replay(case, device, clip)}")
        variants = variants_for(case, device, clip, names)
        med, first = time_variants(variants, args.steps, args.repeats, sync=torch.cuda.synchronize,
                                    skip_failed=True)
        for v, t in med.items():
            label = f"{v}({variants[v].tier() or 'no trial'})" if v == "csx-auto" else v
            print(f"{model_name:30s} {label:22s} {t * 1e3:8.3f} {med['eager'] / t:8.2f}x "
                  f"{med['compile'] / t:9.2f}x {case[5] / t:10.0f} {first[v]:10.2f}")


if __name__ == "__main__":
    main()
