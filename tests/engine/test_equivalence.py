"""The vendor guides' scripts (custom training loop, porting guide) on CSX vs CPU vs plain PyTorch: identical parameters after N steps.

CSX (fx tier) replays the aten ops eager autograd would run, in the same order, so results are
bit-identical to the CPU backend and to a plain-PyTorch loop with the same optimizer. Against
torch.optim.SGD the tolerance is 1e-6: our stand-in optimizer computes ``p - buf * lr`` with a tensor
lr while torch uses ``add_(buf, alpha=-lr)`` (one rounding differs).
"""

from __future__ import annotations

import torch

import cs_run as cstorch
from cs_run.backend import _reset_for_tests
from tests.engine.helpers import MLP, ExponentialLR, TraceSafeSGD, input_fn

NUM_STEPS = 12


def run_seed000(backend_type: str, tmp_path) -> dict:
    """The custom training loop of the vendor's custom training loop guide, with ``import cs_run as cstorch``."""
    backend = cstorch.backend(backend_type, artifact_dir=tmp_path, compile_tier="fx",  # fx: bit-identical
                              cluster_config=cstorch.distributed.ClusterConfig(num_csx=1))
    torch.manual_seed(0)
    model = MLP()
    compiled_model = cstorch.compile(model, backend)
    optimizer = TraceSafeSGD(compiled_model.parameters(), lr=0.05, momentum=0.9)
    train_dataloader = cstorch.utils.data.DataLoader(input_fn, batch_size=32)
    loss_fn = torch.nn.NLLLoss()
    runs = {"body": 0, "losses": [], "checkpoints": []}

    @cstorch.trace
    def training_step(inputs, targets):
        runs["body"] += 1
        outputs = compiled_model(inputs)
        loss = loss_fn(outputs, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    executor = cstorch.utils.data.DataExecutor(train_dataloader, num_steps=NUM_STEPS, checkpoint_steps=5)

    @cstorch.step_closure
    def print_loss(loss, step):
        runs["losses"].append((step, loss.item()))

    @cstorch.checkpoint_closure
    def save_checkpoint(step):
        runs["checkpoints"].append((step, {k: v.clone() for k, v in model.state_dict().items()}))

    for step, (inputs, targets) in enumerate(executor, start=1):
        loss = training_step(inputs, targets)
        print_loss(loss, step)
        save_checkpoint(step)
    runs["state"] = {k: v.clone() for k, v in model.state_dict().items()}
    runs["momentum"] = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    return runs


def plain_pytorch(optimizer_cls, steps: int = NUM_STEPS, **opt_kw) -> dict:
    torch.manual_seed(0)
    model = MLP()
    optimizer = optimizer_cls(model.parameters(), **opt_kw)
    losses = []
    batches = iter(input_fn(batch_size=32))
    for _ in range(steps):
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(input_fn(batch_size=32))
            x, y = next(batches)
        loss = torch.nn.functional.nll_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"state": model.state_dict(), "losses": losses}


def assert_same_state(a: dict, b: dict, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if atol == 0.0:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)


def test_seed000_csx_cpu_and_plain_pytorch_agree(tmp_path):
    csx = run_seed000("CSX", tmp_path)
    with _reset_for_tests():
        cpu = run_seed000("CPU", tmp_path)
    plain = plain_pytorch(TraceSafeSGD, lr=0.05, momentum=0.9)
    torch_sgd = plain_pytorch(torch.optim.SGD, lr=0.05, momentum=0.9)
    assert csx["body"] == 1 and cpu["body"] == NUM_STEPS
    assert_same_state(csx["state"], cpu["state"])
    assert_same_state(csx["state"], plain["state"])
    assert_same_state(csx["state"], torch_sgd["state"], atol=1e-6)
    assert [v for _, v in csx["losses"]] == [v for _, v in cpu["losses"]] == plain["losses"]
    assert all(torch.equal(a, b) for a, b in zip(csx["momentum"], cpu["momentum"]))
    # checkpoint closure: steps 5, 10 and the final step 12; the weights are those of that step
    assert [s for s, _ in csx["checkpoints"]] == [s for s, _ in cpu["checkpoints"]] == [5, 10, 12]
    for (_, a), (_, b) in zip(csx["checkpoints"], cpu["checkpoints"]):
        assert_same_state(a, b)


def run_seed001(tmp_path, device_type: str) -> dict:
    """The vendor porting guide's full training example (configure / compile_step / closures / old DataLoader form)."""
    checkpoint_steps = 4
    if device_type == "CSX":
        cstorch.configure(model_dir=str(tmp_path), checkpoint_steps=checkpoint_steps, num_csx=1,
                          max_wgt_servers=1, transfer_processes=1)
        backend_name = "wse_ws"
    else:
        cstorch.backend("CPU", checkpoint_steps=checkpoint_steps)
        backend_name = "CPU"
    torch.manual_seed(0)
    model = MLP(depth=3)
    compiled_model = cstorch.compile(model, backend=backend_name)
    loss_fn = torch.nn.NLLLoss()
    optimizer = TraceSafeSGD(model.parameters(), lr=0.1, momentum=0.5, weight_decay=1e-4)
    lr_scheduler = ExponentialLR(optimizer, gamma=0.9)
    saved, losses = [], []

    @cstorch.step_closure
    def save_checkpoint(step):
        saved.append((step, {"model": {k: v.clone() for k, v in model.state_dict().items()},
                             "lr": optimizer.param_groups[0]["lr"].clone()}))

    dataloader = cstorch.utils.data.DataLoader(input_fn, num_steps=10, batch_size=16)

    @cstorch.compile_step
    def training_step(batch):
        inputs, targets = batch
        outputs = compiled_model(inputs)
        loss = loss_fn(outputs, targets)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if lr_scheduler:
            lr_scheduler.step()
        return loss

    @cstorch.step_closure
    def post_training_step(loss: torch.Tensor):
        losses.append(loss.item())

    for i, batch in enumerate(dataloader):
        loss = training_step(batch)
        post_training_step(loss)
        if i % checkpoint_steps == 0:
            save_checkpoint(i)
    return {"state": {k: v.clone() for k, v in model.state_dict().items()}, "losses": losses, "saved": saved,
            "lr": optimizer.param_groups[0]["lr"].clone(), "epoch": lr_scheduler.last_epoch.clone()}


def test_seed001_full_example_csx_equals_cpu(tmp_path):
    csx = run_seed001(tmp_path, "CSX")
    with _reset_for_tests():
        cpu = run_seed001(tmp_path, "CPU")
    assert len(csx["losses"]) == 10
    assert csx["losses"] == cpu["losses"]
    assert_same_state(csx["state"], cpu["state"])
    assert torch.equal(csx["lr"], cpu["lr"]) and int(csx["epoch"]) == 10
    torch.testing.assert_close(csx["lr"], torch.tensor(0.1 * 0.9**10))
    assert [s for s, _ in csx["saved"]] == [0, 4, 8]
    for (_, a), (_, b) in zip(csx["saved"], cpu["saved"]):
        assert_same_state(a["model"], b["model"])
        assert torch.equal(a["lr"], b["lr"])
