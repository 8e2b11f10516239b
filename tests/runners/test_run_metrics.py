"""A run reports its own metrics only (docs/architecture.md, "A run's metrics"): those attached to its model,
those registered while it is created (its user modules imported, its model built) or runs, and the module-level
metrics of its code's modules, also when an earlier run imported them (the vendor's registry is process-wide);
never a metric that an earlier run or the program's other code left in the process-wide registry (before, a
vendor test's ``AccuracyMetric("accuracy")`` made every later run in the process report ``accuracy: nan``), and
never a metric that was not updated in the evaluation (the Model Zoo 2.x trainer skips it with a warning; before,
cs-run reported nan)."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import cs_run
from cs_run.frontends.trainer import Trainer
from cs_run.metrics import AccuracyMetric, MetricSet, get_all_metrics
from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner

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


class WithUnused(Net):
    def __init__(self, prefix):
        super().__init__(prefix)
        self.unused = AccuracyMetric(prefix + "/unused")  # attached to the model, never updated


def build_with_unused(prefix="eval", hidden=8, dropout=0.0):
    return WithUnused(prefix)


class WithTwin(Net):
    def __init__(self, prefix):
        super().__init__(prefix)
        self.twin = AccuracyMetric(prefix + "/accuracy")  # the same name as self.attached, another value

    def forward(self, batch):
        loss = super().forward(batch)
        if not self.training:
            x, y = batch
            self.twin(labels=y.int(), predictions=torch.zeros_like(y).int())  # the share of label 0
        return loss


def build_with_twin(prefix="eval", hidden=8, dropout=0.0):
    return WithTwin(prefix)
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
    runner, second = run("second", "md2")  # metric_models is cached now: its module-level metric is still the run's
    assert set(second) == {"eval/loss", "second/accuracy", "second/held_accuracy", "import/accuracy"}
    assert {"accuracy", "program/accuracy", "first/accuracy"} <= {m.name for _, m in get_all_metrics()}  # kept
    loader = DataLoader(TensorDataset(*sys.modules["toy_models"].make_tensors("eval", 32, -1)), batch_size=8)
    want = _hand_accuracy(runner.model, loader)
    assert second["second/accuracy"] == pytest.approx(want, abs=1e-12)
    assert second["second/held_accuracy"] == pytest.approx(want, abs=1e-12)
    assert second["import/accuracy"] == pytest.approx(want, abs=1e-12)  # reset by the second run's eval, then updated
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
        a2 = AccuracyMetric("set/a")  # same name: beside a, as in the registry
    after = AccuracyMetric("set/after")
    assert outer.metrics() == {"set/a.0": a, "set/a.1": a2, "set/b": b}
    assert inner.metrics() == {"set/b": b}
    module = torch.nn.Module()
    module.m, module.again = after, b
    outer.add_module(module)
    assert list(outer.metrics()) == ["set/a.0", "set/a.1", "set/b", "set/after"]
    assert list(dict(get_all_metrics())).count("set/a.1") == 1  # the registry numbers the same way
    b(labels=torch.tensor([1, 1]), predictions=torch.tensor([1, 1]))
    assert outer.compute()["set/b"] == 1.0
    outer.reset()
    assert float(b) != float(b) and float(before) == 0.5  # b reset (no samples: nan); before untouched


@pytest.mark.parametrize("device", ["CPU", "CSX"])
def test_a_metric_not_updated_in_an_evaluation_is_not_reported(metric_project, tmp_path, device, caplog):
    # Model Zoo 2.10 trainer/callbacks/metrics.py (ModelEvalMetrics.on_validate_end): a metric with
    # num_updates == 0 is skipped with a warning instead of logged. Two evaluations (step 2, periodic, and
    # step 4, the final one): on CSX the second replays the compiled eval step, whose update count is a
    # tensor the replay increments, so the used metrics are reported both times.
    params = load_params(metric_project, {"model.name": "metric_models:build_with_unused", "model.prefix": "m",
                                          "runconfig.model_dir": str(tmp_path / "md"), "runconfig.max_steps": 4,
                                          "runconfig.eval_frequency": 2, "runconfig.checkpoint_steps": 0})
    runner = PyTorchBaseRunner.create(params, device=device, mode="train_and_eval")
    with caplog.at_level("WARNING", logger="cs_run"):
        results = runner.run("train_and_eval")
    assert set(results) == {"eval/loss", "m/accuracy", "m/held_accuracy", "import/accuracy"}
    assert all(value == value for value in results.values())  # no nan
    assert caplog.text.count("Metric m/unused was not updated in this evaluation: not reported") == 2
    rows = (tmp_path / "md" / "eval" / "scalars.csv").read_text().splitlines()[1:]
    tags = sorted((int(step), tag) for step, tag, *_ in (row.split(",") for row in rows))
    assert tags == sorted((step, tag) for step in (2, 4) for tag in ("loss", "m/accuracy", "m/held_accuracy",
                                                                      "import/accuracy"))


def test_trainer_runs_in_one_process_report_the_module_level_metric_of_the_model_module(metric_project, tmp_path):
    # Two Trainer runs in one process of a model whose module defines a metric at module level and updates it
    # in forward: the vendor's registry (cerebras/pytorch/metrics/metric.py: Metric.registry, a class-level
    # dict of lists by name) keeps it for the process, so each run reports it, with its own evaluation's value.
    import importlib

    module = importlib.import_module("metric_models")  # imported by the program, before any run
    results = []
    for prefix in ("one", "two"):
        model = module.build_model(prefix)
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g))
        trainer = Trainer(device="CPU", model_dir=str(tmp_path / prefix), model=model,
                          optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1 if prefix == "one" else 0.5),
                          loop={"num_steps": 4})
        out = trainer.fit(DataLoader(data, batch_size=4, drop_last=True), DataLoader(data, batch_size=8))
        assert set(out) == {"eval/loss", f"{prefix}/accuracy", "import/accuracy"}
        assert out["import/accuracy"] == pytest.approx(_hand_accuracy(model, DataLoader(data, batch_size=8)))
        results.append(out)


@pytest.mark.parametrize("device", ["CPU", "CSX"])
def test_two_metrics_of_one_name_in_a_run_are_both_reported_numbered(metric_project, tmp_path, device):
    # The run's metrics are named as the vendor's get_all_metrics() names the registry
    # (cerebras/pytorch/metrics/metric.py: "name.i" when a name holds several metrics), counting the run's own
    # metrics: Model Zoo 2.3's runner (common/run_cstorch_flow.py:1285) logged every get_all_metrics() entry.
    # (Model Zoo 2.10's trainer, trainer/callbacks/metrics.py:38, keys a dict by metric.name, so the later
    # metric's value replaces the earlier's: cs-run reports both instead of dropping one.)
    params = load_params(metric_project, {"model.name": "metric_models:build_with_twin", "model.prefix": "m",
                                          "runconfig.model_dir": str(tmp_path / "md"), "runconfig.max_steps": 4,
                                          "runconfig.eval_frequency": 2, "runconfig.checkpoint_steps": 0})
    runner = PyTorchBaseRunner.create(params, device=device, mode="train_and_eval")
    results = runner.run("train_and_eval")
    assert list(results) == ["eval/loss", "import/accuracy", "m/accuracy.0", "m/accuracy.1", "m/held_accuracy"]
    labels = sys.modules["toy_models"].make_tensors("eval", 32, -1)[1]
    loader = DataLoader(TensorDataset(*sys.modules["toy_models"].make_tensors("eval", 32, -1)), batch_size=8)
    assert results["m/accuracy.0"] == pytest.approx(_hand_accuracy(runner.model, loader), abs=1e-12)
    assert results["m/accuracy.1"] == pytest.approx(float((labels == 0).float().mean()), abs=1e-12)
    rows = (tmp_path / "md" / "eval" / "scalars.csv").read_text().splitlines()[1:]
    tags = sorted((int(step), tag) for step, tag, *_ in (row.split(",") for row in rows))
    assert tags == sorted((step, tag) for step in (2, 4) for tag in ("loss", "m/accuracy.0", "m/accuracy.1",
                                                                      "m/held_accuracy", "import/accuracy"))
