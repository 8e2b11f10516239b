"""A run reports its own metrics only (docs/architecture.md, "A run's metrics"): those attached to its model,
those registered while it is created (its user modules imported, its model built) or runs; never a metric that
an earlier run or the program's other code left in the process-wide registry (before, a vendor test's
``AccuracyMetric("accuracy")`` made every later run in the process report ``accuracy: nan``)."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import cs_run
from cs_run.metrics import AccuracyMetric, MetricSet, get_all_metrics
from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner
from cs_run.trainer import Trainer

MODULE = '''
import torch
import torch.nn.functional as F

from cs_run.metrics import AccuracyMetric

AT_IMPORT = AccuracyMetric("import/accuracy")  # registered when the run imports this module


class Net(torch.nn.Module):
    def __init__(self, prefix):
        super().__init__()
        self.fc = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        self.attached = AccuracyMetric(prefix + "/accuracy")  # a sub-module: attached to the model
        self.held = {"acc": AccuracyMetric(prefix + "/held_accuracy")}  # built with the model, not attached

    def forward(self, batch):
        x, y = batch
        logits = self.fc(x)
        if not self.training:
            pred = logits.argmax(-1).int()
            for metric in (self.attached, self.held["acc"], AT_IMPORT):
                metric(labels=y.int(), predictions=pred)
        return F.cross_entropy(logits, y)


def build_model(prefix="eval", hidden=8, dropout=0.0):  # toy_project's params set hidden and dropout
    return Net(prefix)
'''


@pytest.fixture
def metric_project(toy_project):
    """toy_project's data and params with the model of MODULE (imported afresh by each run's first create)."""
    (toy_project.parent / "metric_models.py").write_text(MODULE)
    sys.modules.pop("metric_models", None)
    yield toy_project
    sys.modules.pop("metric_models", None)


def _hand_accuracy(model: torch.nn.Module, loader) -> float:
    """The eval loader's accuracy with the model's final weights, computed eagerly here."""
    model.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in loader:
            right += int((model.fc(x).argmax(-1) == y).sum())
            total += len(y)
    return right / total


@pytest.mark.parametrize("device", ["CPU", "CSX"])
def test_a_run_reports_its_own_metrics_and_none_left_by_earlier_runs_or_the_program(metric_project, tmp_path,
                                                                                     device):
    stale = AccuracyMetric("accuracy")  # what a vendor test left registered; never updated: nan
    program = AccuracyMetric("program/accuracy")  # the program's own metric, with a value
    program(labels=torch.tensor([1, 2, 3, 4]), predictions=torch.tensor([1, 2, 0, 0]))

    def run(prefix, model_dir):
        params = load_params(metric_project, {"model.name": "metric_models:build_model", "model.prefix": prefix,
                                              "runconfig.model_dir": str(tmp_path / model_dir),
                                              "runconfig.max_steps": 4, "runconfig.checkpoint_steps": 0})
        runner = PyTorchBaseRunner.create(params, device=device, mode="train_and_eval")
        return runner, runner.run("train_and_eval")

    _, first = run("first", "md1")
    assert set(first) == {"eval/loss", "first/accuracy", "first/held_accuracy", "import/accuracy"}
    runner, second = run("second", "md2")  # metric_models is cached now: import/accuracy is the first run's
    assert set(second) == {"eval/loss", "second/accuracy", "second/held_accuracy"}
    assert {"accuracy", "program/accuracy", "first/accuracy"} <= set(get_all_metrics())  # still registered
    loader = DataLoader(TensorDataset(*sys.modules["toy_models"].make_tensors("eval", 32, -1)), batch_size=8)
    want = _hand_accuracy(runner.model, loader)
    assert second["second/accuracy"] == pytest.approx(want, abs=1e-12)
    assert second["second/held_accuracy"] == pytest.approx(want, abs=1e-12)
    assert float(program) == 0.5  # the run neither reported nor reset the program's metric
    assert float(stale) != float(stale)  # nan: untouched


def test_a_trainer_reports_the_metrics_of_a_model_built_before_it(tmp_path):
    sys.modules.pop("metric_models", None)
    namespace: dict = {}
    exec(compile(MODULE, "metric_models_inline", "exec"), namespace)  # noqa: S102 - the test's own model code
    model = namespace["build_model"]("prebuilt")  # its metrics exist before the Trainer and its run
    AccuracyMetric("accuracy")  # a leftover, as above
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g))
    trainer = Trainer(device="CPU", model_dir=str(tmp_path / "md"), model=model,
                      optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1), loop={"num_steps": 4})
    results = trainer.fit(DataLoader(data, batch_size=4, drop_last=True), DataLoader(data, batch_size=8))
    # attached: reported; the dict-held one and the module-level one were built before the run: not the run's
    assert set(results) == {"eval/loss", "prebuilt/accuracy"}
    assert results["prebuilt/accuracy"] == pytest.approx(_hand_accuracy(model, DataLoader(data, batch_size=8)))


def test_a_metric_set_collects_while_its_block_runs_and_resets_only_its_own():
    before = AccuracyMetric("set/before")
    before(labels=torch.tensor([1, 1]), predictions=torch.tensor([1, 0]))
    outer, inner = MetricSet(), MetricSet()
    with outer.collecting():
        a = AccuracyMetric("set/a")
        with inner.collecting():
            b = AccuracyMetric("set/b")
        a2 = AccuracyMetric("set/a")  # same name: replaces a, as in the registry
    after = AccuracyMetric("set/after")
    assert outer.metrics() == {"set/b": b, "set/a": a2} and a not in outer.metrics().values()
    assert inner.metrics() == {"set/b": b}
    module = torch.nn.Module()
    module.m = after
    outer.add_module(module)
    assert list(outer.metrics()) == ["set/b", "set/a", "set/after"]
    b(labels=torch.tensor([1, 1]), predictions=torch.tensor([1, 1]))
    assert outer.compute()["set/b"] == 1.0
    outer.reset()
    assert float(b) != float(b) and float(before) == 0.5  # b reset (no samples: nan); before untouched
