"""The runners' model contract: ``forward(batch)`` returns the loss, a scalar floating-point tensor. A
model that returns something else (its logits, a (loss, logits) tuple, ...) is one ``Error:`` line naming
its forward's file:line, exit 1, on CPU and CSX alike (before: torch's error from inside the step, shown
as an internal error of cs-run)."""

from __future__ import annotations

import itertools
import sys

import pytest
from click.testing import CliRunner

from cs_run.frontends.cli import cli

MODULE = '''import torch


class Net(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.layer = torch.nn.Linear(3, 2)
        self.kind = kind

    def forward(self, batch):
        x, y = batch
        logits = self.layer(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        return {"good": loss, "logits": logits, "tuple": (loss, logits), "dict": {"loss": loss}, "none": None,
                "int": y.sum(), "constant": torch.tensor(0.5), "one-element": loss.reshape(1, 1)}[self.kind]


def build(kind: str = "good"):
    return Net(kind)


def data(split, batch_size):
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(16, 3, generator=g), torch.randint(0, 2, (16,), generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=batch_size)
'''

PARAMS = '''train_input:
  data_fn: "{module}:data"
  batch_size: 4
eval_input:
  data_fn: "{module}:data"
  batch_size: 4
model:
  name: "{module}:build"
optimizer:
  optimizer_type: SGD
  learning_rate: 0.1
runconfig:
  max_steps: 2
'''

FORWARD_LINE = next(i for i, line in enumerate(MODULE.splitlines(), 1) if "def forward" in line)

WRONG = {
    "logits": "returned a tensor of shape [4, 2] instead of the loss (reduce it, e.g. with "
              "torch.nn.functional.cross_entropy(logits, labels))",
    "tuple": "returned tuple instead of the loss (return the loss alone: `return loss`, not `return loss, logits`)",
    "dict": "returned dict instead of the loss (return the loss alone: `return loss`, not `return loss, logits`)",
    "none": "returned NoneType instead of the loss",
    "int": "returned a torch.int64 tensor instead of the loss",
    "constant": "returned a loss that does not depend on the model's parameters (it has no grad_fn)",
}

_names = itertools.count()


@pytest.fixture
def project(tmp_path, monkeypatch):
    module = f"contract_models_{next(_names)}"
    (tmp_path / f"{module}.py").write_text(MODULE)
    (tmp_path / "params.yaml").write_text(PARAMS.format(module=module))
    monkeypatch.setattr(sys, "path", list(sys.path))
    return tmp_path, module


def _run(command, project, kind, device, name):
    tmp, _ = project
    return CliRunner().invoke(cli, [command, "--params", str(tmp / "params.yaml"), "--model_dir", str(tmp / name),
                                    "--device", device, "--compile_tier", "fx", "--set", f"model.kind={kind}"])


def _error(result) -> str:
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


def _expected(project, problem):
    tmp, module = project
    return (f"Error: the model's forward(batch) {problem}: it must return the loss, a scalar floating-point tensor "
            f"(Net.forward at {tmp / module}.py:{FORWARD_LINE})")


@pytest.mark.parametrize("kind", list(WRONG))
def test_a_forward_that_does_not_return_the_loss_is_one_line_naming_it(kind, project):
    result = _run("train", project, kind, "CPU", "md")
    assert result.exit_code == 1
    assert _error(result) == _expected(project, WRONG[kind])
    assert not list((project[0] / "md").glob("checkpoint_*"))


@pytest.mark.parametrize("kind", ["logits", "tuple"])
def test_the_traced_step_says_the_same(kind, project):
    result = _run("train", project, kind, "CSX", "md")
    assert result.exit_code == 1
    assert _error(result) == _expected(project, WRONG[kind])


def test_eval_checks_the_forward_too_and_a_one_element_loss_is_a_loss(project):
    result = _run("eval", project, "logits", "CPU", "md")
    assert result.exit_code == 1 and _error(result) == _expected(project, WRONG["logits"])
    for kind in ("good", "one-element"):
        assert _run("train-and-eval", project, kind, "CPU", kind).exit_code == 0

