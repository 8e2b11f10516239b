"""Record reference numbers with the real vendor package (cerebras-pytorch 2.10) as golden files.

Run by a developer in a separate venv that has the vendor package (never in CI, never a dependency
of cs-run)::

    python -m venv /tmp/vendor-venv && /tmp/vendor-venv/bin/pip install cerebras-pytorch==2.10.0
    /tmp/vendor-venv/bin/python tools/vendor_oracle/record.py tests/data/vendor_oracle

It writes numbers only (trajectories, learning rates, metric values, key names, signatures) and
two small checkpoints written by the vendor's own ``cstorch.save``; the tests in
tests/optim/test_vendor_oracle.py and tests/checkpoint/test_vendor_format.py replay them.

Optimizer trajectories feed the vendor's gradients back to cs-run (``grads`` in each file), so the
comparison isolates the update rule from forward/backward rounding of two torch versions.

``sampler OUT_DIR`` writes only ``sampler.json`` (the vendor's DistributedSampler per streamer of N x W
and its per-worker batch count; tests/engine/test_streaming.py replays it).

``check-load PATH`` loads a file with the vendor's ``cstorch.load`` and prints a JSON summary
(used to check that ``cs-run checkpoint convert --to vendor`` output is readable by the vendor).
"""

from __future__ import annotations

import inspect
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402  (this folder, importable without cs-run)
import cerebras.pytorch as cstorch  # noqa: E402
import torch  # noqa: E402


def _problem() -> dict[str, np.ndarray]:
    """The fixed optimization problem: params w (3, 2), b (2,), and the data of a tanh regression."""
    rng = np.random.RandomState(0)
    return {"w0": (rng.randn(3, 2) * 0.5).astype(np.float32), "b0": (rng.randn(2) * 0.1).astype(np.float32),
            "x": rng.randn(8, 3).astype(np.float32), "y": rng.randn(8, 2).astype(np.float32)}


def _loss(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((torch.tanh(x @ w + b) - y) ** 2).mean()


def _state_arrays(opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> dict[str, np.ndarray]:
    out = {}
    for index, p in enumerate(params):
        for key, value in opt.state[p].items():
            if isinstance(value, torch.Tensor):
                out[f"state.{index}.{key}"] = value.detach().float().numpy().copy()
    return out


def record_optimizers(out_dir: str) -> dict:
    prob = _problem()
    x, y = torch.from_numpy(prob["x"]), torch.from_numpy(prob["y"])
    meta: dict = {"problem": {k: v.tolist() for k, v in prob.items()}, "cases": {}}
    arrays: dict[str, dict[str, np.ndarray]] = {}
    for case_id, cls_name, kwargs in cases.OPTIMIZER_CASES:
        w = torch.nn.Parameter(torch.from_numpy(prob["w0"].copy()))
        b = torch.nn.Parameter(torch.from_numpy(prob["b0"].copy()))
        params = [w, b] if cls_name != "Muon" else [w]
        opt = getattr(cstorch.optim, cls_name)(params, **kwargs)
        traj: dict[str, list[np.ndarray]] = {}
        try:
            for _ in range(cases.STEPS):
                opt.zero_grad()
                loss = _loss(w, b, x, y)
                loss.backward()
                for index, p in enumerate(params):
                    traj.setdefault(f"grad.{index}", []).append(p.grad.detach().numpy().copy())
                opt.step()
                for index, p in enumerate(params):
                    traj.setdefault(f"param.{index}", []).append(p.detach().numpy().copy())
                for key, value in _state_arrays(opt, params).items():
                    traj.setdefault(key, []).append(value)
        except Exception as err:  # a vendor defect is a fact to record, not a reason to stop
            meta["cases"][case_id] = {"class": cls_name, "kwargs": kwargs, "error": f"{type(err).__name__}: {err}"}
            continue
        for key, values in traj.items():
            arrays.setdefault(cls_name, {})[f"{case_id}/{key}"] = np.stack(values).astype(np.float32)
        sd = opt.state_dict()
        meta["cases"][case_id] = {
            "class": cls_name, "kwargs": kwargs, "n_params": len(params),
            "state_keys": [sorted(sd["state"].get(i, {}).keys()) for i in range(len(params))],
            "param_group_keys": sorted(sd["param_groups"][0].keys()),
            "param_group": {k: _jsonable(v) for k, v in sd["param_groups"][0].items() if k != "params"},
        }
    for cls_name, per_class in arrays.items():  # one file per class keeps each golden file small
        np.savez_compressed(os.path.join(out_dir, f"optim_{cls_name}.npz"), **per_class)
    return meta


def _jsonable(value):
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(map(str, value))
    if isinstance(value, tuple):
        return list(value)
    return value


def record_schedulers(out_dir: str) -> dict:
    arrays, meta = {}, {}
    for table, module, key in ((cases.SCHEDULER_CASES, cstorch.optim.lr_scheduler, "lr"),
                               (cases.WD_SCHEDULER_CASES, cstorch.optim.weight_decay_scheduler, "weight_decay")):
        for case_id, cls_name, kwargs in table:
            p = torch.nn.Parameter(torch.zeros(2))
            opt = cstorch.optim.AdamW([p], lr=0.1, weight_decay=0.1)
            sched = cases.build_scheduler(module, opt, cls_name, kwargs)
            values = [float(opt.param_groups[0][key])]
            for _ in range(cases.SCHED_STEPS):
                opt.step()
                sched.step()
                values.append(float(opt.param_groups[0][key]))
            arrays[case_id] = np.asarray(values, dtype=np.float64)
            meta[case_id] = {"class": cls_name, "key": key, "kwargs": kwargs}
    np.savez_compressed(os.path.join(out_dir, "schedulers.npz"), **arrays)
    return meta


def record_metrics() -> dict:
    rng = np.random.RandomState(1)
    batches = []
    for _ in range(3):
        labels = (rng.rand(64) < 0.4).astype(np.int64)
        preds = np.clip(rng.rand(64) * 0.6 + labels * 0.35, 0, 1).astype(np.float32)
        preds[:2] = [0.0, 1.0]
        batches.append((labels.tolist(), preds.tolist()))
    results = {}
    for case_id, cls_name, kwargs in cases.METRIC_CASES:
        metric = getattr(cstorch.metrics, cls_name)(**kwargs)
        for labels, preds in batches:
            metric(torch.tensor(labels), torch.tensor(preds, dtype=torch.float32))
        results[case_id] = {"class": cls_name, "kwargs": kwargs, "value": float(metric.compute())}
    return {"batches": batches, "cases": results}


def record_signatures() -> dict:
    """Public constructor signatures of the optimizers and schedulers (names, defaults, required)."""
    out = {}
    modules = {"optim": cstorch.optim, "optim.lr_scheduler": cstorch.optim.lr_scheduler,
               "optim.scheduler": cstorch.optim.scheduler,
               "optim.weight_decay_scheduler": cstorch.optim.weight_decay_scheduler}
    for mod_name, module in modules.items():
        for name in sorted(getattr(module, "__all__", dir(module))):
            obj = getattr(module, name, None)
            if not inspect.isclass(obj):
                continue
            try:
                sig = inspect.signature(obj.__init__)
            except (TypeError, ValueError):
                continue
            params = []
            for p in list(sig.parameters.values())[1:]:
                if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                    continue
                default = None if p.default is inspect.Parameter.empty else _jsonable(p.default)
                params.append([p.name, p.default is inspect.Parameter.empty, default])
            out[f"{mod_name}.{name}"] = params
    return out


def record_checkpoints(out_dir: str) -> dict:
    """A vendor AdamW run saved mid-way with cstorch.save (format 0.5), and its own continuation."""
    rng = np.random.RandomState(2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy((rng.randn(*p.shape) * 0.5).astype(np.float32)))
    x = torch.from_numpy(rng.randn(cases.RESUME_AT + cases.RESUME_STEPS, 8, 4).astype(np.float32))
    y = torch.from_numpy(rng.randn(cases.RESUME_AT + cases.RESUME_STEPS, 8, 2).astype(np.float32))
    opt = cstorch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)

    def train_step(i):
        opt.zero_grad()
        loss = ((model(x[i]) - y[i]) ** 2).mean()
        loss.backward()
        opt.step()
        return float(loss)

    for i in range(cases.RESUME_AT):
        train_step(i)
    cstorch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "global_step": cases.RESUME_AT},
                 os.path.join(out_dir, "adamw_step30.mdl"))
    continuation, losses = {}, []
    for i in range(cases.RESUME_AT, cases.RESUME_AT + cases.RESUME_STEPS):
        losses.append(train_step(i))
        for name, p in model.named_parameters():
            continuation.setdefault(name, []).append(p.detach().numpy().copy())
    np.savez_compressed(os.path.join(out_dir, "adamw_resume.npz"), x=x.numpy(), y=y.numpy(), losses=np.asarray(losses),
                        **{f"param.{k}": np.stack(v) for k, v in continuation.items()})

    # a file with every leaf kind the format knows: dtypes, python scalars, strings, None, nesting, ties
    shared = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    kinds = {
        "f32": torch.linspace(-1, 1, 5), "f16": torch.tensor([1.5, -2.25], dtype=torch.float16),
        "bf16": torch.tensor([0.5, 3.0], dtype=torch.bfloat16), "i64": torch.tensor([1, -2, 3]),
        "i32": torch.tensor([[7, 8]], dtype=torch.int32), "bool": torch.tensor([True, False]),
        "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3), "tied_a": shared, "tied_b": shared,
        "int": 7, "float": 0.25, "str": "hello", "none": None, "flag": True,
        "nested": {"list": [1, 2.0, "three"], "tuple": (4, 5), "deep": {"t": torch.ones(2, 2)}},
    }
    cstorch.save(kinds, os.path.join(out_dir, "kinds.mdl"))
    loaded = cstorch.load(os.path.join(out_dir, "kinds.mdl"))
    return {"kinds_roundtrip": _summary(loaded)}


SAMPLER_CASES = [  # (num_csx, workers per csx, samples, global batch, start_index, shuffle); drop_last=True
    (1, 1, 10, 3, 2, True), (2, 2, 23, 4, 0, True), (2, 2, 23, 4, 6, False), (1, 3, 17, 2, 4, True),
    (3, 1, 12, 6, 0, True), (2, 3, 40, 6, 13 * 6, True)]


def record_sampler(out_dir: str) -> None:
    """The vendor's DistributedSampler as each streamer of N x W sees it (three passes of one sampler), and
    on the user node (not a streamer); the vendor's count of a worker's batches after k appliance steps."""
    import cerebras.pytorch.distributed as dist  # noqa: PLC0415  (the vendor's, this script only)
    from cerebras.pytorch.distributed.cluster_resolver import ApplianceWorkerClusterResolver  # noqa: PLC0415
    from cerebras.pytorch.utils.data.streamer.data_pipe import DataLoaderCheckpointer  # noqa: PLC0415

    def passes(num_samples, batch, start, shuffle):
        sampler = cstorch.utils.data.DistributedSampler(list(range(num_samples)), shuffle=shuffle, seed=5,
                                                        start_index=start, batch_size=batch)
        return [[list(b) for b in sampler] for _ in range(3)]

    cases = []
    for num_csx, workers, num_samples, batch, start, shuffle in SAMPLER_CASES:
        streams = []
        for rank in range(num_csx * workers):
            ApplianceWorkerClusterResolver.configure(rank, num_csx * workers, num_csx, workers)
            dist._set_streaming_batch_sizes([[batch // num_csx]] * num_csx)
            streams.append(passes(num_samples, batch, start, shuffle))
        ApplianceWorkerClusterResolver._CONFIGURED = None  # the user node again
        cases.append({"num_csx": num_csx, "workers": workers, "num_samples": num_samples, "batch_size": batch,
                      "start_index": start, "shuffle": shuffle, "streams": streams,
                      "user_node": passes(num_samples, batch, start, shuffle)})
    counts = {f"{steps},{workers},{worker}": DataLoaderCheckpointer._compute_worker_iteration_count(steps, workers,
                                                                                                  worker)
              for steps in range(0, 12) for workers in (1, 2, 3) for worker in range(workers)}
    with open(os.path.join(out_dir, "sampler.json"), "w") as f:
        json.dump({"vendor": cstorch.__version__, "seed": 5, "cases": cases, "worker_iterations": counts}, f)


def _summary(obj):
    """A JSON-able description of a loaded state dict: values of small tensors, types of the rest."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        return {"tensor": str(t.dtype), "shape": list(t.shape), "values": t.float().reshape(-1).tolist()}
    if isinstance(obj, dict):
        return {str(k): _summary(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return {type(obj).__name__: [_summary(v) for v in obj]}
    return {"py": type(obj).__name__, "value": obj if isinstance(obj, (int, float, str, bool, type(None))) else str(obj)}


def check_resume(path: str, out: str) -> None:
    """Load a cs-run-written vendor-format file with cstorch.load, resume the vendor's AdamW from it and
    record the next steps (batches 5..9 of adamw_resume.npz), as tests/checkpoint/vendor_roundtrip.py
    continues on the cs-run side."""
    state = cstorch.load(path)
    loaded = _summary(state)  # before resuming: the optimizer shares (and then updates) these tensors
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    model.load_state_dict(state["model"])
    opt = cstorch.optim.AdamW(model.parameters(), lr=0.5)
    opt.load_state_dict(state["optimizer"])
    with np.load(os.path.join(os.path.dirname(path), "adamw_resume.npz")) as f:
        x, y = torch.from_numpy(f["x"]), torch.from_numpy(f["y"])
    params: dict[str, list[np.ndarray]] = {}
    for i in range(5, 10):
        opt.zero_grad()
        ((model(x[i]) - y[i]) ** 2).mean().backward()
        opt.step()
        for name, p in model.named_parameters():
            params.setdefault(name, []).append(p.detach().numpy().copy())
    np.savez_compressed(out, **{f"param.{k}": np.stack(v) for k, v in params.items()})
    with open(out + ".json", "w") as fh:
        json.dump({"vendor": cstorch.__version__, "loaded": loaded}, fh, indent=1, sort_keys=True)


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "check-resume":
        cstorch.backend("CPU")
        check_resume(argv[1], argv[2])
        return 0
    if len(argv) == 2 and argv[0] == "check-load":
        cstorch.backend("CPU")
        print(json.dumps(_summary(cstorch.load(argv[1])), indent=1))
        return 0
    if len(argv) == 2 and argv[0] == "sampler":
        record_sampler(argv[1])
        return 0
    if len(argv) != 1:
        print(__doc__)
        return 2
    out_dir = argv[0]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    cstorch.backend("CPU")  # the vendor's optimizers and schedulers need an active backend
    meta = {
        "vendor": {"cerebras.pytorch": cstorch.__version__, "torch": torch.__version__},
        "optimizers": record_optimizers(out_dir),
        "schedulers": record_schedulers(out_dir),
        "metrics": record_metrics(),
        "signatures": record_signatures(),
        "checkpoints": record_checkpoints(out_dir),
    }
    record_sampler(out_dir)
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    print(f"wrote {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
