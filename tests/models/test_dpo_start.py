"""A DPO run from a fine-tuned decoder's checkpoint, and a DPO checkpoint's policy out again: ``cs-run train
--checkpoint_path`` of a plain decoder checkpoint starts the policy and the reference from its weights (a
LoRA checkpoint's adapters folded by hand: W + B A alpha / r) at step 0; ``checkpoint convert --to hf`` of a
DPO checkpoint writes its policy, whose logits transformers gives as cs-run's; bad input is one Error line."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from cs_run.checkpoint import load, save
from cs_run.frontends.cli import cli
from cs_run.lora_params import check_lora_params
from cs_run.models.common.lm import build_model as build_decoder
from cs_run.models.common.lora import apply_lora
from tests.lora_by_hand import folded_by_hand

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dpo_helpers import write_dpo_shards  # noqa: E402

POLICY = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_heads=4, filter_size=64,
              max_position_embeddings=16, position_embedding_type="rotary", rotary_dim=8, norm_type="rmsnorm",
              nonlinearity="swiglu", share_embedding_weights=False, use_projection_bias_in_attention=False,
              use_ffn_bias_in_attention=False, use_ffn_bias=False, dropout_rate=0.0)
"""A tiny llama (rotary over the whole head, as Hugging Face's Llama)."""
LORA = {"r": 2, "alpha": 6, "target_modules": ["Linear"]}


def _cs_run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _decoder(seed: int, lora: bool = False):
    torch.manual_seed(seed)
    lm = build_decoder(**POLICY)
    if lora:
        apply_lora(lm, check_lora_params(LORA))
        with torch.no_grad():
            for name, p in lm.named_parameters():
                if name.endswith(".lora_B"):
                    p.normal_()  # B = 0 would make the fold a no-op
    return lm


def _save_decoder(folder: Path, seed: int, lora: bool = False, params: dict | None = None) -> Path:
    """A decoder run's checkpoint (model and global step 7, as a run saves them) and its params_resolved.yaml."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "checkpoint_7.mdl"
    save({"model": _decoder(seed, lora).state_dict(), "global_step": 7}, str(path))
    if params is not None:
        (folder / "params_resolved.yaml").write_text(yaml.safe_dump(params))
    return path


def _dpo_params(root: Path) -> Path:
    write_dpo_shards(root / "prefs", pairs=4, seed=0)
    params = {"train_input": {"data_processor": "DpoHDF5DataProcessor", "data_dir": str(root / "prefs"),
                              "batch_size": 4, "shuffle": False, "num_workers": 0},
              "model": {"name": "dpo", "dpo": {"beta": 0.1}, "policy_model": {"name": "llama", **POLICY}},
              "optimizer": {"optimizer_type": "AdamW", "learning_rate": 1.0e-2},
              "runconfig": {"max_steps": 2, "log_steps": 1, "checkpoint_steps": 2, "save_initial_checkpoint": True}}
    (root / "dpo.yaml").write_text(yaml.safe_dump(params))
    return root / "dpo.yaml"


@pytest.mark.parametrize("lora", [False, True], ids=["plain", "lora_folded"])
def test_the_policy_and_the_reference_start_from_the_decoders_weights_at_step_0(tmp_path, lora):
    params = {"model": {"name": "llama", **POLICY, **({"lora_params": LORA} if lora else {})}}
    start = _save_decoder(tmp_path / "sft", seed=3, lora=lora, params=params)
    result = _cs_run("train", "--params", _dpo_params(tmp_path), "--model_dir", tmp_path / "dpo",
                     "--checkpoint_path", start)
    assert result.exit_code == 0, result.output
    expected = folded_by_hand(start, LORA)
    initial = load(str(tmp_path / "dpo" / "checkpoint_0.mdl"))  # step 0: not the decoder's step 7
    for role in ("policy_model", "ref_model"):
        got = {k[len(role) + 1:]: v for k, v in initial["model"].items() if k.startswith(role + ".")}
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-6, msg=f"{role}.{key}")
    assert (tmp_path / "dpo" / "checkpoint_2.mdl").is_file()


def test_convert_to_hf_writes_a_dpo_checkpoints_policy(tmp_path):
    """The policy (seed 1) and the reference (seed 2) differ: transformers' logits are the policy's."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    params = _dpo_params(tmp_path)
    policy, ref = _decoder(1), _decoder(2)
    state = {**{f"policy_model.{k}": v for k, v in policy.state_dict().items()},
             **{f"ref_model.{k}": v for k, v in ref.state_dict().items()}}
    save({"model": state, "global_step": 2}, str(tmp_path / "dpo.mdl"))
    result = _cs_run("checkpoint", "convert", tmp_path / "dpo.mdl", tmp_path / "hf", "--to", "hf", "--params", params)
    assert result.exit_code == 0, result.output
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, policy.model(ids), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(hf(input_ids=ids).logits, ref.model(ids), atol=1e-3)


def _lora_without_params(root: Path) -> list:
    return ["train", "--checkpoint_path", _save_decoder(root / "sft", 3, lora=True)]


def _lora_params_without_lora(root: Path) -> list:
    return ["train", "--checkpoint_path", _save_decoder(root / "sft", 3, lora=True, params={"model": {"name": "llama"}})]


def _another_decoder(root: Path) -> list:
    path = root / "big.mdl"
    torch.manual_seed(0)
    save({"model": build_decoder(**{**POLICY, "filter_size": 48}).state_dict()}, str(path))
    return ["train", "--checkpoint_path", path]


def _policy_without_name(root: Path) -> list:
    params = yaml.safe_load((root / "dpo.yaml").read_text())
    del params["model"]["policy_model"]["name"]
    (root / "dpo.yaml").write_text(yaml.safe_dump(params))
    save({"model": {}}, str(root / "x.mdl"))
    return ["convert", root / "x.mdl"]


def _decoder_checkpoint_as_dpo(root: Path) -> list:
    return ["convert", _save_decoder(root / "sft", 3)]


@pytest.mark.parametrize("make, message", [
    (_lora_without_params, r"--checkpoint_path: .*checkpoint_7.mdl holds LoRA adapters \(lora_A, lora_B\); the LoRA "
                           r"run's params_resolved.yaml, whose model.lora_params fold them, must be beside it"),
    (_lora_params_without_lora, r"checkpoint_7.mdl holds LoRA adapters but .*params_resolved.yaml sets no "
                                r"model.lora_params"),
    (_another_decoder, r"--checkpoint_path: .*big.mdl is not a checkpoint of model.policy_model: "
                       r"model.transformer_decoder.layers.0.ffn.ffn.0.linear_layer.weight: it holds shape \[48, 32\], "
                       r"the policy \[64, 32\]"),
    (_policy_without_name, r"dpo.yaml: model.policy_model: missing or without a name"),
    (_decoder_checkpoint_as_dpo, r"checkpoint .*checkpoint_7.mdl: no weights under 'policy_model.'"),
], ids=["lora_no_params", "params_no_lora", "another_decoder", "policy_without_name", "decoder_as_dpo"])
def test_bad_starts_and_exports_are_one_error_line(tmp_path, make, message):
    params = _dpo_params(tmp_path)
    command, source, *rest = make(tmp_path)
    if command == "train":
        args = ["train", "--params", params, "--model_dir", tmp_path / "dpo", source, *rest]
    else:
        args = ["checkpoint", "convert", rest[0] if rest else source, tmp_path / "hf", "--to", "hf", "--params", params]
    result = _cs_run(*args)
    assert result.exit_code != 0
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and re.search(message, errors[0]), result.output
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob("dpo/checkpoint_*"))  # nothing written
