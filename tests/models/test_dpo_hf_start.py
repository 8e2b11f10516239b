"""A DPO run from a Hugging Face model folder: ``cs-run train --checkpoint_path HF_FOLDER`` with a dpo params file.

The folder (config.json and model.safetensors, written by transformers) is the initial policy, as the Model
Zoo's dpo converter makes a Hugging Face model's checkpoint (policy_model.* and ref_model.*, the same weights).
The references are independent of cs-run's run: ``cs-run checkpoint convert --from hf`` of the folder for the
weights, transformers' own forward for the log-probs, and trl's DPOTrainer loss on them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from cs_run.checkpoint import load
from cs_run.frontends.cli import cli
from cs_run.summaries import read_scalars

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dpo_helpers import write_dpo_shards  # noqa: E402
from test_dpo import _trl_loss  # noqa: E402  (trl's DPOTrainer loss on given log-probs)
from test_dpo_start import POLICY  # noqa: E402  (the tiny llama of the decoder-checkpoint starts)

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

BETA = 0.1


def _hf_folder(folder: Path, seed: int = 5, **changes) -> Path:
    """A tiny LlamaForCausalLM with POLICY's shape and seeded random weights, saved as safetensors."""
    config = transformers.LlamaConfig(**{
        **dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=4, max_position_embeddings=16, rms_norm_eps=1e-5, tie_word_embeddings=False,
               attention_bias=False, mlp_bias=False, hidden_act="silu"), **changes})
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)  # norms too: every weight differs from a fresh cs-run model's
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def _dpo_params(root: Path, steps: int = 2) -> Path:
    write_dpo_shards(root / "prefs", pairs=4, seed=0)
    params = {"train_input": {"data_processor": "DpoHDF5DataProcessor", "data_dir": str(root / "prefs"),
                              "batch_size": 4, "shuffle": False, "num_workers": 0},
              "model": {"name": "dpo", "dpo": {"beta": BETA},
                        "policy_model": {"name": "llama", **POLICY, "layer_norm_epsilon": 1e-5}},
              "optimizer": {"optimizer_type": "AdamW", "learning_rate": 1.0e-2},
              "runconfig": {"max_steps": steps, "log_steps": 1, "checkpoint_steps": steps,
                            "save_initial_checkpoint": True, "seed": 1}}
    (root / "dpo.yaml").write_text(yaml.safe_dump(params))
    return root / "dpo.yaml"


def _cs_run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _logps(hf, rows: torch.Tensor, first: int) -> torch.Tensor:
    """Each pair's summed log-prob of its label tokens under its loss mask, by transformers' forward."""
    ids, mask, labels = rows[:, first], rows[:, first + 1], rows[:, first + 2]
    with torch.no_grad():
        logprobs = torch.log_softmax(hf(input_ids=ids).logits.double(), dim=-1)
    return (logprobs.gather(-1, labels.unsqueeze(-1)).squeeze(-1) * mask).sum(-1)


def test_a_dpo_run_starts_its_policy_and_reference_from_a_hugging_face_folder(tmp_path):
    """checkpoint_0 holds the folder's converted weights (``convert --from hf``) bit for bit as policy_model.* and
    ref_model.*, at step 0; step 1's loss is trl's on transformers' log-probs of the first batch (4 pairs), and
    the logged policy log-probs are those (float32 vs float64, 1e-4 relative); after 2 steps the reference is
    still the folder's and the policy moved."""
    hf_dir = _hf_folder(tmp_path / "sft_hf")
    result = _cs_run("checkpoint", "convert", "--from", "hf", hf_dir, tmp_path / "converted.mdl")
    assert result.exit_code == 0, result.output
    converted = load(str(tmp_path / "converted.mdl"))["model"]
    result = _cs_run("train", "--params", _dpo_params(tmp_path), "--model_dir", tmp_path / "dpo",
                     "--checkpoint_path", hf_dir)
    assert result.exit_code == 0, result.output
    initial = load(str(tmp_path / "dpo" / "checkpoint_0.mdl"))
    assert int(initial["global_step"]) == 0
    for role in ("policy_model", "ref_model"):
        got = {k[len(role) + 1:]: v for k, v in initial["model"].items() if k.startswith(role + ".")}
        assert got.keys() == converted.keys()
        for key, value in converted.items():
            torch.testing.assert_close(got[key], value, rtol=0, atol=0, msg=f"{role}.{key}")

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), torch_dtype=torch.float32).eval()
    rows = torch.from_numpy(np.asarray(h5py.File(tmp_path / "prefs" / "data-0.h5")["data"][:4])).long()
    chosen, rejected = _logps(hf, rows, 0), _logps(hf, rows, 3)
    lengths = [rows[:, 1].sum(-1), rows[:, 4].sum(-1)]
    expected = _trl_loss("sigmoid", BETA, chosen, rejected, chosen.clone(), rejected.clone(), *lengths)
    train = read_scalars(tmp_path / "dpo" / "train")
    assert abs(train["loss"][0][1] - expected) < 1e-6, (train["loss"][0][1], expected)
    for tag, value in (("policy_chosen_logps", chosen), ("policy_rejected_logps", rejected)):
        logged = dict(train[tag])[1]
        assert abs(logged - float(value.mean())) < 1e-4 * abs(float(value.mean())), (tag, logged, float(value.mean()))

    final = load(str(tmp_path / "dpo" / "checkpoint_2.mdl"))["model"]
    for key, value in converted.items():
        torch.testing.assert_close(final[f"ref_model.{key}"], value, rtol=0, atol=0, msg=f"ref_model.{key}")
    assert any(not torch.equal(final[f"policy_model.{k}"], v) for k, v in converted.items())


@pytest.mark.parametrize("changes, message", [
    ({"intermediate_size": 48}, r"--checkpoint_path: .*sft_hf is a Hugging Face folder of another model than "
                                r"model\.policy_model \(model\.policy_model\.filter_size: 64 \(config\.json: 48\)\); "
                                r"convert it with cs-run checkpoint convert --from hf .*sft_hf sft_hf\.mdl, set "
                                r"model\.policy_model to sft_hf\.yaml's model section"),
], ids=["another_decoder"])
def test_a_folder_of_another_decoder_is_one_error_line(tmp_path, changes, message):
    """Before the fix a DPO run named its model 'no decoder LM' and told to run the converted decoder's params."""
    hf_dir = _hf_folder(tmp_path / "sft_hf", **changes)
    result = _cs_run("train", "--params", _dpo_params(tmp_path), "--model_dir", tmp_path / "dpo",
                     "--checkpoint_path", hf_dir)
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and re.search(message, errors[0]), result.output
    assert not list(tmp_path.glob("dpo/checkpoint_*"))
