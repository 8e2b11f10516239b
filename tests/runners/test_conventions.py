"""Runner and Trainer conventions: one custom runner class for every device, a hook with the eval metrics,
early stopping, Trainer console logging and ``fit(ckpt_path="last")``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner
from trainer_toys import WithLoss, toy_data

import cs_run
from cs_run.backend import _reset_for_tests
from cs_run.errors import ParamsError
from cs_run.frontends.cli import cli
from cs_run.frontends.trainer import Trainer
from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner, PyTorchCSRunner, PyTorchRunner
from cs_run.summaries import read_scalars

HOOKS = '''
from cs_run.runners import PyTorchBaseRunner

SEEN = []


class HooksOnly(PyTorchBaseRunner):
    """One class for every device: hooks only."""

    def on_train_start(self):
        SEEN.append(("on_train_start", type(self).__mro__[1].__name__, self.device_name))
        super().on_train_start()

    def on_eval_metrics(self, metrics, step):
        SEEN.append(("on_eval_metrics", step, dict(metrics)))
        super().on_eval_metrics(metrics, step)

    def on_train_end(self, early_exit):
        SEEN.append(("on_train_end", early_exit))
        super().on_train_end(early_exit)
'''


@pytest.fixture
def hooks(toy_project, monkeypatch):
    (toy_project.parent / "my_hooks.py").write_text(HOOKS)
    sys.modules.pop("my_hooks", None)
    module = __import__("my_hooks")
    yield module
    sys.modules.pop("my_hooks", None)


def make(toy_project, tmp_path, device, runner=None, **overrides):
    params = load_params(toy_project, {"runconfig.model_dir": str(tmp_path / device), **overrides})
    return PyTorchBaseRunner.create(params, device=device, runner=runner)


@pytest.mark.parametrize("device, engine", [("CPU", PyTorchRunner), ("CSX", PyTorchCSRunner)])
def test_one_custom_runner_class_serves_every_device(toy_project, tmp_path, hooks, device, engine):
    runner = make(toy_project, tmp_path, device, "my_hooks:HooksOnly",
                  **{"runconfig.max_steps": 10, "runconfig.eval_frequency": 5})
    assert isinstance(runner, hooks.HooksOnly) and isinstance(runner, engine)
    assert type(runner).__name__ == "HooksOnly" and type(runner).__module__ == "my_hooks"
    final = runner.run("train_and_eval")
    expected_device = "cpu" if device == "CPU" else "CSX"
    assert hooks.SEEN[0] == ("on_train_start", "HooksOnly", expected_device)
    metrics = [(x[1], x[2]) for x in hooks.SEEN if x[0] == "on_eval_metrics"]
    assert [step for step, _ in metrics] == [5, 10]
    assert metrics[-1][1] == final  # what run() returns, logs and writes
    logged = read_scalars(tmp_path / device / "eval")
    assert logged["loss"] == [(5, pytest.approx(metrics[0][1]["eval/loss"])), (10, pytest.approx(final["eval/loss"]))]


def test_the_cli_runs_one_runner_class_on_cpu_and_csx(toy_project, tmp_path, hooks):
    for device in ("CPU", "CSX"):
        result = CliRunner().invoke(cli, ["train", "--params", str(toy_project), "--model_dir", str(tmp_path / device),
                                          "--device", device, "--runner", "my_hooks:HooksOnly", "--max_steps", "2"])
        assert result.exit_code == 0, result.output
    assert [x[1:] for x in hooks.SEEN if x[0] == "on_train_start"] == [("HooksOnly", "cpu"), ("HooksOnly", "CSX")]


def test_a_runner_that_is_not_a_runner_is_a_params_error(toy_project, tmp_path):
    with pytest.raises(ParamsError, match=r"toy_models:NotARunner'? must be a subclass of cs_run.runners.PyTorchRunner "
                                          r"for --device CPU, or of cs_run.runners.PyTorchBaseRunner"):
        make(toy_project, tmp_path, "CPU", "toy_models:NotARunner")


@pytest.mark.parametrize("device", ["CPU", "CSX"])
def test_early_stopping_ends_with_a_checkpoint_and_resumes_its_count(toy_project, tmp_path, hooks, device):
    # No change of the loss counts with min_delta 100: the evaluations at steps 4 and 6 do not improve on
    # the first (step 2), so patience 2 stops at step 6 (mode: min, inferred for a loss).
    keys = {"runconfig.max_steps": 20, "runconfig.eval_frequency": 2, "runconfig.checkpoint_steps": 4,
            "runconfig.early_stopping_metric": "eval/loss", "runconfig.early_stopping_min_delta": 100,
            "runconfig.early_stopping_patience": 2}
    results = make(toy_project, tmp_path, device, "my_hooks:HooksOnly", **keys).run("train_and_eval")
    md = tmp_path / device
    assert sorted(p.name for p in md.glob("checkpoint_*")) == ["checkpoint_4.mdl", "checkpoint_6.mdl"]
    assert [x[1] for x in hooks.SEEN if x[0] == "on_eval_metrics"] == [2, 4, 6]  # step 6's is the final one
    assert results == [x[2] for x in hooks.SEEN if x[0] == "on_eval_metrics"][-1]
    assert hooks.SEEN[-1] == ("on_train_end", True)
    state = cs_run.load(str(md / "checkpoint_6.mdl"))
    assert (state["global_step"], state["early_stopping"]["wait"], state["early_stopping"]["best_step"]) == (6, 2, 2)
    assert "Early stopping at step 6: eval/loss=" in (md / "run.log").read_text()
    # A rerun resumes the count: the next evaluation (step 8) does not improve either, so it stops there.
    make(toy_project, tmp_path, device, **keys).run("train_and_eval")
    assert cs_run.load(str(md / "checkpoint_8.mdl"))["early_stopping"]["wait"] == 3
    assert not (md / "checkpoint_20.mdl").exists()


def test_early_stopping_is_checked_before_any_work(toy_project, tmp_path):
    needs = r"early_stopping_metric needs evaluations during training, which only train_and_eval runs"
    with pytest.raises(ParamsError, match=needs):
        make(toy_project, tmp_path, "CPU", **{"runconfig.early_stopping_metric": "eval/loss"}).run("train_and_eval")
    with pytest.raises(ParamsError, match=needs):  # mode train never evaluates (the Model Zoo's rule)
        make(toy_project, tmp_path, "CPU", **{"runconfig.early_stopping_metric": "eval/loss",
                                              "runconfig.eval_frequency": 2}).run("train")
    runner = make(toy_project, tmp_path, "CPU", **{"runconfig.early_stopping_metric": "eval/los",
                                                   "runconfig.eval_frequency": 2})
    with pytest.raises(ParamsError, match="'eval/los' is not a value the evaluation reports; did you mean "
                                          "'eval/loss'"):
        runner.run("train_and_eval")
    assert not list((tmp_path / "CPU").glob("checkpoint_*"))
    assert runner.global_step == 0


def loader(seed=0, n=32):
    return torch.utils.data.DataLoader(toy_data(seed, n), batch_size=4, shuffle=True,
                                       generator=torch.Generator().manual_seed(5))


def fit(model_dir, num_steps, device="CPU", **kwargs):
    with _reset_for_tests():
        model = WithLoss()
        trainer = Trainer(device=device, model_dir=str(model_dir), model=model, seed=1,
                          optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                          loop={"num_steps": num_steps}, logging={"log_steps": 2})
        trainer.fit(loader(), **kwargs)
        return {k: v.clone() for k, v in model.state_dict().items()}


def test_fit_ckpt_path_last_continues_from_the_newest_checkpoint(tmp_path, caplog):
    whole = fit(tmp_path / "whole", 10)
    fit(tmp_path / "split", 4, ckpt_path="last")  # nothing to continue from yet: a warning
    assert 'ckpt_path="last": no checkpoint in' in caplog.text
    continued = fit(tmp_path / "split", 6, ckpt_path="last")
    assert sorted(p.name for p in (tmp_path / "split").glob("checkpoint_*")) == ["checkpoint_10.mdl",
                                                                                 "checkpoint_4.mdl"]
    for key, value in whole.items():
        assert torch.equal(continued[key], value), key


def test_trainer_runner_argument_gets_the_eval_metrics_on_csx(tmp_path, hooks):
    with _reset_for_tests():
        model = WithLoss()
        trainer = Trainer(device="CSX", model_dir=str(tmp_path / "md"), model=model, runner=hooks.HooksOnly,
                          optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1),
                          loop={"num_steps": 4, "eval_frequency": 2})
        results = trainer.fit(loader(), loader(seed=1))
    assert isinstance(trainer.runner, PyTorchCSRunner) and isinstance(trainer.runner, hooks.HooksOnly)
    seen = [x[1:] for x in hooks.SEEN if x[0] == "on_eval_metrics"]
    assert [step for step, _ in seen] == [2, 4] and seen[-1][1] == results


SCRIPT = """
import logging, sys, torch
import cs_run
{setup}
torch.manual_seed(0)
model = torch.nn.Linear(6, 3)
class WithLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = model
    def forward(self, batch):
        return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])
data = torch.utils.data.TensorDataset(torch.randn(16, 6), torch.randint(0, 3, (16,)))
trainer = cs_run.Trainer(device="CPU", model_dir=sys.argv[1], model=WithLoss(),
                         optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1), loop={{"num_steps": 4}},
                         logging={{"log_steps": 2, "log_level": "{level}"}})
trainer.fit(torch.utils.data.DataLoader(data, batch_size=4))
"""


@pytest.mark.parametrize("setup, level, count", [("", "INFO", 1),
                                                 ("logging.basicConfig(level=logging.INFO)", "INFO", 1)])
def test_the_trainer_logs_to_the_console_once(tmp_path, setup, level, count):
    """A fresh process each: where the lines go depends on the process's logging setup."""
    code = textwrap.dedent(SCRIPT.format(setup=setup, level=level))
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "md")], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("| Train Device=cpu, Step=2, Loss=") == count, result.stderr
    assert ("| Train Device=cpu, Step=2, Loss=" in (tmp_path / "md" / "run.log").read_text()) == (level == "INFO")


def test_trainer_log_level_is_the_runconfig_logging_key():
    with _reset_for_tests():
        trainer = Trainer(device="CPU", model=WithLoss(), logging={"log_steps": 5, "log_level": "WARNING"})
    assert (trainer._runconfig.logging, trainer._runconfig.log_steps) == ("WARNING", 5)
    with _reset_for_tests(), pytest.raises(ParamsError, match="^Trainer: logging.log_level: 'LOUD' is not one of"):
        Trainer(device="CPU", model=WithLoss(), logging={"log_level": "LOUD"})
