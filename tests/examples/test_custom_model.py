"""The custom_model starter: ``cs-run init`` writes it, and it trains from its params file on CPU and CSX,
with its eval metric, importing its modules from the params file's folder."""

from __future__ import annotations

import sys
from importlib import resources

import pytest
import torch
from click.testing import CliRunner

from cs_run import checkpoint
from cs_run.frontends.cli import STARTERS, cli
from cs_run.params import load_params


def invoke(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


@pytest.fixture
def fresh_imports(monkeypatch):
    """The starter's modules are called model and data: each test imports its own copy."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("model", "data"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    for name in ("model", "data"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("example", sorted(STARTERS))
def test_init_copies_the_bundled_files(example, tmp_path):
    result = invoke("init", tmp_path / "proj", "--example", example)
    assert result.exit_code == 0, result.output
    source = resources.files("cs_run.examples") / example
    written = sorted(p.name for p in (tmp_path / "proj").iterdir())
    assert written == sorted(STARTERS[example])
    for name in written:
        expected = (source / name).read_text()
        if example == "gpt2" and name == "params.yaml":  # its shards go into the new folder (next test)
            expected = expected.replace('"../../model_dir/gpt2_data/', '"gpt2_data/')
        assert (tmp_path / "proj" / name).read_text() == expected
    assert f"cs-run train --params {tmp_path / 'proj' / 'params.yaml'}" in result.output


def test_init_gpt2_points_its_data_into_the_new_folder_and_says_how_to_fill_it(tmp_path, monkeypatch):
    proj = tmp_path / "proj"
    result = invoke("init", proj, "--example", "gpt2")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1:] == [
        f"Next: cs-run data preprocess --stdlib -o {proj / 'gpt2_data'} --max_seq_length 128 --vocab_size 4096 "
        "--eval_fraction 0.05", f"Then: cs-run train --params {proj / 'params.yaml'}"]
    for split in ("train", "val"):  # what the preprocess command writes
        (proj / "gpt2_data" / split).mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    params = load_params(proj / "params.yaml")
    assert params.train_input.data_dir == str(proj / "gpt2_data" / "train")
    assert params.eval_input.data_dir == str(proj / "gpt2_data" / "val")
    assert params.model.extra["max_position_embeddings"] == 128 and params.model.extra["vocab_size"] == 4096


def test_init_keeps_existing_files_unless_forced(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "model.py").write_text("# mine")
    result = invoke("init", proj)
    assert result.exit_code == 2 and result.output.count("Error:") == 1 and "add --force" in result.output
    assert sorted(p.name for p in proj.iterdir()) == ["model.py"] and (proj / "model.py").read_text() == "# mine"
    assert invoke("init", proj, "--force").exit_code == 0
    assert (proj / "model.py").read_text() != "# mine"
    (tmp_path / "afile").write_text("x")
    assert invoke("init", tmp_path / "afile").exit_code == 2
    result = invoke("init", tmp_path / "afile" / "sub")  # a file on the way: one line, not a traceback
    assert result.exit_code == 2 and result.output.strip() == (
        f"Error: init: cannot write the starter into {tmp_path / 'afile' / 'sub'}: Not a directory "
        f"({tmp_path / 'afile' / 'sub'}); choose another folder")


def _losses(output):
    return [line.split("Loss=")[1].split(",")[0] for line in output.splitlines() if "Loss=" in line]


def test_the_starter_trains_on_cpu_and_csx_from_its_params_file(tmp_path, monkeypatch, fresh_imports):
    """From another folder, with nothing on PYTHONPATH: the params file's folder supplies model and data.
    The CSX fx tier replays the eager step, so the two runs' losses and eval results are the same."""
    assert invoke("init", tmp_path / "proj").exit_code == 0
    monkeypatch.chdir(tmp_path)
    params = tmp_path / "proj" / "params.yaml"
    runs = {}
    for device in ("CPU", "CSX"):
        md = tmp_path / device
        result = invoke("train-and-eval", "--params", params, "--model_dir", md, "--device", device,
                        "--compile_tier", "fx", "--max_steps", 30, "--set", "runconfig.log_steps=10")
        assert result.exit_code == 0, result.output
        assert "eval/accuracy = " in result.output and "eval/loss = " in result.output
        runs[device] = (_losses(result.output), [line for line in result.output.splitlines() if " = " in line])
        assert (md / "checkpoint_30.mdl").is_file()
        assert sys.modules["model"].__file__ == str(tmp_path / "proj" / "model.py")
    assert len(runs["CPU"][0]) == 3 and runs["CPU"] == runs["CSX"]
    cpu = checkpoint.load(str(tmp_path / "CPU" / "checkpoint_30.mdl"))["model"]
    csx = checkpoint.load(str(tmp_path / "CSX" / "checkpoint_30.mdl"))["model"]
    assert all(torch.equal(cpu[k], csx[k]) for k in cpu)


def test_a_wrong_data_signature_in_the_starter_is_a_params_error_before_any_work(tmp_path, monkeypatch,
                                                                                 fresh_imports):
    assert invoke("init", tmp_path / "proj").exit_code == 0
    data = tmp_path / "proj" / "data.py"
    data.write_text(data.read_text().replace("def build_dataloader(split: str, batch_size: int,",
                                             "def build_dataloader(batch_size: int,"))
    monkeypatch.chdir(tmp_path)
    result = invoke("train", "--params", tmp_path / "proj" / "params.yaml", "--model_dir", tmp_path / "md")
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: params: train_input.data_fn: data:build_dataloader(")
    assert "(it does not take split)" in lines[0] and "expected def build_dataloader(split, batch_size: int," in lines[0]
    assert lines[0].endswith(f"({tmp_path / 'proj' / 'params.yaml'}:4)")
    assert not (tmp_path / "md").exists()
