"""Clipping and unscaling inside a CSX step: one multi-tensor op on CUDA, per parameter on the CPU.

torch picks its multi-tensor paths only for plain tensors, so inside a trace (fake tensors) clipping
and unscaling ran parameter by parameter; on CUDA that was a kernel or two per parameter
(``cs_run/amp/_multi_tensor.py``). The CPU cannot run a CUDA trace, so the graph is checked on the CPU
with the CUDA answer forced, and the rule itself on fake CUDA tensors.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cs_run as cstorch
from cs_run.amp import GradScaler, _multi_tensor
from cs_run.engine import CompiledStep, EngineOptions, aot
from cs_run.optim import AdamW
from tests.engine.helpers import built

CLIPS = [{"max_gradient_norm": 0.05}, {"max_gradient_value": 0.01}]


def test_the_multi_tensor_path_is_asked_for_on_cuda_only():
    with FakeTensorMode():  # a CUDA tensor's device without a GPU
        on_cuda = [torch.empty(3, device="cuda"), torch.empty(2, device="cuda")]
    assert _multi_tensor.multi_tensor_kernels(on_cuda) is True
    assert _multi_tensor.multi_tensor_kernels([torch.empty(3)]) is False
    assert _multi_tensor.multi_tensor_kernels([]) is False


def _force(monkeypatch, answer: bool) -> None:
    """The rule's answer for the clipping and the unscaling (both call it through its module)."""
    monkeypatch.setattr(_multi_tensor, "multi_tensor_kernels", lambda tensors: answer)


def _batches(seed: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(count)]


def _model_and_step(clip: dict, scaler: GradScaler | None = None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 3))
    opt = AdamW(model.parameters(), lr=0.05, weight_decay=0.01)

    def step(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        cstorch.amp.optimizer_step(loss, opt, scaler, **clip)
        return loss

    return model, step


@pytest.mark.parametrize("clip", CLIPS, ids=["norm", "value"])
@pytest.mark.parametrize("multi_tensor", [True, False], ids=["cuda-rule", "cpu-rule"])
def test_traced_clipping_ops_and_results(clip, multi_tensor, monkeypatch):
    """With the CUDA rule the graph clips with multi-tensor ops only; either way the replayed steps
    equal the eager ones bit for bit (the fx tier runs the same ATen kernels: a CPU ``_foreach_norm``
    is a norm per tensor, and eager CPU clipping takes the multi-tensor path either way)."""
    _force(monkeypatch, multi_tensor)
    batches = _batches(1, 3)
    eager_model, eager_step = _model_and_step(clip)
    model, step = _model_and_step(clip)
    compiled = CompiledStep(step, EngineOptions(compile_tier="fx", cuda_graphs=False))
    for x, y in batches:
        assert torch.equal(compiled(x, y), eager_step(x, y))
    for (name, p), ref in zip(model.named_parameters(), eager_model.parameters()):
        assert torch.equal(p, ref), name

    ops = built(compiled)[0].summary.op_counts
    n_params = len(list(model.parameters()))
    # a norm: per parameter, then one of the stacked norms; a value: one clamp per parameter
    per_tensor, multi, extra = (("linalg_vector_norm", "_foreach_norm", 1) if "max_gradient_norm" in clip
                                else ("clamp_", "_foreach_clamp_min_", 0))
    if multi_tensor:
        assert ops.get(multi) == 1 and ops.get(per_tensor, 0) == extra, ops
    else:
        assert ops.get(per_tensor) == n_params + extra and multi not in ops, ops


@pytest.mark.parametrize("multi_tensor", [True, False], ids=["cuda-rule", "cpu-rule"])
def test_traced_unscaling_ops_and_results(multi_tensor, monkeypatch):
    """Dynamic loss scaling over steps with and without an overflow: with the CUDA rule the graph unscales
    and checks with one ``_amp_foreach_non_finite_check_and_unscale_``; the replayed steps equal the eager
    per-tensor path (the well-tested one) bit for bit, skipped steps and scale history included (the
    scales are powers of two, so the unscaled gradients are exact either way)."""
    batches = _batches(2, 5)
    batches[2][0][0, 0] = float("inf")  # an overflow: the step is skipped and the scale halves

    def run(compiled: bool):
        scaler = GradScaler("dynamic", init_scale=2.0**10, steps_per_increase=2)
        model, step = _model_and_step({"max_gradient_norm": 0.05}, scaler)
        if compiled:
            step = CompiledStep(step, EngineOptions(compile_tier="fx", cuda_graphs=False))
        _force(monkeypatch, multi_tensor and compiled)
        history = []
        for x, y in batches:
            step(x, y)
            history.append(float(scaler.current_scale))
        return step, history, [p.detach().clone() for p in model.parameters()]

    _, eager_history, eager_params = run(False)
    compiled, history, params = run(True)
    assert history == eager_history and eager_history[2] < eager_history[1], history
    assert all(torch.equal(a, b) for a, b in zip(params, eager_params))
    ops = built(compiled)[0].summary.op_counts
    n_params = len(params)  # the per-tensor check is isfinite(g).all(): an abs (and more) per gradient
    if multi_tensor:
        assert ops.get("_amp_foreach_non_finite_check_and_unscale_") == 1 and "abs" not in ops, ops
    else:
        assert ops.get("abs") == n_params and "_amp_foreach_non_finite_check_and_unscale_" not in ops, ops


@pytest.mark.slow
def test_inductor_s_wrapper_form_runs_the_multi_tensor_ops(monkeypatch, caplog, tmp_path):
    """The form CUDA steps are built in (inductor's Python wrapper, ``standalone_compile``) takes the
    multi-tensor norm and unscale as ATen calls: built here on the CPU (where the ahead-of-time library
    cannot call them) by failing the ahead-of-time build, it matches the eager steps within 1e-5 (its C++
    kernels sum in their own order)."""
    batches = _batches(3, 4)

    def run(compiled: bool):
        scaler = GradScaler("dynamic", init_scale=2.0**10, steps_per_increase=2)
        model, step = _model_and_step({"max_gradient_norm": 0.05}, scaler)
        if compiled:
            step = CompiledStep(step, EngineOptions(compile_tier="inductor", cuda_graphs=False,
                                                    compile_dir=str(tmp_path)))  # inductor's caches: its own
        losses = [step(x, y).detach().clone() for x, y in batches]
        return step, torch.stack(losses), [p.detach().clone() for p in model.parameters()]

    _, eager_losses, eager_params = run(False)
    _force(monkeypatch, True)
    monkeypatch.setattr(aot, "build", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("the CUDA path, please")))
    compiled, losses, params = run(True)
    assert "building inductor's Python-wrapper form" in caplog.text
    ops = built(compiled)[0].summary.op_counts
    assert ops.get("_foreach_norm") == 1 and ops.get("_amp_foreach_non_finite_check_and_unscale_") == 1, ops
    torch.testing.assert_close(losses, eager_losses, atol=1e-5, rtol=1e-5)
    for a, b in zip(params, eager_params):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
