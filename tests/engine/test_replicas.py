"""Data-parallel replicas on CSX: the gradient all-reduce inside the traced step (replica_sync.py).

Two spawned processes on gloo (``replica_worker.py``) train a tiny model with the CSX engine, with torch
DDP and (ordinal 0) as one process on the whole batch. docs/architecture.md#replicas-on-csx.

Tolerances: 2 replicas x batch B/2 and 1 replica x batch B compute the same mean gradient with a
different summation order (each replica sums its half, then the halves are averaged, instead of one
sum over B), so float32 results differ in the last bits (~1e-7 relative per step); over 50 SGD steps
with momentum these stay below 1e-5 relative. Against DDP (same sharding) only the placement of the
division differs (DDP divides each backward's gradients, the engine the accumulated ones): the same
tolerance holds.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
from pathlib import Path

import pytest
import torch

from cs_run.engine import CompiledStep, EngineOptions
from cs_run.engine.cache import graph_key
from cs_run.engine.trial import TierTrial
from cs_run.parallel.strategy import ReplicaGroup
from tests.engine import replica_worker
from tests.engine.helpers import built

WORLD = 2
TIMEOUT_S = 300  # hard limit of one spawn (both processes): a hang guard; inductor builds take ~100 s on a busy 2-core box
RTOL, ATOL = 1e-5, 1e-6


def spawn(tmp: Path, scenarios: list[str]) -> dict[str, list[dict]]:
    """Runs ``scenarios`` in WORLD fresh processes; kills them all at TIMEOUT_S. Returns results per rank."""
    ctx = multiprocessing.get_context("spawn")
    init = tmp / "init"
    procs = [ctx.Process(target=replica_worker.main, args=(r, WORLD, str(init), str(tmp), scenarios), daemon=True)
             for r in range(WORLD)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + TIMEOUT_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [i for i, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    errors = "\n".join(f.read_text() for f in sorted(tmp.glob("error.*.txt")))
    assert not hung, f"replicas {hung} still running after {TIMEOUT_S}s\n{errors}"
    assert all(p.exitcode == 0 for p in procs), f"exit codes {[p.exitcode for p in procs]}\n{errors}"
    return {s: [torch.load(tmp / f"{s}.{r}.pt", weights_only=False) for r in range(WORLD)] for s in scenarios}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, list[dict]]:
    return spawn(tmp_path_factory.mktemp("replicas"), ["fx", "bn", "agree"])


def assert_close(a: dict, b: dict, rtol: float = RTOL, atol: float = ATOL) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=lambda m, k=k: f"{k}: {m}")


def assert_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_two_replicas_half_batch_match_one_replica_whole_batch_after_50_steps(results):
    """Must show: 2 replicas x B/2 == 1 replica x B (grad accumulation 2, grad scaler, norm clipping)."""
    r0, r1 = results["fx"]
    assert_equal(r0["csx"], r1["csx"])  # the replicas never drift apart (bitwise)
    assert_close(r0["csx"], r0["single"])
    # the weights really moved (the comparison is not of two barely trained models) and learned
    moved = min((r0["csx"][k] - r0["init"][k]).abs().max().item() for k in r0["csx"])
    assert moved > 1e3 * ATOL
    assert r0["csx_losses"][-10:].mean() < 0.7 * r0["csx_losses"][:10].mean()


def test_traced_all_reduce_matches_ddp(results):
    for r in range(WORLD):
        assert_close(results["fx"][r]["csx"], results["fx"][r]["ddp"])


def test_the_step_reduces_once_per_step_inside_the_graph(results):
    """Grad accumulation over 2 micro-batches: one all-reduce (one bucket), not one per backward."""
    r0 = results["fx"][0]
    assert r0["all_reduce"] == 1
    assert r0["broadcast"] == 0  # no model buffers; the grad scaler's state needs no broadcast
    assert r0["replicas"] == ReplicaGroup(WORLD, "gloo", r0["replicas"].group_name)


def test_batchnorm_buffers_are_ordinal_0s_on_every_replica(results):
    r0, r1 = results["bn"]
    assert r0["broadcast"] >= 1
    assert_equal(r0["csx"], r1["csx"])  # parameters and running statistics
    assert_close(r0["csx"], r0["ddp"])  # DDP broadcasts ordinal 0's buffers: ordinal 0 keeps its own chain
    assert not torch.equal(r0["csx"]["bn.running_mean"], torch.zeros(16))


def test_replicas_agree_on_build_failures_tiers_and_the_trial_choice(results):
    for r in results["agree"]:
        assert r["first_failure"] == "on ordinal 1: boom"
        assert r["no_failure"] == ""
        assert r["common_tier"] == "fx"
        assert r["same_tier"] == "inductor"
        assert r["choice"] == "fx"


@pytest.mark.sweep  # make test keeps the end-to-end 2-replica inductor run (tests/replicas/test_csx_replicas.py)
def test_inductor_tier_all_reduce(tmp_path):
    r0, r1 = spawn(tmp_path, ["inductor"])["inductor"]
    assert r0["all_reduce"] == 1
    assert r0["executable"] == r1["executable"] == "AOTStep"  # the all-reduce runs inside the CPU library
    assert_equal(r0["csx"], r1["csx"])
    assert_close(r0["csx"], r0["single"])
    assert_close(r0["csx"], r0["ddp"])


def test_replica_count_is_part_of_the_cache_key():
    model = torch.nn.Linear(3, 2)

    def step(x):
        return model(x).sum()

    compiled = CompiledStep(step, EngineOptions(compile_tier="fx"))
    compiled(torch.ones(2, 3))
    traced = built(compiled)[0]
    assert traced.replicas is None
    batch = [torch.ones(2, 3)]
    keys = {graph_key(dataclasses.replace(traced, replicas=r), batch, "fx")
            for r in (None, ReplicaGroup(2, "gloo", "0"), ReplicaGroup(4, "gloo", "0"),
                      ReplicaGroup(2, "nccl", "0"))}
    assert len(keys) == 4


class Clock:
    """A fake clock that each scripted step advances by its own seconds (plus a per-replica skew)."""

    def __init__(self, skew: float) -> None:
        self.now, self.skew = 0.0, skew

    def __call__(self) -> float:
        return self.now

    def step(self, name: str, seconds: float):
        def run():
            self.now += seconds + self.skew
            return name
        return run


def test_trial_with_replicas_ends_at_a_step_count_and_runs_ordinal_0s_choice():
    """The replicas' trials must switch at the same step to the same tier, whatever their clocks say."""
    for skew in (0.0, 10.0):  # a replica whose steps look 10 s slower still ends the trial at the same step
        agreed: list[str] = []

        def agree(mine, agreed=agreed):
            agreed.append(mine)
            return "fx"

        clock = Clock(skew)
        trial = TierTrial({"fx": clock.step("fx", 2.0), "inductor": clock.step("inductor", 1.0)}, clock=clock,
                          min_samples=2, min_seconds=0.0, max_samples=4, agree=agree)
        ran = [trial() for _ in range(14)]
        # 1 warm-up + 4 timed steps each, alternating; then ordinal 0's choice only
        assert ran[:10] == ["fx", "inductor"] * 5
        assert ran[10:] == ["fx"] * 4
        assert agreed == ["inductor"] and trial.choice == "fx"
        assert "ordinal 0" in trial.reason
