"""A checkpoint of model weights only (a converted Hugging Face model, a vendor model-only file) starts a
training run: the weights loaded, the optimizer, schedule and data position fresh at step 0, each absence
logged in the Model Zoo trainer's words. The reference is the same weights put into a fresh run by hand."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cs_run.checkpoint import load, save
from cs_run.checkpoint.convert import convert
from cs_run.frontends.cli import cli
from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner
from tests.examples.gpt2_helpers import OPTIMIZER, tiny_params, tiny_shards, train_losses, weights

VENDOR_LINES = ("optimizer state not found in the checkpoint. Using default preinitialized state.",
                "Scheduler state not found in the checkpoint. Using default initialized state.",
                "Dataloader state not found in the checkpoint. DataLoaders will yield samples from the beginning.")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("model_only_shards"))


def _params(tmp_path: Path, shards: Path, name: str, runconfig: dict) -> Path:
    return tiny_params(tmp_path / f"{name}.yaml", shards / "train", shards / "val", optimizer=OPTIMIZER,
                       model={"dropout_rate": 0.1},
                       runconfig={"model_dir": str(tmp_path / name), "max_steps": 10, "checkpoint_steps": 10,
                                  **runconfig})


def _start_weights(tmp_path: Path, shards: Path) -> dict[str, torch.Tensor]:
    """Weights unlike any seed's initialization: a built model's, each tensor moved by a fixed draw."""
    model = PyTorchBaseRunner.create(load_params(_params(tmp_path, shards, "init", {})), device="CPU").model
    gen = torch.Generator().manual_seed(5)
    return {k: v.detach() + 0.05 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}


@pytest.mark.parametrize(("device", "tier", "form"), [("CPU", None, "h5"), ("CSX", "fx", "h5"), ("CPU", None, "vendor")])
def test_a_model_only_checkpoint_trains_as_its_weights_loaded_by_hand(tmp_path, shards, caplog, device, tier, form):
    start = _start_weights(tmp_path, shards)
    path = tmp_path / "model_only.mdl"
    save({"model": start}, str(path))
    if form == "vendor":  # the vendor's format 0.5, as cerebras.pytorch writes a model-only file
        convert(str(path), str(tmp_path / "vendor.mdl"), "vendor")
        path = tmp_path / "vendor.mdl"
    extra = {"compile_tier": tier} if tier else {}
    caplog.set_level(logging.INFO, logger="cs_run.runners")
    from_file = PyTorchBaseRunner.create(load_params(_params(tmp_path, shards, "from_file",
                                                             {"checkpoint_path": str(path), **extra})), device=device)
    from_file.run("train")
    logged = [r.getMessage() for r in caplog.records]
    by_hand = PyTorchBaseRunner.create(load_params(_params(tmp_path, shards, "by_hand", extra)), device=device)
    with torch.no_grad():
        for key, value in by_hand.model.state_dict().items():
            value.copy_(start[key])
    by_hand.run("train")

    assert from_file.global_step == by_hand.global_step == 10
    assert train_losses(from_file) == train_losses(by_hand)
    expected = weights(by_hand)
    for key, value in weights(from_file).items():
        assert torch.equal(value, expected[key]), key
    saved = [load(str(tmp_path / name / "checkpoint_10.mdl")) for name in ("from_file", "by_hand")]
    for key, value in saved[1]["optimizer"]["state"].items():  # fresh Adam moments, the same 10 steps
        for name, tensor in value.items():
            assert torch.equal(saved[0]["optimizer"]["state"][key][name], tensor), (key, name)
    for line in VENDOR_LINES:
        assert line in logged, line
    assert f"Starting from the weights of {path} at global step 0 (no training state loaded)" in logged


def _train(params: Path, model_dir: Path, *extra: str):
    return CliRunner().invoke(cli, ["train", "--params", str(params), "--model_dir", str(model_dir), *extra])


@pytest.mark.parametrize(("states", "error"), [
    ("all", None),
    ("model", None),
    ("model,global_step", "Error: params: runconfig.load_checkpoint_states: global_step not in model_only.mdl, "
                          "which holds model"),
    ("model,optimizer", "Error: params: runconfig.load_checkpoint_states: optimizer not in model_only.mdl, "
                        "which holds model"),
])
def test_load_checkpoint_states_decides_what_a_model_only_start_loads(toy_project, tmp_path, states, error):
    assert _train(toy_project, tmp_path / "a", "--max_steps", "2").exit_code == 0
    path = tmp_path / "model_only.mdl"
    save({"model": load(str(tmp_path / "a" / "checkpoint_2.mdl"))["model"]}, str(path))
    result = _train(toy_project, tmp_path / "b", "--max_steps", "2", "--checkpoint_path", str(path),
                    "--set", f"runconfig.load_checkpoint_states={states}")
    if error is None:
        assert result.exit_code == 0, result.output
        assert int(load(str(tmp_path / "b" / "checkpoint_2.mdl"))["global_step"]) == 2  # two steps from step 0
    else:
        assert result.exit_code == 2, result.output
        assert error in result.output
        assert "Traceback" not in result.output
        assert not (tmp_path / "b").exists()  # refused before model_dir was made
