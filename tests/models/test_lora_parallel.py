"""LoRA (``model.lora_params``) on 2 replicas (gloo, CPU), sharded (``--sharding fsdp``, FSDP2) and data-parallel:
only the adapters train (the base weights end bit-identical to the start), the losses and weights are one
process's LoRA run's (tolerance of fsdp_helpers: the same sums in another order), the checkpoint carries the
adapters under the vendor's names (``<layer>.lora_A`` / ``.lora_B``) and resumes, and ``convert --to hf`` of
it folds them. CSX fx against CPU, bit for bit, is tests/models/test_lora.py's."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))
from fsdp_helpers import MODEL, assert_same_losses, assert_same_weights, launch, losses, tensors, train_here  # noqa: E402
from fsdp_helpers import write_params as _write_params  # noqa: E402

import cs_run as cstorch  # noqa: E402
from cs_run.frontends.checkpoint_cli import checkpoint as checkpoint_cli  # noqa: E402
from cs_run.models.common.lora import LORA_SUFFIXES  # noqa: E402

LORA = {"r": 4, "alpha": 8, "target_modules": ["TransformerDecoderLayer", "Linear"]}  # every Linear of the blocks


def write_params(path: Path, **runconfig) -> Path:
    """fsdp_helpers' Llama-style file with LoRA adapters on every Linear of the decoder blocks."""
    path = _write_params(path, **runconfig)
    import yaml  # noqa: PLC0415

    params = yaml.safe_load(path.read_text())
    params["model"] = {**MODEL, "lora_params": LORA}
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """One process's LoRA run: the reference, with its start saved (checkpoint_0)."""
    root = tmp_path_factory.mktemp("one")
    train_here(write_params(root / "params.yaml", checkpoint_steps=15, save_initial_checkpoint=True), root / "md")
    return root


def _folded(checkpoint: Path, out: Path) -> dict:
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--to", "hf", str(checkpoint), str(out)])
    assert result.exit_code == 0, result.output
    from safetensors.torch import load_file  # noqa: PLC0415

    return {k: v for f in sorted(out.glob("*.safetensors")) for k, v in load_file(f).items()}


# a 2-replica launch, a resumed run and 3 conversions: ~11 s (fsdp) and ~9 s (none) on 2 cores, the reference ~2 s
@pytest.mark.parametrize("sharding", ["fsdp", "none"])
def test_lora_on_two_replicas_trains_only_the_adapters_like_one_process_and_resumes_and_folds(one, tmp_path, sharding):
    params = write_params(tmp_path / "params.yaml", checkpoint_steps=15, save_initial_checkpoint=True)
    launch(params, tmp_path / "md", "--num_csx", 2, "--sharding", sharding)
    assert_same_losses(one / "md", tmp_path / "md")
    assert_same_weights(one / "md" / "checkpoint_30.mdl", tmp_path / "md" / "checkpoint_30.mdl")
    start, end = (cstorch.load(tmp_path / "md" / f"checkpoint_{s}.mdl")["model"] for s in (0, 30))
    adapters = [k for k in end if k.endswith(LORA_SUFFIXES)]
    assert len(adapters) == 2 * 7 * 2, adapters  # 2 blocks x 7 Linears (q, k, v, output, 3 of the FFN) x (A, B)
    for key, value in end.items():
        if key.endswith(".lora_B"):
            assert value.abs().sum() > 0, f"{key} starts at zero and should have trained"
        elif not key.endswith(".lora_A"):
            assert (value == start[key]).all(), f"{key} is frozen but changed"
    # Only the adapters have optimizer state: the optimizer is given the trainable parameters, as the vendor's.
    assert len(cstorch.load(tmp_path / "md" / "checkpoint_30.mdl")["optimizer"]["state"]) == len(adapters)
    # Resume from the replicas' step-15 checkpoint in one process: the same last 15 steps.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    saved = tmp_path / "md" / "checkpoint_15.mdl"  # fsdp: a folder of 2 shards; data-parallel: one file
    assert saved.is_dir() is (sharding == "fsdp")
    (shutil.copytree if saved.is_dir() else shutil.copy)(saved, resumed / "checkpoint_15.mdl")
    train_here(params, resumed)
    assert len(losses(resumed)) == 15
    assert_same_weights(one / "md" / "checkpoint_30.mdl", resumed / "checkpoint_30.mdl")
    assert tensors(one / "md" / "checkpoint_30.mdl").keys() == tensors(resumed / "checkpoint_30.mdl").keys()
    # --to hf folds the adapters: no LoRA names, and the one process's folded tensors.
    theirs = _folded(tmp_path / "md" / "checkpoint_30.mdl", tmp_path / "hf")
    ours = _folded(one / "md" / "checkpoint_30.mdl", tmp_path / "hf_one")
    base = _folded(tmp_path / "md" / "checkpoint_0.mdl", tmp_path / "hf_base")  # B = 0: the base weights
    assert theirs.keys() == ours.keys() == base.keys() and not [k for k in theirs if "lora" in k]
    folded = [k for k in ours if not torch.equal(theirs[k], base[k])]
    assert len(folded) == 2 * 7, folded  # every adapted Linear's weight got its B @ A * alpha / r
    for key in ours:
        torch.testing.assert_close(theirs[key], ours[key], atol=2e-6, rtol=1e-5, msg=key)
