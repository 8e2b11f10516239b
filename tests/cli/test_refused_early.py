"""Bad input a run can see before it starts is refused before anything is created or written.

The checkpoint a run starts from (--resume PATH, --checkpoint_path, runconfig.checkpoint_path, the
Trainer's ckpt_path) is checked before anything is created or written: one ``Error:`` line naming where
it was given, the path and what is wrong; model_dir untouched. A path that names no checkpoint is a
params error (exit 2); a damaged checkpoint fails the run (exit 1, as when one is read)."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import pytest
import torch
from click.testing import CliRunner

import cs_run
from cs_run.errors import CheckpointError, ParamsError
from cs_run.frontends.cli import cli


def _missing(d: Path) -> Path:
    return d / "no.mdl"


def _folder(d: Path) -> Path:
    (d / "ckpt_dir").mkdir()
    return d / "ckpt_dir"


def _empty(d: Path) -> Path:
    (d / "empty.mdl").write_bytes(b"")
    return d / "empty.mdl"


def _text(d: Path) -> Path:
    (d / "notes.mdl").write_text("not a checkpoint\n")
    return d / "notes.mdl"


def _hdf5_data(d: Path) -> Path:  # an HDF5 file that is not a checkpoint (a data file, say)
    with h5py.File(d / "data.h5", "w") as f:
        f["data"] = [[1, 2, 3]]
    return d / "data.h5"


def _truncated(d: Path) -> Path:
    cs_run.save({"model": {"w": torch.arange(4096.0)}, "global_step": 2}, str(d / "full.mdl"))
    data = (d / "full.mdl").read_bytes()
    (d / "cut.mdl").write_bytes(data[: len(data) // 2])
    return d / "cut.mdl"


def _unreadable(d: Path) -> Path:
    # A regular file that even root cannot read (EIO at offset 0); chmod 000 does not stop root.
    if not os.path.exists("/proc/self/mem"):
        pytest.skip("needs Linux /proc")
    return Path("/proc/self/mem")


BAD = {  # name: (make it, what the message says, exit code)
    "missing": (_missing, "does not exist", 2),
    "folder": (_folder, "is a directory, not a checkpoint file", 2),
    "text": (_text, "is not an HDF5 checkpoint, torch pickle or safetensors file", 2),
    "hdf5 data": (_hdf5_data, "is an HDF5 file but not a checkpoint", 2),
    "unreadable": (_unreadable, "cannot be read", 2),
    "empty": (_empty, "is empty (0 bytes)", 1),
    "truncated": (_truncated, "is truncated", 1),
}


def invoke(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def _error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


@pytest.fixture(params=list(BAD), ids=list(BAD))
def bad(request, tmp_path):
    make, what, code = BAD[request.param]
    src = tmp_path / "src"
    src.mkdir()
    path = make(src)
    return str(path.resolve()), what, code  # the CLI makes a flag's path absolute


def test_resume_from_a_bad_path_is_one_line_before_model_dir_exists(bad, toy_project, tmp_path):
    path, what, code = bad
    result = invoke("train", "--params", toy_project, "--model_dir", tmp_path / "md", "--resume", path)
    assert result.exit_code == code
    line = _error_line(result)
    assert line.startswith(f"Error: --resume: checkpoint '{path}' {what}")
    assert line.endswith("; give a checkpoint file, auto (the newest in model_dir) or none") == (code == 2)
    assert not (tmp_path / "md").exists()


def test_eval_checkpoint_path_flag_is_checked_the_same_way(bad, toy_project, tmp_path):
    path, what, code = bad
    result = invoke("eval", "--params", toy_project, "--model_dir", tmp_path / "md", "--checkpoint_path", path)
    assert result.exit_code == code
    line = _error_line(result)
    assert line.startswith(f"Error: --checkpoint_path: checkpoint '{path}' {what}")  # a folder: not a sharded one
    assert not (tmp_path / "md").exists()


def test_the_params_key_names_its_file_and_line(bad, toy_project, tmp_path):
    path, what, code = bad
    text = toy_project.read_text()
    toy_project.write_text(text + f"  checkpoint_path: {path}\n")
    line_no = len(text.splitlines()) + 1
    result = invoke("train", "--params", toy_project, "--model_dir", tmp_path / "md")
    assert result.exit_code == code
    line = _error_line(result)
    assert line.startswith(f"Error: params: runconfig.checkpoint_path: checkpoint '{path}' {what}")
    assert line.endswith(f"({toy_project}:{line_no})")
    assert not (tmp_path / "md").exists()


def test_trainer_ckpt_path_names_the_argument(bad, tmp_path):
    path, what, code = bad
    model = torch.nn.Linear(2, 1)
    data = torch.utils.data.TensorDataset(torch.randn(8, 2), torch.randn(8, 1))

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, batch):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

    net = WithLoss()
    trainer = cs_run.Trainer(device="CPU", model_dir=str(tmp_path / "md"), model=net,
                             optimizer=cs_run.optim.SGD(net.parameters(), lr=0.1), loop={"num_steps": 2})
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    error = ParamsError if code == 2 else CheckpointError
    with pytest.raises(error, match=r"^Trainer\.fit: ckpt_path: checkpoint '") as info:
        trainer.fit(loader, ckpt_path=path)
    assert f"'{path}' {what}" in str(info.value)
    with pytest.raises(error, match=r"^Trainer\.validate: ckpt_path: checkpoint '"):
        trainer.validate(loader, ckpt_path=path)
    assert not (tmp_path / "md").exists()


def test_a_bad_resume_leaves_an_existing_model_dir_as_it_was(toy_project, tmp_path):
    md = tmp_path / "md"
    first = invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 2)
    assert first.exit_code == 0, first.output
    before = {p.relative_to(md): p.read_bytes() for p in md.rglob("*") if p.is_file()}
    result = invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 4,
                    "--resume", tmp_path / "no.mdl")
    assert result.exit_code == 2 and "--resume: checkpoint" in _error_line(result)
    after = {p.relative_to(md): p.read_bytes() for p in md.rglob("*") if p.is_file()}
    assert after == before  # no new run record, run.log line or params_resolved.yaml


def test_a_good_checkpoint_passes_the_check(toy_project, tmp_path):
    md = tmp_path / "md"
    assert invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 2).exit_code == 0
    result = invoke("train", "--params", toy_project, "--model_dir", tmp_path / "branch", "--max_steps", 3,
                    "--resume", md / "checkpoint_2.mdl")
    assert result.exit_code == 0, result.output
    assert "(global step 2 -> 3)" in result.output


@pytest.mark.parametrize("refusal, args", [
    ("already reaches", ["--max_steps", 2]),  # the budget: nothing left to train
    ("yields no batches", ["--max_steps", 4, "--set", "train_input.batch_size=1000"]),  # the data function's loader
])
def test_a_run_refused_before_its_first_step_keeps_the_resolved_params(refusal, args, toy_project, tmp_path):
    md = tmp_path / "md"
    assert invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 2).exit_code == 0
    resolved = (md / "params_resolved.yaml").read_bytes()
    result = invoke("train", "--params", toy_project, "--model_dir", md, "--set", "optimizer.learning_rate=0.5", *args)
    assert result.exit_code == 2 and refusal in result.output, result.output
    assert (md / "params_resolved.yaml").read_bytes() == resolved  # still the params that trained checkpoint_2
    again = invoke("train", "--params", toy_project, "--model_dir", md, "--set", "optimizer.learning_rate=0.5",
                   "--max_steps", 3)
    assert again.exit_code == 0, again.output
    assert b"learning_rate: 0.5" in (md / "params_resolved.yaml").read_bytes()  # a run that trains writes them


def test_eval_all_of_a_model_dir_without_checkpoints_is_refused_before_it_is_made(toy_project, tmp_path):
    result = invoke("eval-all", "--params", toy_project, "--model_dir", tmp_path / "typo")
    assert result.exit_code == 2
    assert _error_line(result) == (f"Error: eval_all: no checkpoint_<step>.mdl files in {tmp_path / 'typo'}; give the "
                                   "--model_dir of a run that saved checkpoints")
    assert not (tmp_path / "typo").exists()


def test_a_training_run_without_a_length_is_refused_before_model_dir_is_made(toy_project, tmp_path):
    toy_project.write_text(toy_project.read_text().replace("  max_steps: 20\n", ""))
    result = invoke("train", "--params", toy_project, "--model_dir", tmp_path / "md")
    assert result.exit_code == 2
    assert _error_line(result).startswith("Error: params: set one of runconfig.num_steps, runconfig.num_epochs or "
                                          "runconfig.max_steps to say how long to run")
    assert not (tmp_path / "md").exists()
    assert invoke("eval", "--params", toy_project, "--model_dir", tmp_path / "md").exit_code == 0  # eval needs none


def test_a_data_function_that_refuses_its_section_does_so_before_model_dir_is_made(tmp_path):
    # The bundled fc_mnist params with a data_dir that holds no MNIST: the data function's one line, and no
    # model_dir (the loader is built before model_dir is opened).
    result = invoke("train", "--model_dir", tmp_path / "md", "--max_steps", 2, "--set",
                    f"train_input.data_dir={tmp_path / 'no_mnist'}")
    assert result.exit_code == 2
    assert _error_line(result).startswith(f"Error: params: train_input.data_dir: no MNIST train data in "
                                          f"{tmp_path / 'no_mnist'}")
    assert not (tmp_path / "md").exists()
