"""The CSX engine on a real CUDA device: CUDA-graph replay against the same step without a graph and
against eager PyTorch on the GPU.

Marked ``cuda``: skipped in the default (CPU) suite; on a GPU machine run
``CS_RUN_TEST_CUDA=1 pytest -m cuda``. The CPU-side logic of the graph wrapper (capture decision,
static buffers) is tested without a GPU in test_cudagraph.py.

Tolerances: a CUDA graph replays the very kernels of the step it captured, so graph vs no graph is
bitwise. CSX vs eager on the GPU is compared within 1e-6: the traced step's kernels are eager's, but
cuBLAS may pick another algorithm for a call made from a captured or traced context.
"""

from __future__ import annotations

import logging

import pytest
import torch

import cs_run as cstorch
from cs_run.engine import CompiledStep, EngineOptions
from cs_run.optim import SGD, AdamW
from tests.engine.helpers import built

pytestmark = pytest.mark.cuda

DEVICE = torch.device("cuda") if torch.cuda.is_available() else None


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.LayerNorm(64),
                               torch.nn.Linear(64, 10)).to(DEVICE)


def _batches(n: int = 8):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 32, generator=g).to(DEVICE), torch.randint(0, 10, (16,), generator=g).to(DEVICE))
            for _ in range(n)]


def _step_fn(model, opt, clip: bool):
    def step(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        return loss
    return step


def _run(tier: str | None, graphs: bool, opt_cls, clip: bool, tmp_path, name: str):
    """Losses and final parameters of 8 steps on 8 different batches; tier None: eager."""
    model = _mlp()
    opt = opt_cls(model.parameters(), lr=0.01)
    step = _step_fn(model, opt, clip)
    if tier is not None:
        step = CompiledStep(step, EngineOptions(compile_tier=tier, compile_dir=str(tmp_path / name), cuda_graphs=graphs))
    losses = torch.stack([step(x, y).detach().clone() for x, y in _batches()])
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("opt_cls, clip", [(SGD, False), (AdamW, True)], ids=["sgd", "adamw-clip"])
def test_graph_replay_is_bitwise_the_step_without_a_graph_and_close_to_eager(opt_cls, clip, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    eager = _run(None, False, opt_cls, clip, tmp_path, "eager")
    plain = _run("fx", False, opt_cls, clip, tmp_path, "plain")
    graphed = _run("fx", True, opt_cls, clip, tmp_path, "graphed")
    assert "no CUDA graph" not in caplog.text  # this step is capturable: the graph really replayed
    assert torch.equal(plain[0], graphed[0])
    assert all(torch.equal(a, b) for a, b in zip(plain[1], graphed[1]))
    torch.testing.assert_close(graphed[0], eager[0], atol=1e-6, rtol=1e-6)
    for a, b in zip(graphed[1], eager[1]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert len(set(float(v) for v in graphed[0])) > 1  # new batches reached the graph's static buffers


def test_inductor_graph_replay_matches_inductor_without_a_graph(tmp_path, caplog):
    """Two separate inductor builds may pick different Triton kernel configurations (autotuning), so
    unlike fx this is compared within 1e-6, not bitwise."""
    caplog.set_level(logging.INFO)
    plain = _run("inductor", False, SGD, False, tmp_path, "plain")
    graphed = _run("inductor", True, SGD, False, tmp_path, "graphed")
    assert "no CUDA graph" not in caplog.text
    torch.testing.assert_close(graphed[0], plain[0], atol=1e-6, rtol=1e-6)
    for a, b in zip(graphed[1], plain[1]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_a_step_that_cannot_be_captured_runs_without_a_graph_and_says_why(tmp_path, caplog):
    def run(graphs: bool, name: str) -> list[float]:
        model = _mlp()
        opt = SGD(model.parameters(), lr=0.01)
        host = torch.ones(1)  # a CPU tensor read inside a CUDA step: not capturable

        def step(x, y):
            loss = torch.nn.functional.cross_entropy(model(x), y) * host.to(x.device)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        compiled = CompiledStep(step, EngineOptions(compile_tier="fx", compile_dir=str(tmp_path / name), cuda_graphs=graphs))
        return [float(compiled(x, y)) for x, y in _batches(3)]

    caplog.set_level(logging.WARNING)
    without = run(False, "without")
    assert "no CUDA graph" not in caplog.text
    fallback = run(True, "fallback")
    assert "no CUDA graph" in caplog.text and "cpu" in caplog.text  # the reason names the host tensor
    assert fallback == without


def test_clipping_in_a_cuda_step_is_one_multi_tensor_norm(tmp_path, caplog):
    """cs-run's clipping asks torch for its multi-tensor path on CUDA: the traced step holds one
    ``_foreach_norm`` and one ``_foreach_mul_``, not a norm and a scaling per parameter (see
    test_traced_multi_tensor.py). Inductor's Triton kernels sum in their own order: within 1e-5 of eager."""
    caplog.set_level(logging.INFO)

    def run(compiled: bool):
        model = _mlp()
        opt = AdamW(model.parameters(), lr=0.01)

        def step(x, y):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            cstorch.amp.optimizer_step(loss, opt, None, max_gradient_norm=0.05)  # small: every step clips
            return loss

        if compiled:
            step = CompiledStep(step, EngineOptions(compile_tier="inductor", compile_dir=str(tmp_path / "c"),
                                                    cuda_graphs=True))
        losses = torch.stack([step(x, y).detach().clone() for x, y in _batches()])
        return step, losses, [p.detach().clone() for p in model.parameters()]

    _, eager_losses, eager_params = run(False)
    compiled, losses, params = run(True)
    ops = built(compiled)[0].summary.op_counts
    assert ops.get("_foreach_norm") == 1 and ops.get("linalg_vector_norm") == 1, ops  # the latter: of the norms
    assert ops.get("_foreach_mul_", 0) >= 1, ops
    assert "no CUDA graph" not in caplog.text
    torch.testing.assert_close(losses, eager_losses, atol=1e-5, rtol=1e-5)
    for a, b in zip(params, eager_params):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
