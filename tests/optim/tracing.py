"""Trace one training step (forward, backward, optimizer.step, zero_grad, scheduler.step) with make_fx.

Everything the step reads or mutates is a graph input: parameters, buffers, optimizer state, the
groups' lr tensors and the scheduler's step. While tracing, the model runs through
torch.func.functional_call and the optimizer and scheduler are pointed at the traced inputs; all of it
is restored in ``finally`` (docs/architecture.md#contracts). A test-only stand-in for the CSX engine's binding.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator

import torch
from torch.fx.experimental.proxy_tensor import make_fx


def step_inputs(model, opt, sched) -> tuple[list[str], list[torch.Tensor]]:
    """Names and tensors of the state, in a fixed order."""
    names, tensors = [], []
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        names.append(f"model.{name}")
        tensors.append(t)
    for i, state in enumerate(opt.state.values()):
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                names.append(f"opt.state.{i}.{key}")
                tensors.append(value)
    for g, group in enumerate(opt.param_groups):
        names.append(f"opt.param_groups.{g}.lr")
        tensors.append(group["lr"])
    names.append("sched.last_epoch")
    tensors.append(sched.last_epoch)
    return names, tensors


@contextlib.contextmanager
def bound(opt, sched, mapping: dict[int, torch.Tensor]) -> Iterator[None]:
    """Point the optimizer's groups and state and the scheduler's step at the traced tensors."""
    saved = opt.state, [dict(g) for g in opt.param_groups], sched.last_epoch
    try:
        state = defaultdict(dict)
        for p, entries in opt.state.items():
            state[mapping[id(p)]] = {k: mapping.get(id(v), v) if isinstance(v, torch.Tensor) else v
                                     for k, v in entries.items()}
        opt.state = state
        for group in opt.param_groups:
            group["params"] = [mapping[id(p)] for p in group["params"]]
            group["lr"] = mapping[id(group["lr"])]
        sched.last_epoch = mapping[id(sched.last_epoch)]
        yield
    finally:
        opt.state = saved[0]
        for group, old in zip(opt.param_groups, saved[1]):
            group.update(old)
        sched.last_epoch = saved[2]


def trace_train_step(model, opt, sched, batch, loss_fn=torch.nn.functional.mse_loss) -> torch.fx.GraphModule:
    """make_fx (fake mode) of one step over (state..., x, y); the graph mutates the state inputs in place."""
    names, real = step_inputs(model, opt, sched)
    n_model = sum(1 for n in names if n.startswith("model."))
    model_names = [n.removeprefix("model.") for n in names[:n_model]]

    def step(*flat):
        state, (x, y) = flat[:-2], flat[-2:]
        mapping = {id(r): f for r, f in zip(real, state)}
        with bound(opt, sched, mapping):
            out = torch.func.functional_call(model, dict(zip(model_names, state[:n_model])), (x,))
            loss = loss_fn(out, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            sched.step()
        return loss.detach()

    return make_fx(step, tracing_mode="fake")(*real, *batch)


def replay(gm: torch.fx.GraphModule, model, opt, sched, batch) -> torch.Tensor:
    """Run the captured graph on the real state (mutated in place) and a batch; no autograd needed."""
    _, real = step_inputs(model, opt, sched)
    with torch.no_grad():
        return gm(*real, *batch)
