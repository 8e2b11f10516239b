"""compile_tier auto (the timed trial), compile feedback, and the compile cache that skips the compile."""

from __future__ import annotations

import json
import logging
import os
import random
import statistics
import subprocess
import sys
import time

import pytest
import torch

from cs_run.engine import CompiledStep, EngineOptions
from cs_run.engine import compile as engine_compile
from cs_run.engine.cache import CompileCache
from cs_run.engine.progress import compiling
from cs_run.engine.trial import TierTrial
from tests.engine.helpers import built


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def scripted(clock: FakeClock, name: str, times: list[float], calls: list[str]):
    """An executable whose k-th call takes times[k % len] seconds on the fake clock."""
    def run(*inputs):
        clock.now += times[sum(c == name for c in calls) % len(times)]
        calls.append(name)
        return name
    return run


def test_auto_never_keeps_a_tier_its_own_trial_measured_slower():
    rng = random.Random(0)
    for case in range(300):
        clock, calls = FakeClock(), []
        base = rng.choice([1e-4, 1e-3, 1e-2])
        times = {name: [base * rng.uniform(0.3, 3.0) for _ in range(rng.randint(1, 7))] for name in ("fx", "inductor")}
        if case % 10 == 0:
            times["inductor"] = list(times["fx"])  # exact ties: fx (bit-identical) must win
        trial = TierTrial({k: scripted(clock, k, v, calls) for k, v in times.items()}, clock=clock,
                          min_samples=rng.randint(1, 6), min_seconds=rng.choice([0.0, 0.01, 1.0]), max_samples=9)
        results = [trial() for _ in range(40)]
        assert trial.choice is not None, case
        med = {k: statistics.median(v) for k, v in trial.samples.items()}
        assert all(med[trial.choice] <= m for m in med.values()), (case, med, trial.choice)
        if med["fx"] == med["inductor"]:
            assert trial.choice == "fx"
        # every call ran exactly one executable and returned its result; after the choice, only the winner runs
        assert results == calls
        decided_at = sum(len(v) for v in trial.samples.values()) + 2  # + one warm-up call per tier
        assert set(calls[decided_at:]) <= {trial.choice}
        assert calls[:decided_at:2] == ["fx"] * len(calls[:decided_at:2])  # interleaved: fx, inductor, fx, ...


def test_auto_trial_takes_recorded_timings_as_given():
    trial = TierTrial({"fx": lambda: None, "inductor": lambda: None}, min_samples=3, min_seconds=0.0)
    for fx_t, ind_t in [(1.0, 0.5), (1.0, 3.0), (1.0, 0.6)]:  # inductor's median 0.6 < fx's 1.0
        trial.record("fx", fx_t)
        trial.record("inductor", ind_t)
    assert trial.choice == "inductor" and "0.600 ms" not in trial.reason and "600.000 ms" in trial.reason
    slow = TierTrial({"fx": lambda: None, "inductor": lambda: None}, min_samples=3, min_seconds=0.0)
    for fx_t, ind_t in [(1.0, 0.5), (1.0, 3.0), (1.0, 1.1)]:  # one fast outlier does not win: median 1.1
        slow.record("fx", fx_t)
        slow.record("inductor", ind_t)
    assert slow.choice == "fx"


def test_auto_is_fx_with_a_reason_where_inductor_cannot_build(monkeypatch, caplog):
    monkeypatch.setattr(engine_compile.shutil, "which", lambda name: None)
    with caplog.at_level(logging.INFO, logger="cs_run"):
        assert engine_compile.resolve_tier("auto", torch.device("cpu")) == "fx"
    assert any("no C++ compiler" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(engine_compile, "DEFAULT_TIER", "auto")
    assert engine_compile.resolve_tier(None, torch.device("cpu")) == "fx"
    with pytest.raises(ValueError, match="Invalid compile_tier 'fast'; must be one of auto, fx, inductor"):
        EngineOptions(compile_tier="fast")  # the engine's door: a tier given as a string is checked there, once


def test_a_long_compile_logs_elapsed_time_while_it_runs(caplog):
    with caplog.at_level(logging.INFO, logger="cs_run"):
        with compiling("step (tier inductor)", interval=0.05):
            time.sleep(0.32)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "compiling step (tier inductor) ..."
    beats = [m for m in lines if m.startswith("still compiling step (tier inductor) (")]
    assert 3 <= len(beats) <= 7 and beats[-1].endswith("s elapsed)")
    n = len(caplog.records)
    time.sleep(0.15)
    assert len(caplog.records) == n  # the thread stopped with the block


MODEL_SRC = """
import torch
from cs_run.optim import SGD

def make(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return model, step

def batch(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
"""

WARM_PROCESS = """
import json, sys
import torch
torch.set_num_threads(1)
sys.path.insert(0, {folder!r})
from tiny_step import make, batch
from cs_run.engine import CompiledStep, EngineOptions
from cs_run.engine import compile as engine_compile
model, step = make()
compiled = CompiledStep(step, EngineOptions(compile_tier="inductor", compile_dir={compile_dir!r}))
losses = [float(compiled(*batch(i))) for i in range(3)]
lowering = sorted(m for m in ("torch._inductor.compile_fx", "torch._inductor.codecache", "torch._inductor.graph")
                  if m in sys.modules)
print(json.dumps({{"counts": dict(engine_compile.COUNTS), "losses": losses, "lowering_modules": lowering,
                   "executable": type(next(iter(compiled._executables.values()))[1]).__name__}}))
"""


@pytest.mark.slow
def test_auto_trial_then_a_warm_process_loads_without_compiling(tmp_path, monkeypatch):
    """One cold inductor build (under auto), then fresh processes with the same model, optimizer and
    input signature: each loads the saved library without importing inductor's compiler, runs no
    lowering, and computes the same losses as the cold process's build."""
    pytest.importorskip("torch._inductor")
    if engine_compile.resolve_tier("auto", torch.device("cpu")) != "auto":
        pytest.skip("no C++ compiler: inductor cannot build here")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "unused"))  # restored after the test
    (tmp_path / "tiny_step.py").write_text(MODEL_SRC)
    monkeypatch.syspath_prepend(str(tmp_path))
    from tiny_step import batch, make

    compile_dir = tmp_path / "compile"
    model, step = make()
    ref_model, ref_step = make()
    before = engine_compile.COUNTS["inductor_compile"]
    compiled = CompiledStep(step, EngineOptions(compile_tier="auto", compile_dir=str(compile_dir)))
    losses = []
    for i in range(40):
        x, y = batch(i)
        losses.append(float(compiled(x, y)))
        torch.testing.assert_close(losses[-1], float(ref_step(x, y)), rtol=1e-5, atol=1e-6)  # either tier
    assert engine_compile.COUNTS["inductor_compile"] == before + 1
    trial = built(compiled)[1]
    assert isinstance(trial, TierTrial) and trial.choice in ("fx", "inductor")
    med = trial.medians()
    assert med[trial.choice] == min(med.values())

    script = WARM_PROCESS.format(folder=str(tmp_path), compile_dir=str(compile_dir))
    # A bare environment, except the CPU capability aten dispatches to: the bit-equal comparison below
    # is "same library, same machine", and the aten ops around the kernels round per ISA.
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    if "ATEN_CPU_CAPABILITY" in os.environ:
        env["ATEN_CPU_CAPABILITY"] = os.environ["ATEN_CPU_CAPABILITY"]
    runs = []
    for _ in range(2):
        res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                             env=env)
        assert res.returncode == 0, res.stderr
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    for warm in runs:
        assert warm["counts"] == {"inductor_load": 1}  # loaded, no lowering
        assert warm["executable"] == "AOTStep"  # the saved library, run by torch's C++ runner
        assert warm["lowering_modules"] == []  # inductor's compiler was never even imported
        assert warm["losses"] == runs[0]["losses"]
    # the cold process's inductor kernels on the same start state and batches: same losses
    _, cold_step = make()
    cold = CompiledStep(cold_step, EngineOptions(compile_tier="inductor", compile_dir=str(compile_dir)))
    assert [float(cold(*batch(i))) for i in range(3)] == warm["losses"]


def test_artifact_save_is_per_key_and_never_half_written(tmp_path, caplog):
    class Artifact:
        def __init__(self, fail):
            self.fail = fail

        def save(self, path, format):
            with open(path, "wb") as f:
                f.write(b"partial")
            if self.fail:
                raise OSError(28, "No space left on device")

    cache = CompileCache(tmp_path)
    assert cache.artifact_path("a") != cache.artifact_path("b")
    cache.save_artifact("a", Artifact(fail=False))
    assert cache.artifact_path("a").read_bytes() == b"partial"
    with caplog.at_level(logging.WARNING, logger="cs_run"):
        cache.save_artifact("b", Artifact(fail=True))
    assert not cache.artifact_path("b").exists()
    assert sorted(p.name for p in (tmp_path / "artifacts").iterdir()) == [cache.artifact_path("a").name]
    assert any("No space left" in r.getMessage() for r in caplog.records)


def test_saved_isa_probe_verdicts_are_used_only_on_the_same_host(tmp_path, monkeypatch):
    """Inductor's CPU-ISA probes (a compile + a child Python each) answer from the record only for the
    same host (torch, CPU flags, compiler), ISA, flags and probe code; anything else probes and is added."""
    cpu_vec_isa = pytest.importorskip("torch._inductor.cpu_vec_isa")
    if engine_compile.resolve_tier("auto", torch.device("cpu")) != "auto":
        pytest.skip("no C++ compiler: inductor cannot build here")
    calls = []
    monkeypatch.setattr(cpu_vec_isa.VecISA, "check_build", lambda self, code: calls.append((str(self), code)) or True)
    isa = cpu_vec_isa.supported_vec_isa_list[-1]
    record = tmp_path / "artifacts" / "vec_isa.json"
    with engine_compile.isa_probe_cache(record):  # nothing recorded yet: probes, records
        assert isa.check_build("probe A") is True and isa.check_build("probe B") is True
    assert len(calls) == 2 and len(json.loads(record.read_text())["verdicts"]) == 2
    saved = json.loads(record.read_text())
    saved["verdicts"] = {k: False for k in saved["verdicts"]}  # verdicts the patched probe would not give
    record.write_text(json.dumps(saved))
    with engine_compile.isa_probe_cache(record):
        assert isa.check_build("probe A") is False and isa.check_build("probe B") is False  # no probe ran
        assert isa.check_build("probe C") is True  # a new probe code runs and is added
    assert len(calls) == 3 and len(json.loads(record.read_text())["verdicts"]) == 3
    assert cpu_vec_isa.VecISA.check_build is not None and calls[-1][1] == "probe C"
    for host in ("", json.dumps(["another torch"])):  # another host's record: probe as usual
        record.write_text(json.dumps(saved | {"host": host}))
        with engine_compile.isa_probe_cache(record):
            assert isa.check_build("probe A") is True
    record.write_text("{not json")
    with engine_compile.isa_probe_cache(record):
        assert isa.check_build("probe A") is True
    assert len(calls) == 6
