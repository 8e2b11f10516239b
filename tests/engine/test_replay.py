"""CSX replay: the body runs once, state (BatchNorm stats, optimizer buffers, lr) updates every step."""

from __future__ import annotations

import torch

import cs_run as cstorch
from tests.engine.helpers import MLP, ExponentialLR, TraceSafeSGD


def build(seed: int = 0):
    torch.manual_seed(seed)
    model = MLP(depth=1, hidden=8)
    opt = TraceSafeSGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt, ExponentialLR(opt, gamma=0.99)


def batches(n: int):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(n)]


def test_body_runs_once_and_state_updates_every_step():
    cstorch.backend("CSX")
    model, opt, sched = build()
    ref_model, ref_opt, ref_sched = build()
    bn, ref_bn = model.body[1], ref_model.body[1]
    calls = {"n": 0}
    seen = []

    @cstorch.step_closure
    def record(mean, buf, lr):
        seen.append((mean, buf, lr))

    @cstorch.trace
    def step(x, y):
        calls["n"] += 1
        loss = torch.nn.functional.nll_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        record(bn.running_mean, opt.state[model.head.weight]["momentum_buffer"], opt.param_groups[0]["lr"])
        return loss

    ref = []
    for x, y in batches(100):
        step(x, y)
        loss = torch.nn.functional.nll_loss(ref_model(x), y)
        ref_opt.zero_grad()
        loss.backward()
        ref_opt.step()
        ref_sched.step()
        ref.append((ref_bn.running_mean.clone(), ref_opt.state[ref_model.head.weight]["momentum_buffer"].clone(),
                    ref_opt.param_groups[0]["lr"].clone()))
    assert calls["n"] == 1
    assert len(seen) == 100
    for (m, b, lr), (rm, rb, rlr) in zip(seen, ref):  # every step's values, bit-identical to eager
        assert torch.equal(m, rm) and torch.equal(b, rb) and torch.equal(lr, rlr)
    assert len({tuple(m.tolist()) for m, _, _ in seen}) == 100  # running stats changed every step
    assert int(bn.num_batches_tracked) == 100 and int(sched.last_epoch) == 100


def test_grads_left_by_the_step_reach_the_real_parameters():
    cstorch.backend("CSX")
    model, opt, _ = build()
    ref, _, _ = build()

    @cstorch.trace
    def step(x, y):
        torch.nn.functional.nll_loss(model(x), y).backward()  # no optimizer: grads stay

    x, y = batches(1)[0]
    step(x, y)
    torch.nn.functional.nll_loss(ref(x), y).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_stray_tensor_is_lifted_and_mutated_in_place():
    cstorch.backend("CSX")
    model, opt, _ = build()
    counter = torch.zeros(())  # closed over by no module/optimizer: found by the trace itself
    holder = {"t": counter}
    calls = []

    def bump():
        holder["t"].add_(2)

    @cstorch.trace
    def step(x, y):
        calls.append(1)
        bump()
        return model(x).sum()

    for x, y in batches(5):
        step(x, y)
    assert len(calls) == 1 and float(counter) == 10.0


class RebindingScheduler:
    """Assigns a new tensor each step (not in place): replay copies the new value into the old tensor."""

    def __init__(self) -> None:
        self.last_epoch = torch.tensor(0)

    def step(self) -> None:
        self.last_epoch = self.last_epoch + 1


def test_rebound_state_keeps_tensor_identity():
    cstorch.backend("CSX")
    model, _, _ = build()
    sched = RebindingScheduler()
    original = sched.last_epoch

    @cstorch.trace
    def step(x, y):
        sched.step()
        return model(x).sum()

    for x, y in batches(7):
        step(x, y)
    assert sched.last_epoch is original and int(original) == 7


def test_registered_object_rebinding_is_state():
    """An object reached only through a module namespace (which the walk skips) and rebound in the step."""
    import types

    from cs_run.engine import register_state, unregister_state

    cstorch.backend("CSX")
    model, _, _ = build()
    ref_model, _, _ = build()

    class Scaler:
        def __init__(self):
            self.scale = torch.tensor(4.0)

    hidden = types.ModuleType("hidden")
    hidden.scaler = register_state(Scaler())
    original = hidden.scaler.scale

    @cstorch.trace
    def step(x, y):
        s = hidden.scaler
        s.scale = s.scale * 0.5  # rebinding, not in place
        return model(x).sum() * s.scale

    try:
        outs = [step(x, y) for x, y in batches(3)]
    finally:
        unregister_state(hidden.scaler)
    assert hidden.scaler.scale is original and float(original) == 0.5
    with torch.no_grad():
        expected = [ref_model(x).sum() * (4.0 * 0.5 ** (i + 1)) for i, (x, _) in enumerate(batches(3))]
    for out, ref in zip(outs, expected):
        assert torch.equal(out, ref)


def test_output_layout_names_every_graph_output():
    # User outputs, a rebound state slot, gradients left on parameters and closure values, in this order.
    from cs_run.engine.step import CompiledStep

    class Counter:
        def __init__(self):
            self.total = torch.zeros(())

    model = torch.nn.Linear(3, 2)
    counter = Counter()
    seen = []

    @cstorch.step_closure
    def record(loss, weight):
        seen.append((loss, weight))

    def step(x):
        loss = model(x).pow(2).mean()
        loss.backward()  # gradients stay on the parameters: graph outputs
        counter.total = counter.total + loss.detach()  # a rebind: the slot gets a new tensor
        record(loss, model.weight)
        return loss, {"double": 2 * loss, "tag": "kept"}

    compiled = CompiledStep(step)
    x = torch.ones(4, 3)
    loss, extra = compiled(x)
    traced, _ = next(iter(compiled._executables.values()))
    layout = traced.layout
    outputs = [n for n in traced.gm.graph.nodes if n.op == "output"][0].args[0]
    assert layout.num_user == 2 and len(layout.rebind_slots) == 1 and len(layout.grad_slots) == 2
    assert layout.num_closure_values == 2 and layout.num_outputs == len(outputs)
    assert list(layout.rebinds) == [2] and list(layout.grads) == [3, 4] and list(layout.closure_values) == [5, 6]
    assert extra["tag"] == "kept" and torch.equal(extra["double"], 2 * loss)
    torch.testing.assert_close(counter.total, loss)
    torch.testing.assert_close(seen[0][0], loss)
    torch.testing.assert_close(seen[0][1], model.weight)
    assert model.weight.grad is not None and model.bias.grad is not None
