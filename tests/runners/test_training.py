"""The eager runner against plain PyTorch: same losses and weights, exact resume, accumulation, clipping."""

from __future__ import annotations

import importlib

import pytest
import torch

import cs_run.optim as csoptim
from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner
from cs_run.runners._checkpoint_files import list_checkpoints


def make_runner(params_path, **overrides):
    params = load_params(params_path, overrides)
    return PyTorchBaseRunner.create(params, device="CPU")


def weights(runner):
    return {k: v.clone() for k, v in runner.model.state_dict().items()}


def plain_pytorch_run(steps, *, seed=3, lr=0.1, momentum=0.9, dropout=0.1, batch_size=4, accum=1, clip=None):
    """The reference: the loop a user would write by hand, with the optimizer the runner builds.

    cs_run.optim.SGD applies the vendor's ``p += -lr * g`` (the product rounded first), which torch.optim.SGD
    fuses into one rounding: the two differ by float32 ulps, so the hand loop uses cs-run's SGD to keep
    this test about the runner (tests/optim compares the optimizers with torch.optim and the vendor)."""
    toy = importlib.import_module("toy_models")
    torch.manual_seed(seed)
    model = toy.build_model(hidden=8, dropout=dropout)
    optimizer = csoptim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loader = toy.build_data("train", batch_size=batch_size, shuffle=True, num_samples=64)
    losses, it = [], iter(loader)
    for _ in range(steps):
        total = 0.0
        for _ in range(accum):
            try:
                batch = next(it)
            except StopIteration:
                it = iter(loader)
                batch = next(it)
            loss = model(batch)
            (loss / accum if accum > 1 else loss).backward()
            total += loss.item()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total / accum)
    return model.state_dict(), losses


def test_runner_matches_plain_pytorch_across_epochs(toy_project, tmp_path):
    # 20 steps cross an epoch boundary (16 per epoch), so the reshuffle is covered too.
    runner = make_runner(toy_project, **{"runconfig.model_dir": str(tmp_path / "md")})
    runner.run("train")
    expected, _ = plain_pytorch_run(20)
    for key, value in weights(runner).items():
        torch.testing.assert_close(value, expected[key], rtol=0, atol=0)  # same ops, same order: bit-exact


def test_grad_accumulation_and_clipping_match_hand_loop(toy_project, tmp_path):
    runner = make_runner(toy_project, **{"runconfig.model_dir": str(tmp_path / "md"), "runconfig.max_steps": 5,
                                         "optimizer.grad_accum_steps": 3, "optimizer.max_gradient_norm": 0.05})
    runner.run("train")
    expected, _ = plain_pytorch_run(5, accum=3, clip=0.05)  # 5 steps x 3 = 15 of 16 batches: one epoch
    for key, value in weights(runner).items():
        torch.testing.assert_close(value, expected[key], rtol=0, atol=0)


@pytest.mark.parametrize("stop, total", [(7, 23), (16, 20)])  # mid-epoch (7 of 16); exactly at an epoch end
def test_resume_n_plus_m_is_bit_identical_to_uninterrupted(toy_project, tmp_path, stop, total):
    # Shuffling and dropout are on: data order and RNG streams must resume exactly.
    whole = make_runner(toy_project, **{"runconfig.model_dir": str(tmp_path / "whole"), "runconfig.max_steps": total})
    whole.run("train")
    for max_steps in (stop, total):
        split = make_runner(toy_project, **{"runconfig.model_dir": str(tmp_path / "split"),
                                            "runconfig.max_steps": max_steps})
        split.run("train")
    assert split.global_step == total
    for key, value in weights(whole).items():
        torch.testing.assert_close(weights(split)[key], value, rtol=0, atol=0)
    whole_opt, split_opt = whole.optimizer.state_dict()["state"], split.optimizer.state_dict()["state"]
    for idx in whole_opt:
        for name, value in whole_opt[idx].items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(split_opt[idx][name], value, rtol=0, atol=0)


def test_same_seed_same_losses(toy_project, tmp_path, caplog):
    logs = []
    for name in ("a", "b"):
        caplog.clear()
        with caplog.at_level("INFO", logger="cs_run"):
            make_runner(toy_project, **{"runconfig.model_dir": str(tmp_path / name)}).run("train")
        logs.append([r.getMessage().split(", Rate=")[0] for r in caplog.records if "| Train" in r.getMessage()])
    assert logs[0] == logs[1] and len(logs[0]) == 4  # steps 5, 10, 15, 20


def test_log_line_has_model_zoo_form(toy_project, tmp_path, caplog):
    with caplog.at_level("INFO", logger="cs_run"):
        make_runner(toy_project, **{"runconfig.model_dir": str(tmp_path / "md"), "runconfig.max_steps": 5}).run("train")
    lines = [r.getMessage() for r in caplog.records if "| Train" in r.getMessage()]
    assert lines and lines[0].startswith("| Train Device=cpu, Step=5, Loss=")
    assert "samples/sec, GlobalRate=" in lines[0] and lines[0].endswith("samples/sec")


def test_max_checkpoints_keeps_newest(toy_project, tmp_path):
    md = tmp_path / "md"
    make_runner(toy_project, **{"runconfig.model_dir": str(md), "runconfig.checkpoint_steps": 4,
                                "runconfig.max_checkpoints": 2}).run("train")
    assert [step for step, _ in list_checkpoints(md)] == [16, 20]


def test_eval_and_eval_all_report_loss_per_checkpoint(toy_project, tmp_path):
    md = tmp_path / "md"
    runner = make_runner(toy_project, **{"runconfig.model_dir": str(md)})
    final = runner.run("train_and_eval")
    results = make_runner(toy_project, **{"runconfig.model_dir": str(md)}).run("eval_all")
    assert list(results) == ["10", "20"]
    assert results["20"]["eval/loss"] == pytest.approx(final["eval/loss"], rel=1e-6)
    assert results["10"]["eval/loss"] != results["20"]["eval/loss"]
    # The reference eval loss of the final weights, computed by hand.
    toy = importlib.import_module("toy_models")
    model = toy.build_model(hidden=8, dropout=0.1)
    model.load_state_dict(runner.model.state_dict())
    model.eval()
    with torch.no_grad():
        losses = [model(b) for b in toy.build_data("eval", batch_size=8, shuffle=False, num_samples=32)]
    assert final["eval/loss"] == pytest.approx(torch.stack(losses).mean().item(), rel=1e-6)


def test_summaries_record_loss_lr_rate_and_eval_metrics(toy_project, tmp_path, caplog):
    from cs_run.summaries import read_scalars

    md = tmp_path / "md"
    with caplog.at_level("INFO", logger="cs_run"):
        results = make_runner(toy_project, **{"runconfig.model_dir": str(md)}).run("train_and_eval")
    train = read_scalars(md / "train")
    assert [step for step, _ in train["loss"]] == [5, 10, 15, 20]
    logged = [float(r.getMessage().split("Loss=")[1].split(",")[0]) for r in caplog.records
              if "| Train" in r.getMessage()]
    assert [value for _, value in train["loss"]] == pytest.approx(logged, abs=1e-5)  # log prints 5 decimals
    assert train["lr"] == [(step, pytest.approx(0.1)) for step in (5, 10, 15, 20)]
    assert all(value > 0 for _, value in train["samples_per_sec"])
    assert read_scalars(md / "eval")["loss"] == [(20, pytest.approx(results["eval/loss"]))]


def test_custom_optimizer_by_name_in_params_file(toy_project, tmp_path):
    """The vendor's custom optimizer guide: a user's Optimizer subclass in the global scope works as optimizer_type."""
    text = toy_project.read_text().replace('optimizer_type: "SGD"', 'optimizer_type: "MyOptimizer"')
    toy_project.write_text(text.replace("momentum: 0.9", "decay: 0.9"))
    runner = make_runner(toy_project, **{"runconfig.model_dir": str(tmp_path / "md"), "runconfig.max_steps": 5})
    runner.run("train")
    assert type(runner.optimizer).__name__ == "MyOptimizer"
    expected, _ = plain_pytorch_run(5)  # MyOptimizer(decay) is heavy-ball SGD: the same update as torch's
    for key, value in weights(runner).items():
        torch.testing.assert_close(value, expected[key], rtol=1e-6, atol=1e-7)


def test_missing_section_for_the_mode_fails_before_any_work(toy_project, tmp_path):
    from cs_run.errors import ParamsError

    toy_project.write_text(toy_project.read_text().split("eval_input:")[0] + "model:" +
                           toy_project.read_text().split("model:", 1)[1])
    md = tmp_path / "md"
    runner = make_runner(toy_project, **{"runconfig.model_dir": str(md)})
    with pytest.raises(ParamsError, match="mode train_and_eval needs section\\(s\\) eval_input"):
        runner.run("train_and_eval")
    assert not md.exists()  # nothing trained, nothing written
