"""The CSX runners against the eager runner: same weights, same hooks, compile once, compile cache."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cs_run.errors import ParamsError
from cs_run.frontends.cli import cli
from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner, PyTorchCSCompiler, PyTorchCSRunner, PyTorchRunner


def make_runner(params_path, device, runner=None, **overrides):
    params = load_params(params_path, overrides)
    return PyTorchBaseRunner.create(params, device=device, runner=runner)


def weights(runner):
    return {k: v.detach().clone() for k, v in runner.model.state_dict().items()}


def test_create_picks_runner_by_device_and_mode(toy_project, tmp_path):
    md = str(tmp_path / "md")
    assert type(make_runner(toy_project, "CPU", **{"runconfig.model_dir": md})) is PyTorchRunner
    assert type(make_runner(toy_project, "CSX", **{"runconfig.model_dir": md})) is PyTorchCSRunner
    assert type(make_runner(toy_project, "CSX", **{"runconfig.model_dir": md,
                                                   "runconfig.validate_only": True})) is PyTorchCSCompiler
    with pytest.raises(ParamsError, match="must be a subclass of cs_run.runners.PyTorchCSRunner for --device CSX"):
        make_runner(toy_project, "CSX", runner="toy_models:RecordingRunner", **{"runconfig.model_dir": md})
    with pytest.raises(ParamsError, match="need --device CSX"):
        make_runner(toy_project, "CPU", **{"runconfig.model_dir": md, "runconfig.compile_only": True})


def test_csx_equals_cpu_bit_for_bit_and_traces_once(toy_project, tmp_path):
    # Dropout, shuffling and an epoch boundary (16 steps per epoch): the replayed graph draws the same
    # random numbers in the same order as eager, so the results are bit-identical (the fx tier runs the
    # captured aten ops themselves).
    steps = {"runconfig.max_steps": 40}
    cpu = make_runner(toy_project, "CPU", **{"runconfig.model_dir": str(tmp_path / "cpu"), **steps})
    cpu.run("train")
    csx = make_runner(toy_project, "CSX", **{"runconfig.model_dir": str(tmp_path / "csx"), **steps})
    csx.run("train")
    for key, value in weights(cpu).items():
        torch.testing.assert_close(weights(csx)[key], value, rtol=0, atol=0)
    compiled = csx._cs_train_step
    assert compiled.num_traces == 1 and compiled.recompiles == 0
    for idx, state in cpu.optimizer.state_dict()["state"].items():
        torch.testing.assert_close(csx.optimizer.state_dict()["state"][idx]["momentum_buffer"],
                                   state["momentum_buffer"], rtol=0, atol=0)


def test_csx_resume_matches_uninterrupted(toy_project, tmp_path):
    whole = make_runner(toy_project, "CSX", **{"runconfig.model_dir": str(tmp_path / "whole"),
                                               "runconfig.max_steps": 23})
    whole.run("train")
    expected = weights(whole)
    for max_steps in (7, 23):
        split = make_runner(toy_project, "CSX", **{"runconfig.model_dir": str(tmp_path / "split"),
                                                   "runconfig.max_steps": max_steps})
        split.run("train")
    for key, value in expected.items():
        torch.testing.assert_close(weights(split)[key], value, rtol=0, atol=0)


def test_same_hook_order_on_cpu_and_csx(toy_project, tmp_path):
    module = importlib.import_module("toy_models")
    orders = {}
    for device, runner in (("CPU", "toy_models:RecordingRunner"), ("CSX", "toy_models:RecordingCSRunner")):
        module.CALLS.clear()
        make_runner(toy_project, device, runner=runner,
                    **{"runconfig.model_dir": str(tmp_path / device), "runconfig.max_steps": 18}).run("train_and_eval")
        orders[device] = list(module.CALLS)
    assert orders["CPU"] == orders["CSX"]
    assert orders["CSX"][:3] == ["on_train_start", "on_train_epoch_start", "on_train_batch_start"]


@pytest.mark.parametrize("device", ["CSX", "GPU's rule"])
def test_a_deferred_nan_check_stops_at_next_log_step_naming_first_bad_step(toy_project, tmp_path, monkeypatch, device):
    # Sample 44 -> batch 12 (no shuffle). The device-side check is read at step 15 (log step), before
    # any checkpoint of the bad weights; the step-10 checkpoint is kept. The eager runner defers the same
    # way on a GPU (a loss read per step would sync the host with every step); here on the CPU with that
    # rule forced, as a GPU run decides it (tests/engine/test_cuda.py runs it on a real GPU).
    if device != "CSX":
        from cs_run.runners import PyTorchRunner
        monkeypatch.setattr(PyTorchRunner, "_defers_loss_check", True)
    md = tmp_path / "md"
    runner = make_runner(toy_project, "CSX" if device == "CSX" else "CPU",
                         **{"runconfig.model_dir": str(md), "train_input.nan_at": 44, "train_input.shuffle": False})
    with pytest.raises(Exception, match=r"loss is nan at step 12; training stopped and the newest checkpoint "
                                        r"with finite weights is .*checkpoint_10.mdl"):
        runner.run("train")
    assert runner.global_step == 15
    assert sorted(p.name for p in md.glob("checkpoint_*")) == ["checkpoint_10.mdl"]


def invoke(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def test_validate_only_names_the_offending_line(toy_project, tmp_path):
    source = (tmp_path / "toy_models.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "COMPLIANCE-LINE" in text)
    params = toy_project.read_text().replace('name: "toy_models:build_model"', 'name: "toy_models:build_branchy_model"')
    params = params.replace("  hidden: 8\n", "").replace("  dropout: 0.1\n", "")
    toy_project.write_text(params)
    result = invoke("validate-only", "--params", toy_project, "--model_dir", tmp_path / "md")
    assert result.exit_code == 1, result.output
    assert f"toy_models.py:{line}" in result.output and "step closure" in result.output
    assert "Traceback" not in result.output


def test_validate_only_then_compile_only_then_cache_hit(toy_project, tmp_path):
    md = tmp_path / "md"
    ok = invoke("validate-only", "--params", toy_project, "--model_dir", md)
    assert ok.exit_code == 0, ok.output
    assert "graph:" in ok.output and "parameter elements" in ok.output
    assert not list(md.glob("checkpoint_*")) and not os.listdir(os.environ["CS_RUN_CACHE_DIR"])
    assert ok.output.count("graph:") == 1  # the summary once: the engine's "traced" line
    compiled = invoke("compile-only", "--params", toy_project, "--model_dir", md)
    assert compiled.exit_code == 0, compiled.output
    assert "compile cache miss" in compiled.output
    trained = invoke("train", "--device", "CSX", "--params", toy_project, "--model_dir", md, "--max_steps", 3)
    assert trained.exit_code == 0, trained.output
    assert "compile cache hit" in trained.output and "| Train Device=CSX, Step=3" in trained.output


def test_appliance_flags_are_recorded_and_logged(toy_project, tmp_path):
    md = tmp_path / "md"
    result = invoke("train", "--device", "CSX", "--params", toy_project, "--model_dir", md, "--max_steps", 2,
                    "--max_wgt_servers", 2, "--mount_dirs", tmp_path, "--job_labels", "team=ml", "--python_paths", tmp_path)
    assert result.exit_code == 0, result.output
    assert "runconfig.max_wgt_servers=2 is recorded in the resolved params but has no effect" in result.output
    resolved = (md / "params_resolved.yaml").read_text()
    assert "max_wgt_servers: 2" in resolved and "team=ml" in resolved
    bad = invoke("train", "--device", "CSX", "--params", toy_project, "--model_dir", md, "--job_labels", "nolabel")
    assert bad.exit_code == 2 and "runconfig.job_labels: expected 'key=value'" in bad.output


@pytest.mark.parametrize("command, key", [("validate-only", "validate_only"), ("compile-only", "compile_only")])
def test_trace_only_commands_work_with_a_user_csx_runner_subclass(toy_project, tmp_path, command, key):
    # validate-only / compile-only are a mode of PyTorchCSRunner, so the user's subclass serves them too.
    md = tmp_path / "md"
    result = invoke(command, "--params", toy_project, "--model_dir", md, "--runner", "toy_models:RecordingCSRunner")
    assert result.exit_code == 0, result.output
    assert "graph:" in result.output and "parameter elements" in result.output
    assert not list(md.glob("checkpoint_*"))
    assert bool(os.listdir(os.environ["CS_RUN_CACHE_DIR"])) == (command == "compile-only")  # the per-user cache
    assert result.output.count("graph:") == 1  # the summary once, not also in the runner's line and on stdout
    runner = make_runner(toy_project, "CSX", runner="toy_models:RecordingCSRunner",
                         **{"runconfig.model_dir": str(tmp_path / "api"), f"runconfig.{key}": True})
    module = importlib.import_module("toy_models")
    module.CALLS.clear()
    before = weights(runner)
    assert type(runner).__name__ == "RecordingCSRunner" and runner.trace_only
    results = runner.run("eval")
    assert results["graph"].num_ops > 0 and module.CALLS == []  # traced, nothing ran: no hook, same weights
    for name, value in weights(runner).items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)


def test_a_second_model_dir_with_the_same_graph_hits_the_shared_cache(toy_project, tmp_path):
    """The default compile cache is the user's (CS_RUN_CACHE_DIR here), not model_dir's: a new run folder
    finds the graph an earlier folder's run compiled."""
    runs = [invoke("train", "--device", "CSX", "--params", toy_project, "--model_dir", tmp_path / md, "--max_steps", 3)
            for md in ("first", "second")]
    assert all(r.exit_code == 0 for r in runs), [r.output for r in runs]
    assert "compile cache miss" in runs[0].output and "compile cache hit" not in runs[0].output
    assert "compile cache hit" in runs[1].output and "compile cache miss" not in runs[1].output
    assert not [p for p in tmp_path.rglob("*") if p.name in ("cached_compile", "cs_run_cache", "artifacts")]
    assert (Path(os.environ["CS_RUN_CACHE_DIR"]) / "cs_run_cache").is_dir()


@pytest.mark.slow
def test_a_second_model_dir_compiles_nothing(toy_project, tmp_path):
    """One inductor build (compile-only in one folder); a default-tier run in another folder loads it: no
    compile (counted by the engine, not read from logs), and tier auto keeps its trial since loading is free."""
    from cs_run.engine import compile as engine_compile

    if engine_compile.resolve_tier("auto", torch.device("cpu")) != "auto":
        pytest.skip("no C++ compiler: inductor cannot build here")
    counts = engine_compile.COUNTS
    before = dict(counts)
    built = invoke("compile-only", "--params", toy_project, "--model_dir", tmp_path / "a", "--compile_tier", "inductor")
    assert built.exit_code == 0, built.output
    assert counts["inductor_compile"] == before.get("inductor_compile", 0) + 1
    before = dict(counts)
    trained = invoke("train", "--device", "CSX", "--params", toy_project, "--model_dir", tmp_path / "b",
                     "--compile_tier", "auto", "--max_steps", 8)
    assert trained.exit_code == 0, trained.output
    assert counts["inductor_compile"] == before.get("inductor_compile", 0)  # nothing compiled
    assert counts["inductor_load"] == before.get("inductor_load", 0) + 1
    assert "tier inductor, loaded" in trained.output and "runs on tier fx (" not in trained.output


def test_a_short_run_on_the_default_tier_compiles_no_inductor(toy_project, tmp_path):
    """20 train steps and a 4-batch evaluation cannot win back an inductor build: both steps run on fx,
    each saying why in one line, and nothing is built (the engine's count)."""
    from cs_run.engine import compile as engine_compile

    before = dict(engine_compile.COUNTS)
    result = invoke("train-and-eval", "--device", "CSX", "--params", toy_project, "--model_dir", tmp_path / "md",
                    "--compile_tier", "auto", "--max_steps", 20)
    assert result.exit_code == 0, result.output
    assert dict(engine_compile.COUNTS) == before
    if engine_compile.resolve_tier("auto", torch.device("cpu")) == "auto":  # else fx for want of a compiler
        lines = [line for line in result.output.splitlines() if "compile_tier auto:" in line]
        assert len(lines) == 2, lines
        assert "csx_train_step runs on tier fx (14 steps left x " in lines[0] and "compiling inductor takes ~" in lines[0]
        assert "csx_eval_step runs on tier fx (4 steps left: too few to time" in lines[1]
