"""compile_tier auto on a short run: fx first, and an inductor build only when the steps left can win it back.

The decision takes its numbers as given (steps left, the fx step's measured time, the build's estimate),
so these tests inject them: a fake clock for the fx timings, a counted stand-in for the inductor build.
"""

from __future__ import annotations

import logging

import pytest
import torch

from cs_run.engine import CompiledStep, EngineOptions
from cs_run.engine import compile as engine_compile
from cs_run.engine.cache import CompileCache
from cs_run.engine.trial import PayoffGate, TierTrial, payoff
from tests.engine.helpers import built, make_sgd_step

# steps left, fx ms/step, build seconds -> tier. "at most" is steps x fx time: inductor cannot run a step in
# less than no time, so a run that cannot save the build even then never builds it.
PAYOFF = [
    (150, 0.4, 30.0, "fx"),  # the run: 0.06 s to win, 30 s to spend
    (10_000, 1.0, 30.0, "fx"),  # 10 s < 30 s
    (30_000, 1.0, 30.0, "fx"),  # exactly even: nothing to win, keep the bit-identical tier
    (30_001, 1.0, 30.0, "inductor"),
    (1_000_000, 0.4, 30.0, "inductor"),  # a long run: as before, build and let the trial decide
    (0, 5.0, 0.5, "fx"),
]


@pytest.mark.parametrize("steps, fx_ms, build_s, tier", PAYOFF)
def test_payoff_weighs_the_most_the_run_could_save_against_the_build(steps, fx_ms, build_s, tier):
    assert payoff(steps, fx_ms / 1e3, build_s)[0] == tier


def test_payoff_says_why_in_numbers():
    assert payoff(150, 0.4e-3, 30.0) == (
        "fx", "150 steps left x 0.4 ms/step could save at most 0.06 s; compiling inductor takes ~30 s")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def gate(steps_left, fx_seconds=4e-4, compile_seconds=30.0, agree=None):
    """A gate whose fx step takes ``fx_seconds`` on a fake clock; ``built`` counts inductor builds."""
    clock, calls, built = Clock(), [], []

    def fx(*inputs):
        clock.now += fx_seconds
        calls.append("fx")
        return "fx"

    def build():
        built.append(1)
        return lambda *inputs: calls.append("after build") or "after build"

    g = PayoffGate(fx, build, steps_left=steps_left, compile_seconds=compile_seconds, samples=5, clock=clock,
                   agree=agree)
    return g, calls, built


def test_a_short_run_stays_on_fx_and_never_builds_inductor(caplog):
    asked = []

    def steps_left():  # a 150-step run's count of the steps still to run, the current one included
        asked.append(1)
        return 150 - len(calls) + 1

    g, calls, built = gate(steps_left)
    with caplog.at_level(logging.INFO, logger="cs_run"):
        outs = [g() for _ in range(150)]
    assert built == [] and outs == ["fx"] * 150 and g.choice == "fx" and g.decision == "fx" and asked == [1]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["compile_tier auto: step runs on tier fx (144 steps left x 0.4 ms/step could save at most "
                     "0.0576 s; compiling inductor takes ~30 s)"]  # 6 steps ran: a warm-up and 5 timed


def test_a_long_run_builds_inductor_once_then_runs_what_the_build_made(caplog):
    asked = []
    g, calls, built = gate(lambda: asked.append(1) or 1_000_000)
    with caplog.at_level(logging.INFO, logger="cs_run"):
        outs = [g() for _ in range(20)]
    assert built == [1] and len(asked) == 1
    assert outs == ["fx"] * 6 + ["after build"] * 14  # a warm-up and 5 timed fx steps, then the trial's executable
    assert g.decision == "inductor" and "999999 steps left" in caplog.records[0].getMessage()


def test_a_run_of_unknown_length_builds_inductor_as_before():
    g, calls, built = gate(lambda: None)
    [g() for _ in range(7)]
    assert built == [1] and g.decision == "inductor" and "unknown" in g.reason


def test_replicas_take_ordinal_0s_decision():
    g, _, built = gate(lambda: 1_000_000, agree=lambda mine: "fx")  # ordinal 0 found it short
    [g() for _ in range(10)]
    assert built == [] and g.choice == "fx" and g.reason.startswith("ordinal 0 decided it for every replica (here: inductor")
    g, _, built = gate(lambda: 10, agree=lambda mine: "inductor")
    [g() for _ in range(10)]
    assert built == [1] and g.decision == "inductor"


def test_the_build_estimate_follows_the_graph_size_and_this_hosts_recorded_builds(tmp_path):
    cache = CompileCache(tmp_path)
    small, big = engine_compile.estimate_inductor_seconds(20, None), engine_compile.estimate_inductor_seconds(400, None)
    assert 0 < small < big
    assert engine_compile.estimate_inductor_seconds(20, cache) == small  # no history: the size model
    model_100 = engine_compile.estimate_inductor_seconds(100, None)
    for i, (how, seconds) in enumerate([("compiled", 3 * model_100), ("loaded", 0.01), ("compiled", 3 * model_100)]):
        entry = cache.entries / f"{i:032d}"
        entry.mkdir(parents=True)
        (entry / "summary.json").write_text(
            f'{{"key": "{i:032d}", "tier": "inductor", "how": "{how}", "num_ops": 100, "compile_seconds": {seconds}}}')
    (cache.entries / "junk").mkdir()
    (cache.entries / "junk" / "summary.json").write_text("{not json")
    assert cache.inductor_builds() == [(100, 3 * model_100)] * 2  # loads and damaged records are no evidence
    assert engine_compile.estimate_inductor_seconds(20, cache) == pytest.approx(3 * small)  # a host 3x slower


def batches(n):
    return [torch.randn(3, 4, generator=torch.Generator().manual_seed(i)) for i in range(n)]


@pytest.fixture
def fake_inductor(monkeypatch):
    """Tier auto's inductor builds, counted and stood in for by the graph's own code (no C++ compiler run)."""
    built = []

    def inductor(traced, batch, cache, key, label):
        built.append(key)
        return traced.gm, "compiled"

    monkeypatch.setattr(engine_compile, "_inductor", inductor)
    monkeypatch.setattr(engine_compile, "_inductor_missing", lambda device: "")
    return built


@pytest.mark.parametrize("steps, saved, expect", [
    (20, False, PayoffGate),  # a short run, nothing saved: fx first, no build
    (20, True, TierTrial),  # inductor's build is saved: loading costs nothing, the trial as before
    (None, False, TierTrial),  # length unknown (compile-only, a loop without a count): as before
])
def test_compiled_step_builds_inductor_up_front_only_when_saved_or_of_unknown_length(
        steps, saved, expect, fake_inductor, monkeypatch, tmp_path):
    monkeypatch.setattr(CompileCache, "inductor_saved", lambda self, key, device: saved)
    ref_model, ref_step = make_sgd_step()
    model, step = make_sgd_step()
    compiled = CompiledStep(step, EngineOptions(compile_tier="auto", compile_dir=str(tmp_path)))
    compiled.steps_left = (lambda: steps) if steps else None
    for x in batches(20):
        assert torch.equal(compiled(x), ref_step(x))  # every executable here is the graph's own code
    executable = built(compiled)[1]
    assert type(executable) is expect
    assert len(fake_inductor) == (0 if expect is PayoffGate else 1)
    if expect is PayoffGate:
        assert executable.choice == "fx"
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref_model.parameters()))


def test_a_run_shorter_than_the_timing_is_fx_at_once(fake_inductor, caplog, tmp_path):
    _, step = make_sgd_step()
    compiled = CompiledStep(step, EngineOptions(compile_tier="auto", compile_dir=str(tmp_path)))
    compiled.steps_left = lambda: 4
    with caplog.at_level(logging.INFO, logger="cs_run"):
        [compiled(x) for x in batches(4)]
    assert fake_inductor == [] and built(compiled)[1] is not None
    assert "step runs on tier fx (4 steps left: too few to time" in caplog.text


def test_a_data_executor_loop_says_how_many_steps_are_left(fake_inductor, monkeypatch, tmp_path, caplog):
    import cs_run as cstorch

    monkeypatch.setattr(engine_compile, "DEFAULT_TIER", "auto")
    cstorch.backend("CSX", compile_dir=str(tmp_path / "cc"))
    _, step = make_sgd_step()
    traced = cstorch.trace(step)
    data = batches(30)
    executor = cstorch.utils.data.DataExecutor(data, num_steps=30)
    with caplog.at_level(logging.INFO, logger="cs_run"):
        for x in executor:
            traced(x)
    assert fake_inductor == []
    assert "step runs on tier fx (24 steps left x" in caplog.text
