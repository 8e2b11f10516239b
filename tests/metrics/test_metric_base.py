"""The Metric base: registry, reset in place, float(), device-free tensor state."""

from __future__ import annotations

import pytest
import torch
from sklearn.metrics import accuracy_score

import cs_run as cstorch
from cs_run.metrics import (
    AccuracyMetric,
    compute_all_metrics,
    get_all_metrics,
    reset_all_metrics,
)


def _batch(seed: int, n: int = 50, classes: int = 5):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    preds = torch.randint(0, classes, (n,), generator=g)
    mask = (torch.rand(n, generator=g) > 0.3).float()
    return labels, preds, mask


def test_registry_keeps_repeated_names_as_the_vendor_reports_them():
    # The vendor's registry (cerebras/pytorch/metrics/metric.py: Metric.registry, a defaultdict(list) that
    # every Metric appends itself to) and get_all_metrics(), a generator of (name, metric) pairs grouped by
    # name, "name.i" when a name holds several metrics, the bare name when it holds one. Checked with the
    # vendor's wheel: x, y, x registered -> [("x.0", x1), ("x.1", x2), ("y", y)].
    a = AccuracyMetric("eval/accuracy")
    b = AccuracyMetric("other")
    assert list(get_all_metrics()) == [("eval/accuracy", a), ("other", b)]
    a2 = AccuracyMetric("eval/accuracy")
    pairs = list(get_all_metrics())
    assert [name for name, _ in pairs] == ["eval/accuracy.0", "eval/accuracy.1", "other"]
    assert [m for _, m in pairs] == [a, a2, b] and pairs[0][1] is a and pairs[1][1] is a2
    for metric, correct in ((a, [1, 1]), (a2, [1, 0]), (b, [0, 0])):
        metric(labels=torch.tensor([1, 1]), predictions=torch.tensor(correct))
    assert compute_all_metrics() == {"eval/accuracy.0": 1.0, "eval/accuracy.1": 0.5, "other": 0.0}
    reset_all_metrics()
    assert all(m.num_updates == 0 for m in (a, a2, b))
    cstorch.metrics.unregister_metric(a)  # one metric: its name is held once again
    assert list(get_all_metrics()) == [("eval/accuracy", a2), ("other", b)]
    cstorch.metrics.register_metric(a2)  # already registered: stays where it is
    assert list(get_all_metrics()) == [("eval/accuracy", a2), ("other", b)]
    AccuracyMetric("other")
    cstorch.metrics.unregister_metric("other")  # a name: every metric registered under it
    assert list(get_all_metrics()) == [("eval/accuracy", a2)]
    assert cstorch.metrics.AccuracyMetric is AccuracyMetric


def test_accuracy_against_sklearn_with_mask():
    acc = AccuracyMetric("acc")
    all_l, all_p, all_m = [], [], []
    for seed in range(3):
        labels, preds, mask = _batch(seed)
        acc(labels=labels, predictions=preds, weights=mask)
        all_l.append(labels), all_p.append(preds), all_m.append(mask)
    want = accuracy_score(
        torch.cat(all_l), torch.cat(all_p), sample_weight=torch.cat(all_m)
    )
    assert float(acc) == pytest.approx(want, abs=1e-12)
    assert compute_all_metrics() == {"acc": pytest.approx(want, abs=1e-12)}


def test_accuracy_unweighted_and_call_returns_running_value():
    acc = AccuracyMetric("acc")
    labels, preds, _ = _batch(0)
    value = acc(labels=labels.reshape(5, 10), predictions=preds.reshape(5, 10))
    assert isinstance(value, torch.Tensor)
    assert value.item() == pytest.approx(accuracy_score(labels, preds))


def test_accuracy_nonbinary_weights_follow_model_zoo():
    # numerator weighted, denominator counts positive weights (hand computation)
    acc = AccuracyMetric("acc")
    labels = torch.tensor([0, 1, 2, 3])
    preds = torch.tensor([0, 1, 0, 3])
    weights = torch.tensor([2.0, 0.5, 1.0, 0.0])
    acc.update(labels, preds, weights)
    assert float(acc) == pytest.approx((2.0 + 0.5) / 3)


def test_reset_all_is_in_place():
    acc = AccuracyMetric("acc")
    state = acc.total_correct_predictions
    labels, preds, _ = _batch(1)
    acc.update(labels, preds)
    reset_all_metrics()
    assert acc.total_correct_predictions is state
    assert (
        acc.total_correct_predictions.item() == 0 and acc.total_num_tokens.item() == 0
    )
    assert torch.isnan(acc.compute())
    acc.update(labels, preds)
    assert float(acc) == pytest.approx(accuracy_score(labels, preds))


def test_state_is_discoverable_as_buffers():
    acc = AccuracyMetric("acc")
    assert sorted(n for n, _ in acc.named_buffers()) == [
        "_updates",  # the update count: a compiled step replays its increment too
        "total_correct_predictions",
        "total_num_tokens",
    ]
    assert acc.state_names() == ["total_correct_predictions", "total_num_tokens"]
    assert acc.state_dict() == {}  # not persistent: stays out of a model's checkpoint


def test_metric_inside_a_model_moves_but_keeps_dtype_and_stays_out_of_state_dict():
    model = torch.nn.Linear(2, 2)
    model.accuracy = AccuracyMetric("eval/accuracy")
    assert set(model.state_dict()) == {"weight", "bias"}
    model.to(torch.bfloat16)
    assert model.weight.dtype == torch.bfloat16
    assert model.accuracy.total_num_tokens.dtype == torch.float64
    labels = torch.zeros(1000, dtype=torch.long)
    model.accuracy.update(labels, labels)
    assert float(model.accuracy.total_num_tokens) == 1000


@pytest.mark.parametrize(
    "labels, preds, weights, match",
    [
        (torch.zeros(4), torch.zeros(5), None, "same shape"),
        (torch.zeros(4), torch.zeros(4), torch.ones(3), "weights"),
    ],
)
def test_accuracy_bad_inputs(labels, preds, weights, match):
    with pytest.raises(ValueError, match=match):
        AccuracyMetric("acc").update(labels, preds, weights)


def test_default_and_bad_name():
    with pytest.raises(TypeError, match="name"):  # required, as in the vendor's 2.10 Metric(name)
        AccuracyMetric()
    assert AccuracyMetric(name=None).name == "AccuracyMetric"
    with pytest.raises(TypeError, match="must be a string"):
        AccuracyMetric(3)


def test_accuracy_traces_in_fake_mode_and_replays_like_eager(trace_and_replay):
    traced, eager = AccuracyMetric("traced"), AccuracyMetric("eager")
    for seed in range(3):
        labels, preds, mask = _batch(seed)
        out = trace_and_replay(traced, labels=labels, predictions=preds, weights=mask)
        want = eager(labels=labels, predictions=preds, weights=mask)
        assert torch.equal(out, want)
    assert torch.equal(
        traced.total_correct_predictions, eager.total_correct_predictions
    )
    assert torch.equal(traced.total_num_tokens, eager.total_num_tokens)


def test_num_updates_counts_each_update_once_and_reset_clears_it():
    # The vendor's Metric.num_updates (cerebras/pytorch/metrics/metric.py: +1 per update() call, 0 after
    # reset()); here a tensor, so a compiled step's replays count as the eager calls do.
    class Nested(AccuracyMetric):  # an update that calls its base's counts once
        def update(self, labels, predictions, weights=None, dtype=None):
            super().update(labels, predictions, weights, dtype)

    for metric in (AccuracyMetric("count/plain"), Nested("count/nested")):
        labels, preds, _ = _batch(1)
        assert metric.num_updates == 0
        metric.update(labels, preds)
        metric(labels=labels, predictions=preds)  # forward = update + compute
        assert metric.num_updates == 2
        metric.compute()
        float(metric)
        assert metric.num_updates == 2  # reading is not updating
        metric.reset()
        assert metric.num_updates == 0
