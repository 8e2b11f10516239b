"""The Hugging Face on-ramp's edges: a Hugging Face folder as --checkpoint_path (converted in memory when it
is the params' model, else one line with the convert command), hostile config.json files, and --to hf
--overwrite as one step that leaves the old folder whole until the new one is complete."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from cs_run.checkpoint import load
from cs_run.frontends.cli import cli
from tests.examples.gpt2_helpers import tiny_shards
from tests.models.hf_onramp_helpers import tiny_llama_folder

safetensors_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """A tiny Llama folder, its conversion (llama.mdl, llama.yaml) and shards for its vocabulary."""
    root = tmp_path_factory.mktemp("hf_onramp")
    folder = tiny_llama_folder(root / "tiny_llama", tokenizer=False)
    result = CliRunner().invoke(cli, ["checkpoint", "convert", "--from", "hf", str(folder), str(root / "llama.mdl")])
    assert result.exit_code == 0, result.output
    return {"folder": folder, "root": root, "shards": tiny_shards(root / "shards")}


def _invoke(*args: str):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result, result.output.strip().splitlines()


def _train(hf: dict, model_dir: Path, checkpoint: Path, *extra: str):
    shards = hf["shards"]
    return _invoke("train", "--params", hf["root"] / "llama.yaml", "--model_dir", model_dir, "--checkpoint_path",
                   checkpoint, "--max_steps", "3", "--set", f"train_input.data_dir={shards / 'train'}",
                   "--set", f"eval_input.data_dir={shards / 'val'}", *extra)


def test_a_hugging_face_folder_starts_a_run_as_its_conversion_does(hf, tmp_path):
    result, _ = _train(hf, tmp_path / "from_folder", hf["folder"])
    assert result.exit_code == 0, result.output
    converted, _ = _train(hf, tmp_path / "from_mdl", hf["root"] / "llama.mdl")
    assert converted.exit_code == 0, converted.output
    a, b = (load(str(tmp_path / name / "checkpoint_3.mdl")) for name in ("from_folder", "from_mdl"))
    assert a["model"].keys() == b["model"].keys()
    for key, value in b["model"].items():
        assert torch.equal(a["model"][key], value), key
    log = (tmp_path / "from_folder" / "run.log").read_text()
    assert f"Converted the Hugging Face folder {hf['folder']} in memory" in log
    assert "optimizer state not found in the checkpoint" in log


def _config(folder: Path, text: str) -> None:
    (folder / "config.json").unlink()
    (folder / "config.json").write_text(text)


def _fifo(folder: Path) -> None:
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")


def _model_type(folder: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    _config(folder, json.dumps({**cfg, "model_type": "xlnet"}))


START_REFUSALS = {  # how the folder is spoiled, extra flags, the one line expected (after 'Error: --checkpoint_path: ')
    "another model": (None, ("--set", "model.hidden_size=64"), "is a Hugging Face folder of another model than the "
                      "params' (model.hidden_size: 64 (config.json: 32)); convert it with cs-run checkpoint convert "
                      "--from hf"),
    "another model_type": (_model_type, (), "is a Hugging Face folder of model_type: 'xlnet' has no Hugging Face "
                           "converter"),
    "deeply nested": (lambda f: _config(f, "[" * 200_000 + "]" * 200_000), (), "nested too deeply"),
    "a FIFO": (_fifo, (), "not a regular file"),
}


@pytest.mark.parametrize("case", START_REFUSALS)
def test_a_hugging_face_folder_that_cannot_start_the_run_is_one_line(hf, tmp_path, case):
    spoil, extra, expected = START_REFUSALS[case]
    folder = hf["folder"]
    if spoil is not None:
        folder = tmp_path / "spoiled"
        folder.mkdir()
        for name in os.listdir(hf["folder"]):
            os.link(hf["folder"] / name, folder / name)
        spoil(folder)
    result, lines = _train(hf, tmp_path / "run", folder, *extra)
    assert result.exit_code in (1, 2), result.output
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith("Error: --checkpoint_path: ") and expected in errors[0], \
        result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "run").exists()  # refused before model_dir was made


CONFIG_REFUSALS = {
    "deeply nested": (lambda f: _config(f, "{\"a\": " * 100_000 + "1" + "}" * 100_000), "nested too deeply"),
    "a FIFO": (_fifo, "not a regular file"),
    "a list": (lambda f: _config(f, "[1, 2]"), "expected a JSON object of settings, got list"),
    "not JSON": (lambda f: _config(f, "{model_type: llama"), "not valid JSON"),
}


@pytest.mark.parametrize("case", CONFIG_REFUSALS)
def test_a_hostile_config_json_is_one_line_and_writes_nothing(hf, tmp_path, case):
    spoil, expected = CONFIG_REFUSALS[case]
    folder = tmp_path / "spoiled"
    folder.mkdir()
    for name in os.listdir(hf["folder"]):
        os.link(hf["folder"] / name, folder / name)
    spoil(folder)
    result, lines = _invoke("checkpoint", "convert", "--from", "hf", folder, tmp_path / "out.mdl")
    assert result.exit_code in (1, 2), result.output
    assert len(lines) == 1 and lines[0].startswith("Error: ") and expected in lines[0], result.output
    assert sorted(os.listdir(tmp_path)) == ["spoiled"]


def _old_weights_file(dst: Path) -> None:
    (dst / "model.safetensors").write_bytes(b"old weights")


def _config_is_a_folder(dst: Path) -> None:
    _old_weights_file(dst)
    (dst / "config.json").mkdir()
    (dst / "config.json" / "keep.txt").write_text("old")


def _old_sharded_model(dst: Path) -> None:
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "model-00001-of-00002.safetensors"}}))
    (dst / "model-00001-of-00002.safetensors").write_bytes(b"old shard")
    (dst / "config.json").write_text("{}")
    (dst / "tokenizer.json").write_text("{}")
    (dst / "generation_config.json").write_text("{}")


NEW_SET = {"config.json", "generation_config.json", "model.safetensors"}


@pytest.mark.parametrize("old", [_config_is_a_folder, _old_sharded_model], ids=["config.json a folder", "sharded"])
def test_to_hf_overwrite_replaces_the_whole_folder(hf, tmp_path, old):
    dst = tmp_path / "out"
    dst.mkdir()
    old(dst)
    result, _ = _invoke("checkpoint", "convert", hf["root"] / "llama.mdl", dst, "--to", "hf", "--overwrite")
    assert result.exit_code == 0, result.output
    assert set(os.listdir(dst)) == NEW_SET
    assert [p for p in os.listdir(tmp_path) if p != "out"] == []  # no temporary, no aside
    written = safetensors_torch.load_file(str(dst / "model.safetensors"))
    for key, value in safetensors_torch.load_file(str(hf["folder"] / "model.safetensors")).items():
        assert torch.equal(written[key], value), key


def test_a_failed_to_hf_leaves_the_old_folder_whole(hf, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    dst.mkdir()
    _old_sharded_model(dst)
    before = {name: (dst / name).read_bytes() for name in os.listdir(dst)}

    def full_disk(tensors, path, metadata=None):
        Path(path).write_bytes(b"half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(safetensors_torch, "save_file", full_disk)
    result, lines = _invoke("checkpoint", "convert", hf["root"] / "llama.mdl", dst, "--to", "hf", "--overwrite")
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and "No space left on device" in lines[0] and "unchanged" in lines[0], result.output
    assert {name: (dst / name).read_bytes() for name in os.listdir(dst)} == before
    assert os.listdir(tmp_path) == ["out"]


def test_the_staging_folder_of_a_killed_convert_is_removed_by_the_next(hf, tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process id no process has now
    stale = tmp_path / f".out.{gone.pid}.0badc0de.cs-run-tmp"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    result, _ = _invoke("checkpoint", "convert", hf["root"] / "llama.mdl", tmp_path / "out", "--to", "hf")
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert set(os.listdir(tmp_path / "out")) == NEW_SET


def test_from_hf_writes_a_params_file_that_runs_once_its_data_is_named(hf, tmp_path):
    params = yaml.safe_load((hf["root"] / "llama.yaml").read_text())
    assert set(params) == {"train_input", "eval_input", "model", "optimizer", "runconfig"}
    assert params["train_input"]["data_processor"] == "GptHDF5MapDataProcessor"
    assert [s["scheduler"] for s in params["optimizer"]["learning_rate"]] == ["Linear", "CosineDecay"]
    result, lines = _invoke("train", "--params", hf["root"] / "llama.yaml", "--model_dir", tmp_path / "run",
                            "--checkpoint_path", hf["root"] / "llama.mdl")
    assert result.exit_code == 2, result.output
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1 and "data_dir: not set; set train_input.data_dir to a folder of *.h5 shards" in errors[0]
    assert "llama.yaml:" in errors[0]  # the placeholder's line
    assert not (tmp_path / "run").exists()


def test_to_hf_writes_the_tokenizers_special_token_ids_into_a_new_generation_config(tmp_path):
    """Without a generation_config.json beside the model, --to hf writes transformers' from-model-config form
    with the bos and eos ids of the tokenizer it copies (the reference: transformers' own tokenizer)."""
    transformers = pytest.importorskip("transformers")
    folder = tiny_llama_folder(tmp_path / "tiny_llama")
    (folder / "generation_config.json").unlink()
    result, _ = _invoke("checkpoint", "convert", "--from", "hf", folder, tmp_path / "llama.mdl")
    assert result.exit_code == 0, result.output
    result, _ = _invoke("checkpoint", "convert", tmp_path / "llama.mdl", tmp_path / "back", "--to", "hf")
    assert result.exit_code == 0, result.output
    assert set(os.listdir(tmp_path / "back")) == NEW_SET | {"tokenizer.json", "tokenizer_config.json"}
    generation = json.loads((tmp_path / "back" / "generation_config.json").read_text())
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert generation == {"_from_model_config": True, "bos_token_id": tok.bos_token_id,
                          "eos_token_id": tok.eos_token_id}
    assert transformers.GenerationConfig.from_pretrained(tmp_path / "back").eos_token_id == tok.eos_token_id
