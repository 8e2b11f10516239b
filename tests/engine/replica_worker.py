"""The replicas' side of tests/engine/test_replicas.py: one spawned process per replica (gloo, CPU).

Each scenario trains the same tiny model three ways and saves what it got to ``out_dir/<scenario>.<rank>.pt``:
the CSX engine (traced step with the all-reduce inside the graph), torch DDP (eager, the semantics to
match) and, on ordinal 0, one eager process on the whole batch (the "1 replica x batch B" reference).
"""

from __future__ import annotations

import datetime
import os
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from cs_run import optim
from cs_run.amp import GradScaler
from cs_run.engine import CompiledStep, EngineOptions, replica_sync
from cs_run.runners._step import StepConfig, train_step

B, K, DIM, CLASSES = 8, 2, 6, 3  # global micro-batch, micro-batches per step (grad accumulation), sizes


class Net(torch.nn.Module):
    def __init__(self, batch_norm: bool = False) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(DIM, 16)
        self.bn = torch.nn.BatchNorm1d(16) if batch_norm else torch.nn.Identity()
        self.fc2 = torch.nn.Linear(16, CLASSES)

    def forward(self, batch):
        x, y = batch
        return F.cross_entropy(self.fc2(torch.tanh(self.bn(self.fc1(x)))), y)


class Lean(torch.nn.Module):
    """One linear layer: the smallest graph worth compiling with inductor (its C++ build dominates)."""

    def __init__(self, batch_norm: bool = False) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(DIM, CLASSES)

    def forward(self, batch):
        x, y = batch
        return F.cross_entropy(self.fc(x), y)


def data(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(steps, K, B, DIM, generator=g)
    return x, (x @ torch.randn(DIM, CLASSES, generator=g)).argmax(-1)  # learnable labels


def shard(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This replica's rows of every micro-batch (dim 2 of ``data``'s tensors)."""
    per = t.shape[2] // world
    return t[:, :, rank * per:(rank + 1) * per]


def build(seed: int, batch_norm: bool, lean: bool = False):
    """Model, optimizer (SGD with momentum) and grad scaler; ``lean``: plain SGD, no scaler (cheaper to compile)."""
    torch.manual_seed(seed)
    model = Lean() if lean else Net(batch_norm)
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.0 if lean else 0.9)
    opt.preinitialize()
    scaler = None if lean else GradScaler(loss_scale="dynamic")
    return model, opt, scaler


CONFIG = StepConfig(max_gradient_norm=0.5)


def train(model, opt, scaler, xs, ys, step_fn=None):
    config = CONFIG if scaler is not None else StepConfig()

    def step(micro):
        return train_step(model, micro, opt, None, scaler, config)
    run = step_fn(step) if step_fn else step
    losses = [run([(xs[i, j], ys[i, j]) for j in range(xs.shape[1])]) for i in range(xs.shape[0])]
    return run, torch.stack([loss.detach() for loss in losses])


def state_of(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def scenario_train(rank: int, world: int, tier: str, steps: int, batch_norm: bool, lean: bool = False) -> dict:
    xs, ys = data(steps)
    if lean:
        xs, ys = xs[:, :1], ys[:, :1]  # one micro-batch per step
    mine_x, mine_y = shard(xs, rank, world), shard(ys, rank, world)
    # Rank-dependent init: the engine (and DDP) must start every replica from ordinal 0's weights.
    model, opt, scaler = build(seed=rank, batch_norm=batch_norm, lean=lean)
    init = state_of(build(seed=0, batch_norm=batch_norm, lean=lean)[0])  # ordinal 0's initial weights
    compiled, csx_losses = train(model, opt, scaler, mine_x, mine_y,
                                 lambda fn: CompiledStep(fn, EngineOptions(compile_tier=tier)))
    traced, executable = next(iter(compiled._executables.values()))
    ops = [str(n.target) for n in traced.gm.graph.nodes if n.op == "call_function"]
    out = {"init": init, "csx": state_of(model), "csx_losses": csx_losses, "replicas": traced.replicas,
           "executable": type(executable).__name__,
           "all_reduce": sum("all_reduce" in o for o in ops), "broadcast": sum("broadcast" in o for o in ops)}

    ddp_model, ddp_opt, ddp_scaler = build(seed=rank, batch_norm=batch_norm, lean=lean)
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_model)
    train(ddp, ddp_opt, ddp_scaler, mine_x, mine_y)
    out["ddp"] = state_of(ddp_model)

    if rank == 0:  # one replica with the whole batch: no process group involved
        ref_model, ref_opt, ref_scaler = build(seed=0, batch_norm=batch_norm, lean=lean)
        train(ref_model, ref_opt, ref_scaler, xs, ys)
        out["single"] = state_of(ref_model)
    return out


def scenario_agree(rank: int, world: int) -> dict:
    return {"first_failure": replica_sync.first_failure("boom" if rank == 1 else ""),
            "no_failure": replica_sync.first_failure(""),
            "common_tier": replica_sync.common_tier("fx" if rank == 1 else "auto"),
            "same_tier": replica_sync.common_tier("inductor"),
            "choice": replica_sync.agree_choice("inductor" if rank == 1 else "fx")}


SCENARIOS = {
    "fx": lambda r, w: scenario_train(r, w, "fx", steps=50, batch_norm=False),
    "bn": lambda r, w: scenario_train(r, w, "fx", steps=10, batch_norm=True),
    "inductor": lambda r, w: scenario_train(r, w, "inductor", steps=10, batch_norm=False, lean=True),
    "agree": scenario_agree,
}


def main(rank: int, world: int, init_file: str, out_dir: str, scenarios: list[str]) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    out = Path(out_dir)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        for name in scenarios:
            torch.save(SCENARIOS[name](rank, world), out / f"{name}.{rank}.pt")
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        (out / f"error.{rank}.txt").write_text(traceback.format_exc())
        raise
