"""The vendor porting guide's full example with the real cs_run.optim / cs_run.amp parts: CSX equals CPU bit for bit.

Skipped while those packages are not installed (they are built in parallel to the engine).
"""

from __future__ import annotations

import pytest
import torch

import cs_run as cstorch
from cs_run.backend import _reset_for_tests
from tests.engine.helpers import MLP, input_fn

optim = pytest.importorskip("cs_run.optim")
amp = pytest.importorskip("cs_run.amp")


def run(backend_type: str, optimizer_type: str, learning_rate, loss_scale) -> dict:
    cstorch.backend(backend_type, checkpoint_steps=3)
    torch.manual_seed(0)
    model = cstorch.compile(MLP(depth=2))
    loss_fn = torch.nn.NLLLoss()
    optimizer = optim.configure_optimizer(optimizer_type=optimizer_type, params=model.parameters(), lr=0.01)
    lr_scheduler = optim.configure_lr_scheduler(optimizer, learning_rate=learning_rate)
    grad_scaler = amp.GradScaler(loss_scale=loss_scale) if loss_scale else None
    body, losses = [], []

    @cstorch.trace
    def training_step(inputs, targets):
        body.append(1)
        loss = loss_fn(model(inputs), targets)
        amp.optimizer_step(loss, optimizer, grad_scaler, max_gradient_norm=1.0)
        if lr_scheduler:
            lr_scheduler.step()
        return loss

    @cstorch.step_closure
    def post(loss):
        losses.append(loss.item())

    executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(input_fn, batch_size=16), num_steps=9)
    for inputs, targets in executor:
        post(training_step(inputs, targets))
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    if lr_scheduler:
        state["lr_scheduler"] = lr_scheduler.state_dict()
    if grad_scaler:
        state["grad_scaler"] = grad_scaler.state_dict()
    flat = {}

    def walk(prefix, obj):
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(f"{prefix}.{i}", v)
        elif isinstance(obj, torch.Tensor):
            flat[prefix] = obj.detach().clone()
        else:
            flat[prefix] = obj

    walk("", state)
    return {"body": len(body), "losses": losses, "state": flat}


@pytest.mark.parametrize("optimizer_type,learning_rate,loss_scale", [
    ("SGD", 0.05, None),
    ("Adam", {"scheduler": "CosineDecayLR", "initial_learning_rate": 0.01, "end_learning_rate": 0.001,
              "total_iters": 9}, "dynamic"),
    ("AdamW", [{"scheduler": "LinearLR", "initial_learning_rate": 0.001, "end_learning_rate": 0.01,
                "total_iters": 3}, {"scheduler": "ExponentialLR", "initial_learning_rate": 0.01,
                                    "decay_rate": 0.9, "decay_steps": 1}], 128.0),
])
def test_full_example_csx_equals_cpu(optimizer_type, learning_rate, loss_scale):
    csx = run("CSX", optimizer_type, learning_rate, loss_scale)
    with _reset_for_tests():
        cpu = run("CPU", optimizer_type, learning_rate, loss_scale)
    assert csx["body"] == 1 and cpu["body"] == 9
    assert csx["losses"] == cpu["losses"] and len(set(csx["losses"])) == 9
    assert csx["state"].keys() == cpu["state"].keys()
    for k, v in csx["state"].items():
        w = cpu["state"][k]
        assert torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w, k
