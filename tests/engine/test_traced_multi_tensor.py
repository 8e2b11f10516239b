"""Gradient clipping inside a CSX step: one multi-tensor op on CUDA, per parameter on the CPU.

torch's clipping picks its multi-tensor path only for plain tensors, so inside a trace (fake tensors)
it clips parameter by parameter unless it is told ``foreach=True``; on CUDA that was a norm kernel and
a scaling kernel per parameter. The CPU cannot run a CUDA trace, so the graph is checked on the CPU
with the CUDA answer forced, and the rule itself on fake CUDA tensors.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cs_run as cstorch
from cs_run.engine import CompiledStep, EngineOptions
from cs_run.optim import AdamW

optimizer_step_module = importlib.import_module("cs_run.amp.optimizer_step")  # the package's name is the function
CLIPS = [{"max_gradient_norm": 0.05}, {"max_gradient_value": 0.01}]


def test_the_multi_tensor_path_is_asked_for_on_cuda_only():
    with FakeTensorMode():  # a CUDA tensor's device without a GPU
        on_cuda = [torch.empty(3, device="cuda"), torch.empty(2, device="cuda")]
    assert optimizer_step_module._multi_tensor_clipping(on_cuda) is True
    assert optimizer_step_module._multi_tensor_clipping([torch.empty(3)]) is None  # torch's default
    assert optimizer_step_module._multi_tensor_clipping([]) is None


def _model_and_step(clip: dict):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 3))
    opt = AdamW(model.parameters(), lr=0.05, weight_decay=0.01)

    def step(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        cstorch.amp.optimizer_step(loss, opt, None, **clip)
        return loss

    return model, step


@pytest.mark.parametrize("clip", CLIPS, ids=["norm", "value"])
@pytest.mark.parametrize("multi_tensor", [True, None], ids=["cuda-rule", "cpu-rule"])
def test_traced_clipping_ops_and_results(clip, multi_tensor, monkeypatch):
    """With the CUDA rule the graph clips with multi-tensor ops only; either way the replayed steps
    equal the eager ones bit for bit (the fx tier runs the same ATen kernels: a CPU ``_foreach_norm``
    is a norm per tensor)."""
    monkeypatch.setattr(optimizer_step_module, "_multi_tensor_clipping", lambda params: multi_tensor)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(3)]
    eager_model, eager_step = _model_and_step(clip)
    model, step = _model_and_step(clip)
    compiled = CompiledStep(step, EngineOptions(compile_tier="fx", cuda_graphs=False))
    for x, y in batches:
        assert torch.equal(compiled(x, y), eager_step(x, y))
    for (name, p), ref in zip(model.named_parameters(), eager_model.parameters()):
        assert torch.equal(p, ref), name

    ops = next(iter(compiled._executables.values()))[0].summary.op_counts
    n_params = len(list(model.parameters()))
    # a norm: per parameter, then one of the stacked norms; a value: one clamp per parameter
    per_tensor, multi, extra = (("linalg_vector_norm", "_foreach_norm", 1) if "max_gradient_norm" in clip
                                else ("clamp_", "_foreach_clamp_min_", 0))
    if multi_tensor:
        assert ops.get(multi) == 1 and ops.get(per_tensor, 0) == extra, ops
    else:
        assert ops.get(per_tensor) == n_params + extra and multi not in ops, ops
