"""Recompiles, validate-only / compile-only, the compile cache, and the inductor tier."""

from __future__ import annotations

import logging
import os
import warnings

import pytest
import torch

import cs_run as cstorch
from cs_run.engine import CompiledStep, EngineOptions, RecompileError, compile_step_only, validate_step
from tests.engine.helpers import MLP, TraceSafeSGD


def make(seed: int = 0):
    torch.manual_seed(seed)
    model = MLP(depth=1, hidden=8)
    opt = TraceSafeSGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        loss = torch.nn.functional.nll_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return model, opt, step


def batch(n: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def test_new_shape_retraces_with_counted_warning():
    model, _, step = make()
    compiled = CompiledStep(step)
    compiled(*batch(8))
    with pytest.warns(UserWarning, match=r"recompile #1\): the input signature changed"):
        compiled(*batch(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled(*batch(8, seed=1))  # known signature: no warning, no trace
    assert compiled.num_traces == 2 and compiled.recompiles == 1


def test_recompile_refused_when_disabled():
    _, _, step = make()
    compiled = CompiledStep(step, EngineOptions(allow_recompile=False))
    compiled(*batch(8))
    with pytest.raises(RecompileError, match="retracing is disabled"):
        compiled(*batch(4))


def test_replaced_parameter_triggers_retrace_not_stale_replay():
    model, _, step = make()
    compiled = CompiledStep(step)
    compiled(*batch())
    model.head.weight = torch.nn.Parameter(torch.zeros_like(model.head.weight))  # no optimizer link: frozen
    with pytest.warns(UserWarning, match="state was replaced"):
        compiled(*batch())
    assert compiled.num_traces == 2


def test_validate_only_reports_graph_and_changes_nothing():
    model, opt, step = make()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    summary = validate_step(step, *batch())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert summary.num_parameters == sum(p.numel() for p in model.parameters())
    assert summary.num_state_tensors == 6 + 3 + 6 + 1  # params, BN buffers, momentum buffers, lr
    assert summary.op_counts["addmm"] == 2 and summary.num_ops > 20
    assert summary.input_signature == ["(8, 16) float32 cpu", "(8,) int64 cpu"]
    assert summary.estimated_memory_bytes > summary.state_bytes > 0
    assert "state tensors" in summary.format()


def test_validate_only_backend_returns_meta_and_runs_no_closure(tmp_path):
    cstorch.backend("CSX", validate_only=True, artifact_dir=tmp_path)
    model, _, step = make()
    before = model.head.weight.detach().clone()
    ran = []
    closure = cstorch.step_closure(lambda loss: ran.append(loss))

    @cstorch.trace
    def traced(x, y):
        loss = step(x, y)
        closure(loss)
        return loss

    out = traced(*batch())
    assert out.device.type == "meta" and ran == [] and torch.equal(model.head.weight, before)
    assert not (tmp_path / "cached_compile").exists() and not os.listdir(os.environ["CS_RUN_CACHE_DIR"])


def test_compile_cache_miss_then_hit(tmp_path, caplog):
    _, _, step = make()
    with caplog.at_level(logging.INFO, logger="cs_run.engine.compile"):
        compile_step_only(step, *batch(), compile_dir=str(tmp_path))
        _, _, step2 = make()  # a fresh but identical model: same graph, same key
        compiled = CompiledStep(step2, EngineOptions(compile_dir=str(tmp_path)))
        compiled(*batch())
    lines = [r.getMessage() for r in caplog.records if "compile cache" in r.getMessage()]
    assert lines[0].startswith("compile cache miss") and lines[1].startswith("compile cache hit")
    assert "tier fx" in lines[0] and "compiled in" in lines[0]
    entries = list((tmp_path / "cs_run_cache").iterdir())
    assert len(entries) == 1 and (entries[0] / "graph.py").read_text().startswith("\n\n\ndef forward")


def test_compile_only_backend_does_not_execute(tmp_path):
    cstorch.backend("CSX", compile_only=True, compile_dir=str(tmp_path))
    model, _, step = make()
    before = model.head.weight.detach().clone()
    cstorch.trace(step)(*batch())
    assert torch.equal(model.head.weight, before)
    assert len(list((tmp_path / "cs_run_cache").iterdir())) == 1


@pytest.mark.slow
def test_inductor_tier_matches_eager_within_tolerance(tmp_path):
    """Inductor fuses and reorders float math: results agree to ~1e-6, not bit for bit."""
    pytest.importorskip("torch._inductor")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    ref.load_state_dict(model.state_dict())
    opt, ref_opt = TraceSafeSGD(model.parameters(), lr=0.1), TraceSafeSGD(ref.parameters(), lr=0.1)

    def step(m, o, x):
        loss = m(x).pow(2).mean()
        o.zero_grad()
        loss.backward()
        o.step()
        return loss

    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    compiled = CompiledStep(lambda x: step(model, opt, x), EngineOptions(compile_tier="inductor", compile_dir=str(tmp_path)))
    for i in range(5):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
        torch.testing.assert_close(compiled(x), step(ref, ref_opt, x), rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert (tmp_path / "inductor").is_dir() and any((tmp_path / "inductor").iterdir())  # its kernels went there
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before  # for the compile call only


def test_inductor_cache_dir_is_set_for_the_block_only(monkeypatch, tmp_path):
    from cs_run.engine.compile import inductor_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    with inductor_cache_dir(tmp_path):
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    with pytest.raises(RuntimeError), inductor_cache_dir(tmp_path):
        raise RuntimeError("compile failed")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/elsewhere"
