"""Asynchrony: a replayed step reads no value back to the host (no hidden sync); closures run after it."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import cs_run as cstorch
from tests.engine.helpers import MLP, ExponentialLR, TraceSafeSGD, input_fn

_HOST_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default,
               torch.ops.aten.equal.default}


class CountHostReads(TorchDispatchMode):
    """Counts the aten ops that copy a value to the host (what .item()/bool()/float() dispatch to)."""

    def __init__(self):
        super().__init__()
        self.reads, self.ops = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        self.reads += func in _HOST_READS
        return func(*args, **(kwargs or {}))


def test_replay_steps_do_not_sync_with_the_host():
    cstorch.backend("CSX")
    torch.manual_seed(0)
    model = MLP()
    opt = TraceSafeSGD(model.parameters())
    sched = ExponentialLR(opt, gamma=0.9)
    loader = cstorch.utils.data.DataLoader(input_fn, batch_size=16)

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.nll_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        return loss

    executor = cstorch.utils.data.DataExecutor(loader, num_steps=6)
    counter = CountHostReads()
    for i, (x, y) in enumerate(executor):
        if i == 0:
            step(x, y)  # the trace (fake tensors) and compile
            continue
        with counter:  # data loading is outside: only the replayed step is watched
            step(x, y)
    assert counter.ops > 50  # the replay really ran under the mode
    assert counter.reads == 0
