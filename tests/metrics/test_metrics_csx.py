"""Every metric updated inside a step traced by the CSX engine equals the eager CPU result."""

from __future__ import annotations

import pytest
import torch
from test_metrics_table import N_BATCHES, ROWS, _inputs

import cs_run as cstorch
from cs_run.backend import _reset_for_tests


def _run(backend_type, row, tmp_path):
    _, factory, make_batch, _ = row
    cstorch.backend(backend_type, artifact_dir=tmp_path)
    metric = factory()
    body_runs = []

    @cstorch.trace
    def eval_step(batch):
        body_runs.append(1)
        metric.update(**batch)
        return metric.compute()

    values = []

    @cstorch.step_closure
    def record(value):
        values.append(float(value))

    with torch.no_grad():
        for seed in range(N_BATCHES):
            record(eval_step(_inputs(make_batch(seed))))
    return (
        len(body_runs),
        values,
        float(metric),
        {n: b.clone() for n, b in metric.named_buffers()},
    )


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_metric_on_csx_matches_cpu(row, tmp_path):
    with _reset_for_tests():
        csx = _run("CSX", row, tmp_path / "csx")
    with _reset_for_tests():
        cpu = _run("CPU", row, tmp_path / "cpu")
    assert csx[0] == 1 and cpu[0] == N_BATCHES
    assert csx[1] == pytest.approx(cpu[1], rel=1e-12, abs=1e-12)
    assert csx[2] == pytest.approx(cpu[2], rel=1e-12, abs=1e-12)
    for name, value in cpu[3].items():
        torch.testing.assert_close(
            csx[3][name], value, rtol=1e-12, atol=1e-12, msg=name
        )


def test_reset_all_metrics_between_csx_evals(tmp_path):
    """The eval runner resets before each eval; the compiled step keeps updating the same state."""
    with _reset_for_tests():
        cstorch.backend("CSX", artifact_dir=tmp_path)
        acc = cstorch.metrics.AccuracyMetric("eval/accuracy")

        @cstorch.trace
        def eval_step(labels, preds):
            acc(labels=labels, predictions=preds)

        labels = torch.tensor([0, 1, 2, 3])
        for preds, want in (
            (torch.tensor([0, 1, 0, 0]), 0.5),
            (torch.tensor([0, 1, 2, 0]), 0.75),
        ):
            cstorch.metrics.reset_all_metrics()
            for _ in range(2):
                eval_step(labels, preds)
            assert cstorch.metrics.compute_all_metrics() == {"eval/accuracy": want}
