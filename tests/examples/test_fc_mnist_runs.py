"""fc_mnist end to end through the runners: resume exactness, CSX == CPU, bf16, plots of a real run."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from cs_run.frontends.cli import cli, default_params_path
from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner


def run_fc_mnist(model_dir, mode="train", device="CPU", **overrides):
    params = load_params(default_params_path(), {"runconfig.model_dir": str(model_dir),
                                                 "runconfig.disable_progress_bar": True, **overrides})
    runner = PyTorchBaseRunner.create(params, device=device)
    return runner, runner.run(mode)


def assert_same_weights(a, b):
    for key, value in a.model.state_dict().items():
        torch.testing.assert_close(b.model.state_dict()[key], value, rtol=0, atol=0)


def test_resume_n_plus_m_equals_uninterrupted(tmp_path):
    # 30 + 40 steps cross an epoch boundary (23 steps per epoch) with shuffling and dropout on.
    whole, _ = run_fc_mnist(tmp_path / "whole", **{"runconfig.max_steps": 70})
    run_fc_mnist(tmp_path / "split", **{"runconfig.max_steps": 30})
    resumed, _ = run_fc_mnist(tmp_path / "split", **{"runconfig.max_steps": 70})
    assert resumed.global_step == 70
    assert_same_weights(whole, resumed)


def test_csx_and_cpu_reach_the_same_parameters_after_200_steps(tmp_path, caplog):
    # The fx tier replays the very aten ops eager runs, in the same order, with the same RNG draws
    # (dropout): bit-identical, not just close.
    cpu, _ = run_fc_mnist(tmp_path / "cpu", **{"runconfig.max_steps": 200})
    with caplog.at_level("INFO", logger="cs_run"):
        csx, _ = run_fc_mnist(tmp_path / "csx", device="CSX", **{"runconfig.max_steps": 200,
                                                                  "runconfig.compile_tier": "fx"})
    assert_same_weights(cpu, csx)
    log = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("traced ") for m in log) == 1
    assert sum(m.startswith("compile cache ") for m in log) == 1
    assert any(m.startswith("| Train Device=CSX, Step=200") and "samples/sec" in m for m in log)


def test_bf16_mixed_precision_trains_to_90_percent(tmp_path, caplog):
    with caplog.at_level("INFO", logger="cs_run"):
        _, results = run_fc_mnist(tmp_path / "bf16", "train_and_eval", **{"model.mixed_precision": True,
                                                                          "model.use_bfloat16": True})
    assert any("Mixed precision: torch.bfloat16 autocast on cpu" in r.getMessage() for r in caplog.records)
    assert results["eval/accuracy"] >= 0.90


def test_plot_of_a_real_run(tmp_path):
    pytest.importorskip("matplotlib")
    md = tmp_path / "md"
    run_fc_mnist(md, "train_and_eval", **{"runconfig.max_steps": 100, "runconfig.log_steps": 10})
    result = CliRunner().invoke(cli, ["plot", str(md), "-o", str(tmp_path / "curves.png"), "--tags", "loss,lr"])
    assert result.exit_code == 0, result.output
    png = (tmp_path / "curves.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000


def test_a_finished_run_leaves_no_loader_workers_behind(tmp_path):
    """persistent_workers keeps a DataLoader's worker processes between passes; when the run ends they end,
    although the runner (and its loaders) are still referenced, as in a notebook, and a second run on the same
    runner starts its own."""
    import multiprocessing

    workers = {f"{split}.{key}": value for split in ("train_input", "eval_input")
               for key, value in (("num_workers", 2), ("persistent_workers", True))}
    before = set(multiprocessing.active_children())
    runner, results = run_fc_mnist(tmp_path / "md", mode="train_and_eval", **workers,
                                   **{"runconfig.max_steps": 3, "runconfig.eval_steps": 2})
    assert results["eval/loss"] > 0 and runner.global_step == 3
    assert set(multiprocessing.active_children()) <= before
    runner.params.runconfig.max_steps = 5
    runner.run("train")
    assert runner.global_step == 5 and set(multiprocessing.active_children()) <= before
