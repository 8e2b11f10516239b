"""Throughput leaves out compile time (trace, compile, CUDA-graph capture): the RateMeter rule, and the
runner's log line and scalars on CSX."""

from __future__ import annotations

import logging
import re
import time

import pytest
import torch

import cs_run.engine.step as engine_step
from cs_run import batches
from cs_run.batches import RateMeter, compile_seconds, compile_time
from cs_run.engine.cudagraph import GraphedStep
from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner
from cs_run.summaries import read_scalars


class FakeClock:
    """A perf_counter the test moves: real time plus ``offset``."""

    def __init__(self):
        self.offset = 0.0

    def perf_counter(self):
        return time.perf_counter() + self.offset


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(batches, "time", fake)
    monkeypatch.setitem(batches._compile, "seconds", 0.0)
    return fake


def test_rate_meter_leaves_out_compile_time_nested_once(clock, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(clock, "perf_counter", lambda: now[0])
    meter = RateMeter(window=2)
    meter.start()
    with compile_time():
        now[0] += 50  # the first step traces and compiles ...
    now[0] += 1  # ... then runs
    meter.tick(10)
    now[0] += 1
    meter.tick(10)
    with compile_time(), compile_time():  # a recompile; nested blocks count once
        now[0] += 5
    now[0] += 2
    meter.tick(10)
    assert meter.compile_time == 55
    assert meter.total_time == 4 and meter.global_rate == 30 / 4
    assert meter.rate == 20 / 3  # the last two steps: 3 s of running
    meter.finish()
    assert meter.total_time == 4


def train(project, model_dir, device):
    params = load_params(project, {"runconfig.model_dir": str(model_dir), "runconfig.max_steps": 12,
                                   "runconfig.log_steps": 4})
    PyTorchBaseRunner.create(params, device=device).run("train")
    return read_scalars(model_dir / "train")


def test_csx_rates_leave_out_a_slow_compile_which_is_reported_once(toy_project, tmp_path, clock, monkeypatch,
                                                                   caplog):
    real = engine_step.compile_graph

    def slow_compile(*args, **kwargs):  # a 1000 s compile, on the clock the rates read
        clock.offset += 1000.0
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_step, "compile_graph", slow_compile)
    with caplog.at_level(logging.INFO, logger="cs_run"):
        scalars = train(toy_project, tmp_path / "csx", "CSX")
    lines = [r.getMessage() for r in caplog.records]
    reported = [x for x in lines if x.startswith("Compile time")]
    assert len(reported) == 1
    seconds = float(re.match(r"Compile time ([\d.]+) s", reported[0]).group(1))
    assert 1000 <= seconds < 1100
    assert scalars["compile_seconds"] == [(4, pytest.approx(seconds, abs=0.01))]
    # With the compile counted, 4 steps of 4 samples would show at most 16 / 1000 samples/s.
    for step, rate in scalars["global_samples_per_sec"] + scalars["samples_per_sec"]:
        assert rate > 1, (step, rate)
    logged = [float(m.group(1)) for x in lines if (m := re.search(r"GlobalRate=([\d.]+)", x))]
    assert len(logged) == 3 and min(logged) > 1
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cs_run"):
        cpu = train(toy_project, tmp_path / "cpu", "CPU")  # eager: nothing compiled, nothing reported
    assert "compile_seconds" not in cpu and not any(r.getMessage().startswith("Compile time") for r in caplog.records)


def test_a_cuda_graph_capture_counts_as_compile_time(clock):
    def capture(fn):  # an injected capture (CPU): 30 s on the rates' clock
        clock.offset += 30.0
        outputs = fn()
        return (lambda: None), outputs

    step = GraphedStep(lambda state, x: [state + x], num_state=1, capture=capture)
    state, x = torch.ones(2), torch.full((2,), 2.0)
    assert compile_seconds() == 0
    step(state, x)  # the first call runs as is
    assert compile_seconds() == 0
    step(state, x)  # the second captures
    assert 30 <= compile_seconds() < 31
