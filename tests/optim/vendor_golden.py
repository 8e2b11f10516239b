"""Replay the vendor oracle's golden files (tests/data/vendor_oracle, see tools/vendor_oracle/record.py).

Optimizers get the vendor's own gradients step by step, so the comparison measures the update rule
alone; schedulers are compared value by value over 1,000 steps. ``python -m tests.optim.vendor_golden``
prints the oracle table (max |Δ|, absolute and in float32 ulps, per case).
"""

from __future__ import annotations

import inspect
import json
import sys
from functools import cache
from pathlib import Path

import numpy as np
import torch

import cs_run.optim as csoptim
from tests.ulps import ulp, ulps_apart

DATA = Path(__file__).resolve().parents[1] / "data" / "vendor_oracle"
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "vendor_oracle"))
import cases  # noqa: E402  (the shared case table, plain data)

# Where cs-run keeps the correct behaviour and the vendor's is defective: case -> why (documented in
# the scheduler's docstring; tests check both facts).
SCHEDULER_EXCEPTIONS = {
    "PolynomialLR-cycle": "vendor's cycle=True never cycles (holds end_learning_rate after total_iters)",
    "LinearLR-cycle": "vendor's cycle=True never cycles (holds end_learning_rate after total_iters)",
    "CosineAnnealingWarmRestarts": "vendor's T_cur after the first period is floor(t/T_0)*T_0 - T_0 (not t mod T_0)",
    "OneCycleLR-three-phase": "vendor's lr keeps annealing past total_steps and goes negative",
    "OneCycleLR-linear": "vendor's lr keeps annealing past total_steps and goes negative",
    "OneCycleLR": "vendor's cosine keeps going past total_steps (rises again); cs-run holds the final value",
}


@cache
def meta() -> dict:
    return json.loads((DATA / "meta.json").read_text())


@cache
def _npz(name: str) -> dict[str, np.ndarray]:
    with np.load(DATA / name) as f:
        return {k: f[k] for k in f.files}


def optimizer_case_ids() -> list[str]:
    return [case_id for case_id, _, _ in cases.OPTIMIZER_CASES if "error" not in meta()["optimizers"]["cases"][case_id]]


def replay_optimizer(case_id: str) -> dict[str, float]:
    """Run cs-run's optimizer on the vendor's gradients; the worst |Δ| of params and state, absolute and
    in float32 ulps of the tensor's largest recorded magnitude so far (tests/ulps.py)."""
    info = meta()["optimizers"]["cases"][case_id]
    data = _npz(f"optim_{info['class']}.npz")
    prob = meta()["optimizers"]["problem"]
    params = [torch.nn.Parameter(torch.tensor(prob["w0"], dtype=torch.float32)),
              torch.nn.Parameter(torch.tensor(prob["b0"], dtype=torch.float32))][: info["n_params"]]
    opt = getattr(csoptim, info["class"])(params, **_tuples(info["kwargs"]))
    worst = {"param_abs": 0.0, "param_ulps": 0.0, "state_abs": 0.0, "state_ulps": 0.0}
    for step in range(cases.STEPS):
        for index, p in enumerate(params):
            p.grad = torch.from_numpy(data[f"{case_id}/grad.{index}"][step].copy())
        opt.step()
        for index, p in enumerate(params):
            _worst(worst, "param", p, data[f"{case_id}/param.{index}"][: step + 1])
            for key in info["state_keys"][index]:
                golden = data.get(f"{case_id}/state.{index}.{key}")
                if golden is not None:
                    _worst(worst, "state", opt.state[p][key], golden[: step + 1])
    return worst


def _tuples(kwargs: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}


def _worst(worst: dict[str, float], kind: str, ours: torch.Tensor, golden: np.ndarray) -> None:
    """``golden`` holds the recorded steps so far; ``ours`` is compared with the last."""
    scale = float(np.abs(golden).max(initial=0.0))
    apart = ulps_apart(ours, golden[-1], scale)
    worst[f"{kind}_abs"] = max(worst[f"{kind}_abs"], apart * ulp(scale))
    worst[f"{kind}_ulps"] = max(worst[f"{kind}_ulps"], apart)


def scheduler_values(case_id: str) -> tuple[np.ndarray, np.ndarray]:
    """(cs-run's values, the vendor's) of a scheduler case over SCHED_STEPS steps."""
    info = meta()["schedulers"][case_id]
    module = csoptim.weight_decay_scheduler if info["key"] == "weight_decay" else csoptim.lr_scheduler
    p = torch.nn.Parameter(torch.zeros(2))
    opt = csoptim.AdamW([p], lr=0.1, weight_decay=0.1)
    sched = cases.build_scheduler(module, opt, info["class"], info["kwargs"])
    values = [float(opt.param_groups[0][info["key"]])]
    for _ in range(cases.SCHED_STEPS):
        opt.step()
        sched.step()
        values.append(float(opt.param_groups[0][info["key"]]))
    return np.asarray(values), _npz("schedulers.npz")[case_id]


def relative_error(ours: np.ndarray, golden: np.ndarray) -> float:
    return float((np.abs(ours - golden) / np.maximum(np.abs(golden), 1e-12)).max())


def signature_of(cls: type) -> list[list]:
    out = []
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        default = None if p.default is inspect.Parameter.empty else p.default
        out.append([p.name, p.default is inspect.Parameter.empty,
                    list(default) if isinstance(default, tuple) else default])
    return out


def main() -> int:
    print("| case | max abs Δ param | max ulps Δ param | max abs Δ state | max ulps Δ state |")
    print("|---|---|---|---|---|")
    for case_id, _, _ in cases.OPTIMIZER_CASES:
        info = meta()["optimizers"]["cases"][case_id]
        if "error" in info:
            print(f"| {case_id} | vendor fails: {info['error']} | | | |")
            continue
        w = replay_optimizer(case_id)
        print(f"| {case_id} | {w['param_abs']:.2e} | {w['param_ulps']:.3g} | {w['state_abs']:.2e} | {w['state_ulps']:.3g} |")
    print()
    print("| scheduler case | max abs Δ | max abs Δ / max value | max rel Δ | note |")
    print("|---|---|---|---|---|")
    for case_id in meta()["schedulers"]:
        ours, golden = scheduler_values(case_id)
        note = SCHEDULER_EXCEPTIONS.get(case_id, "")
        diff = np.abs(ours - golden).max()
        print(f"| {case_id} | {diff:.2e} | {diff / np.abs(golden).max():.2e} | {relative_error(ours, golden):.2e} "
              f"| {note} |")
    print()
    print("| metric case | vendor | cs-run | rel Δ |")
    print("|---|---|---|---|")
    from cs_run.metrics import AUCMetric

    for case_id, case in sorted(meta()["metrics"]["cases"].items()):
        metric = AUCMetric(**case["kwargs"])
        for labels, preds in meta()["metrics"]["batches"]:
            metric(torch.tensor(labels), torch.tensor(preds, dtype=torch.float32))
        ours = float(metric.compute())
        print(f"| {case_id} | {case['value']:.9f} | {ours:.9f} | {abs(ours - case['value']) / abs(case['value']):.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
