"""User input a run can check before it starts is refused before model_dir is made or written.

The class: missing or empty eval data (eval, train-and-eval, eval-all, the Trainer's validate), a start
checkpoint of another model (``--resume``, ``--checkpoint_path``, the params key, the Trainer's
``ckpt_path``, a model_dir whose newest checkpoint is another model's, eval-all's model_dir holding one
of another model), an early-stopping metric the eval does not report, a start at or past max_steps and
compile-only's data. Each is one ``Error:`` line
(what, where, how to fix), exit 2, and model_dir's contents are byte for byte what they were, also
when it did not exist (no run record, no run.log line, no lock file).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import cs_run
from cs_run.errors import ParamsError
from cs_run.frontends.cli import cli, default_params_path


def invoke(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def _steps(command: str) -> list:
    return ["--max_steps", 4] if command in ("train", "train-and-eval") else []


def _error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("Error: "), result.output
    assert sum(line.startswith("Error:") for line in lines) == 1, result.output
    return lines[-1]


def _contents(folder: Path):
    """Every entry under ``folder`` with a file's bytes (None: the folder does not exist)."""
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else "dir") for p in folder.rglob("*")}


def _line_of(params: Path, key_line: str, after: str = "") -> int:
    """The 1-based line of ``key_line`` in the params file (the first after the line ``after``)."""
    lines = params.read_text().splitlines()
    start = lines.index(after) if after else 0
    return start + lines[start:].index(key_line) + 1


@pytest.fixture(params=["new", "existing"])
def model_dir(request, toy_project, tmp_path):
    """A model_dir that does not exist yet, or one that holds a finished run of the toy model."""
    md = tmp_path / "md"
    if request.param == "existing":
        assert invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 2).exit_code == 0
        assert list(md.glob("checkpoint_*.mdl")) and list((md / "runs").iterdir())
    return md


EVAL_REFUSALS = {  # eval_input's value -> its replacement
    "empty dataset": ("num_samples: 32", "num_samples: 0"),
    "batch larger than the data": ("batch_size: 8", "batch_size: 1000\n  drop_last_batch: true"),
}


# eval-all of a model_dir without checkpoints has its own refusal (test_refused_early): "existing" only.
@pytest.mark.parametrize(("command", "model_dir"), [("eval", "new"), ("eval", "existing"), ("train-and-eval", "new"),
                                                    ("train-and-eval", "existing"), ("eval-all", "existing")],
                         indirect=["model_dir"])
@pytest.mark.parametrize("refusal", list(EVAL_REFUSALS))
def test_eval_data_that_yields_no_batch_is_refused_before_model_dir_is_written(command, refusal, model_dir,
                                                                               toy_project):
    old, new = EVAL_REFUSALS[refusal]
    text = toy_project.read_text()
    eval_at = text.index("eval_input:")
    toy_project.write_text(text[:eval_at] + text[eval_at:].replace(old, new, 1))
    before = _contents(model_dir)
    result = invoke(command, "--params", toy_project, "--model_dir", model_dir, *_steps(command))
    assert result.exit_code == 2, result.output
    line = _error_line(result)
    assert line.startswith("Error: params: eval_input: the eval loader yields no batch; check eval_input.batch_size "
                           f"and drop_last_batch ({toy_project}:"), line
    named = toy_project.read_text().splitlines()[int(line.rsplit(":", 1)[1].rstrip(")")) - 1]
    assert named.startswith(("  batch_size:", "  drop_last_batch:")) and named in new + "  batch_size: 8"
    assert _contents(model_dir) == before


@pytest.mark.parametrize("command", ["eval", "train-and-eval"])
@pytest.mark.parametrize("given", ["file", "set"])
def test_missing_mnist_eval_data_names_eval_input_data_dir(command, given, tmp_path):
    # The bundled fc_mnist params with an eval data_dir that holds no MNIST: the data function's line, at the
    # eval key's own place (before, a message about eval_input.data_dir pointed at train_input.data_dir's line).
    params = tmp_path / "params.yaml"
    md = tmp_path / "md"
    md.mkdir()
    (md / "notes.txt").write_text("mine\n")
    before = _contents(md)
    bundled = default_params_path()
    text = bundled.read_text()
    eval_at = text.index("eval_input:")
    missing = tmp_path / "no_mnist"
    args = ["--params", params, "--model_dir", md, *_steps(command)]
    if given == "file":
        params.write_text(text[:eval_at] + text[eval_at:].replace('"bundled:digits"', str(missing), 1))
        where = f"({params}:{_line_of(params, f'  data_dir: {missing}')})"
    else:
        params.write_text(text)
        args += ["--set", f"eval_input.data_dir={missing}"]
        where = "(set on the command line)"
    result = invoke(command, *args)
    assert result.exit_code == 2, result.output
    line = _error_line(result)
    assert line.startswith(f"Error: params: eval_input.data_dir: no MNIST eval data in {missing}")
    assert line.endswith(where)
    assert _contents(md) == before


def _toy_checkpoint(toy_project, tmp_path, hidden: int) -> Path:
    """A checkpoint of the toy model with ``model.hidden`` (another model when it is not the params' 8)."""
    other = tmp_path / f"other_{hidden}"
    result = invoke("train", "--params", toy_project, "--model_dir", other, "--max_steps", 2, "--set",
                    f"model.hidden={hidden}")
    assert result.exit_code == 0, result.output
    return other / "checkpoint_2.mdl"


MISMATCH = "': key 'model.net.0.weight' is float32[16, 6] in the file but float32[8, 6] in the target"


@pytest.mark.parametrize("how", ["--resume", "params key", "eval --checkpoint_path", "train-and-eval --resume"])
def test_a_start_checkpoint_of_another_model_is_refused_before_model_dir_is_written(how, model_dir, toy_project,
                                                                                   tmp_path):
    path = _toy_checkpoint(toy_project, tmp_path, hidden=16)
    command, args = "train", ["--resume", path]
    if how == "params key":
        toy_project.write_text(toy_project.read_text() + f"  checkpoint_path: {path}\n")
        args = []
    elif how.startswith("eval"):
        command, args = "eval", ["--checkpoint_path", path]
    elif how.startswith("train-and-eval"):
        command = "train-and-eval"
    before = _contents(model_dir)
    result = invoke(command, "--params", toy_project, "--model_dir", model_dir, *_steps(command), *args)
    assert result.exit_code == 2, result.output
    line = _error_line(result)
    flag = how.split()[-1] if how != "params key" else "params: runconfig.checkpoint_path"
    assert line.startswith(f"Error: {flag}: checkpoint '{path}{MISMATCH}: not a checkpoint of this model; "
                           "give a checkpoint this model saved"), line
    if flag == "--resume":
        assert line.endswith(", or start fresh with --resume none")
    if how == "params key":
        assert line.endswith(f"({toy_project}:{len(toy_project.read_text().splitlines())})")
    assert _contents(model_dir) == before


@pytest.mark.parametrize("command", ["train", "eval", "train-and-eval"])
def test_a_model_dir_of_another_model_is_refused_before_it_is_written(command, toy_project, tmp_path):
    md = _toy_checkpoint(toy_project, tmp_path, hidden=16).parent  # autoload would resume from its checkpoint_2
    before = _contents(md)
    result = invoke(command, "--params", toy_project, "--model_dir", md, *_steps(command))
    assert result.exit_code == 2, result.output
    fix = (", or start fresh in a new model_dir or with --resume none (runconfig.autoload_checkpoint: false)"
           if command != "eval" else " or a checkpoint of this model (--checkpoint_path)")
    assert _error_line(result) == (f"Error: --model_dir {md}: its newest checkpoint is not one of this model's: "
                                   f"checkpoint '{md / 'checkpoint_2.mdl'}{MISMATCH}; give the model_dir of a run "
                                   f"of this model{fix}")
    assert _contents(md) == before
    assert invoke(command, "--params", toy_project, "--model_dir", md, *_steps(command),
                  "--set", "model.hidden=16").exit_code == 0  # the model it holds resumes


def test_the_trainers_ckpt_path_of_another_model_is_refused_before_model_dir_is_written(toy_project, tmp_path):
    path = _toy_checkpoint(toy_project, tmp_path, hidden=16)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Dropout(0.0), torch.nn.Linear(8, 3))

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, batch):
            return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    model = WithLoss()
    md = tmp_path / "md"
    trainer = cs_run.Trainer(device="CPU", model_dir=str(md), model=model,
                             optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1), loop={"num_steps": 2})
    data = torch.utils.data.TensorDataset(torch.randn(8, 6), torch.randint(0, 3, (8,)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    for verb, call in (("fit", trainer.fit), ("validate", trainer.validate)):
        with pytest.raises(ParamsError) as info:
            call(loader, ckpt_path=str(path))
        assert str(info.value) == (f"Trainer.{verb}: ckpt_path: checkpoint '{path}{MISMATCH}: not a checkpoint of "
                                   "this model; give a checkpoint this model saved")
        assert not md.exists()


def test_an_early_stopping_metric_the_eval_lacks_is_refused_before_model_dir_is_written(model_dir, toy_project):
    toy_project.write_text(toy_project.read_text() + "  eval_frequency: 2\n  early_stopping_metric: eval/acc\n")
    before = _contents(model_dir)
    result = invoke("train-and-eval", "--params", toy_project, "--model_dir", model_dir, "--max_steps", 4)
    assert result.exit_code == 2, result.output
    assert _error_line(result) == ("Error: params: runconfig.early_stopping_metric: 'eval/acc' is not a value the "
                                   "evaluation reports (it reports eval/loss) "
                                   f"({toy_project}:{len(toy_project.read_text().splitlines())})")
    assert _contents(model_dir) == before


def test_a_start_at_max_steps_is_refused_before_model_dir_is_written(toy_project, tmp_path):
    md = tmp_path / "md"
    assert invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 2).exit_code == 0
    before = _contents(md)
    for command in ("train", "train-and-eval"):
        result = invoke(command, "--params", toy_project, "--model_dir", md, "--max_steps", 2)
        assert result.exit_code == 2, result.output
        assert _error_line(result).startswith("Error: params: the run starts at global step 2, which already "
                                              "reaches runconfig.max_steps=2; raise runconfig.max_steps")
        assert _contents(md) == before


@pytest.mark.parametrize("command", ["compile-only", "validate-only"])
@pytest.mark.parametrize("change, says", [
    ("num_samples: 0", "params: train_input: num_samples should be a positive integer value"),  # the data function
    ("batch_size: 1000", "params: train_input: the loader yielded no full step to trace"),
])
def test_compile_only_data_is_checked_before_model_dir_is_written(command, change, says, toy_project, tmp_path):
    md = tmp_path / "md"
    text = toy_project.read_text()
    toy_project.write_text(text.replace(change.split(":")[0] + ": " + ("64" if "num" in change else "4"), change, 1))
    result = invoke(command, "--params", toy_project, "--model_dir", md)
    assert result.exit_code == 2, result.output
    line = _error_line(result)
    assert line.startswith(f"Error: {says}") and line.endswith(f"({toy_project}:{_line_of(toy_project, '  ' + change)})")
    assert not md.exists()


def test_the_data_functions_log_lines_of_the_checks_open_run_log(toy_project, tmp_path):
    # The loaders are built before model_dir is opened; what their data functions log is still the run's.
    module = tmp_path / "toy_models.py"
    module.write_text(module.read_text().replace(
        "def build_data(split, ", "import logging\n\ndef build_data(split, ").replace(
        "    x, y = make_tensors(split, num_samples, nan_at)\n",
        "    logging.getLogger('cs_run.user').info('building the %s data', split)\n"
        "    x, y = make_tensors(split, num_samples, nan_at)\n"))
    md = tmp_path / "md"
    result = invoke("train-and-eval", "--params", toy_project, "--model_dir", md, "--max_steps", 2)
    assert result.exit_code == 0, result.output
    log = (md / "run.log").read_text()
    assert log.index("building the train data") < log.index("building the eval data") < log.index("cs-run train_and_eval")


CREATION_LINES = {  # device -> (the flags, a line the runner's creation logs)
    "CPU": (["--set", "model.mixed_precision=true"],
            "model.mixed_precision with the float16 half type: no effect on the CPU device"),
    "CSX": (["--max_wgt_servers", 3], "runconfig.max_wgt_servers=3 is recorded in the resolved params but has no "
                                      "effect on this machine"),
}


@pytest.mark.parametrize("device", list(CREATION_LINES))
def test_the_runner_creations_log_lines_open_run_log_once(device, toy_project, tmp_path):
    # The runner is created (model, precision, backend) before model_dir is opened; its log lines are still the
    # run's: in run.log once, before the run's first line, and on the console once.
    flags, says = CREATION_LINES[device]
    md = tmp_path / "md"
    result = invoke("train", "--params", toy_project, "--model_dir", md, "--max_steps", 2, "--device", device, *flags)
    assert result.exit_code == 0, result.output
    assert result.output.count(says) == 1, result.output
    log = (md / "run.log").read_text()
    assert log.count(says) == 1 and log.index(says) < log.index(f"cs-run train on {device}"), log
    again = flags if device == "CPU" else []  # the second run logs the line again on CPU only
    assert invoke("eval", "--params", toy_project, "--model_dir", md, "--device", device, *again).exit_code == 0
    assert (md / "run.log").read_text().count(says) == (2 if device == "CPU" else 1)  # the second run's own line


@pytest.mark.parametrize("holds", ["only another model's", "this model's and another's", "also a damaged one"])
def test_eval_all_of_a_model_dir_with_another_models_checkpoint_is_refused_before_it_is_written(holds, toy_project,
                                                                                               tmp_path):
    # eval_all evaluates every checkpoint of model_dir: one of another model (keys, dtypes or shapes that do not
    # fit: checkpoint.check_target) is refused up front, like a start checkpoint of another model; a damaged one
    # is not (the evaluation logs and skips it: test_hostile_inputs.test_eval_all_evaluates_every_readable_checkpoint).
    other = _toy_checkpoint(toy_project, tmp_path, hidden=16)
    if holds == "only another model's":
        md, name = other.parent, "checkpoint_2.mdl"
    else:
        md = _toy_checkpoint(toy_project, tmp_path, hidden=8).parent  # this model's checkpoint_2
        name = "checkpoint_7.mdl"
        (md / name).write_bytes(other.read_bytes())  # newer than this model's
        if holds == "also a damaged one":
            good = (md / "checkpoint_2.mdl").read_bytes()
            (md / "checkpoint_1.mdl").write_bytes(good[: len(good) // 2])  # the oldest, checked first
    before = _contents(md)
    result = invoke("eval-all", "--params", toy_project, "--model_dir", md)
    assert result.exit_code == 2, result.output
    assert _error_line(result) == (f"Error: --model_dir {md}: eval_all evaluates every checkpoint in it and {name} is "
                                   f"not one of this model's: checkpoint '{md / name}{MISMATCH}; give the model_dir "
                                   f"of a run of this model, or move {name} out of it")
    assert _contents(md) == before
    if holds != "only another model's":
        (md / name).unlink()  # without it, eval-all runs: this model's is evaluated, a damaged one skipped
        result = invoke("eval-all", "--params", toy_project, "--model_dir", md)
        damaged = holds == "also a damaged one"
        assert result.exit_code == (1 if damaged else 0), result.output
        if damaged:
            assert _error_line(result).startswith("Error: eval_all: evaluated 1 of 2 checkpoints; 1 could not be "
                                                  "read: checkpoint_1.mdl")
        assert "GlobalStep=2," in (md / "run.log").read_text()
