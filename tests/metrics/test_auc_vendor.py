"""AUCMetric (ROC and PR, every summation method, custom thresholds) against the real vendor package's
values (golden file from tools/vendor_oracle) and against hand-made curves."""

from __future__ import annotations

import pytest
import torch

from cs_run.metrics import AUCMetric
from tests.optim import vendor_golden

_CASES = vendor_golden.meta()["metrics"]["cases"]


@pytest.mark.parametrize("case_id", sorted(_CASES))
def test_auc_matches_vendor(case_id):
    case = _CASES[case_id]
    metric = AUCMetric(**case["kwargs"])
    for labels, preds in vendor_golden.meta()["metrics"]["batches"]:
        metric(torch.tensor(labels), torch.tensor(preds, dtype=torch.float32))
    # the vendor counts in float32 and returns a Python float of a float32 sum
    assert float(metric.compute()) == pytest.approx(case["value"], rel=1e-6)


def test_pr_auc_of_a_perfect_and_of_a_constant_classifier():
    perfect = AUCMetric(curve="PR", num_thresholds=11, name="pr")
    perfect(torch.tensor([0, 0, 1, 1]), torch.tensor([0.1, 0.2, 0.8, 0.9]))
    assert float(perfect.compute()) == pytest.approx(1.0)
    # every prediction equal: recall jumps 0 -> 1 at precision = base rate (1/4); precision is 0 (no
    # positive prediction) on the other side, so the upper sum is 1/4 and the lower one 0
    for method, want in (("majoring", 0.25), ("minoring", 0.0)):
        constant = AUCMetric(curve="PR", num_thresholds=11, summation_method=method, name="pr")
        constant(torch.tensor([1, 0, 0, 0]), torch.tensor([0.5, 0.5, 0.5, 0.5]))
        assert float(constant.compute()) == pytest.approx(want)


def test_pr_majoring_bounds_minoring():
    labels, preds = torch.tensor([1, 0, 1, 0, 1, 1, 0]), torch.tensor([0.9, 0.8, 0.7, 0.4, 0.35, 0.2, 0.1])
    values = {}
    for method in ("minoring", "interpolation", "majoring"):
        metric = AUCMetric(curve="PR", num_thresholds=50, summation_method=method, name="pr")
        metric(labels, preds)
        values[method] = float(metric.compute())
    assert values["minoring"] <= values["interpolation"] <= values["majoring"]
