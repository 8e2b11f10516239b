"""Every metric against an independent reference (scikit-learn, numpy, plain Python) on random data,
with weights and ignored classes, eagerly and traced with make_fx (fake mode) then replayed.

One row per metric variant: (id, factory, batch generator, reference on the concatenated batches).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn import metrics as skm

from cs_run.metrics import (
    AccuracyMetric,
    AUCMetric,
    DiceCoefficientMetric,
    FBetaScoreMetric,
    MeanIOUMetric,
    MeanMetric,
    MeanPerClassAccuracyMetric,
    PerplexityMetric,
    PrecisionAtKMetric,
    RecallAtKMetric,
)

C = 5  # classes
N_BATCHES = 3


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def classes_batch(seed, weighted, n=64):
    g = _gen(seed)
    labels = torch.randint(0, C, (4, n // 4), generator=g)
    # predictions agree with labels ~half the time, so scores are far from 0 and 1
    noise = torch.randint(0, C, labels.shape, generator=g)
    preds = torch.where(torch.rand(labels.shape, generator=g) < 0.5, labels, noise)
    out = {"labels": labels, "predictions": preds}
    if weighted == "mask":
        out["weights"] = (torch.rand(labels.shape, generator=g) > 0.25).float()
    elif weighted == "real":
        out["weights"] = torch.rand(labels.shape, generator=g) * 2
    return out


def _np(batches, key):
    return np.concatenate([b[key].reshape(-1).numpy() for b in batches])


def _w(batches):
    return _np(batches, "weights") if "weights" in batches[0] else None


def ref_fbeta(beta, average, ignore):
    def ref(batches):
        y, p = _np(batches, "labels"), _np(batches, "predictions")
        keep = [c for c in range(C) if c not in ignore]
        return skm.fbeta_score(
            y,
            p,
            beta=beta,
            average=average,
            labels=keep,
            sample_weight=_w(batches),
            zero_division=0,
        )

    return ref


def _present(batches, ignore):
    y, p = _np(batches, "labels"), _np(batches, "predictions")
    w = _w(batches)
    on = np.ones_like(y, dtype=bool) if w is None else w != 0
    return [
        c
        for c in range(C)
        if c not in ignore and ((y == c) & on).any() | ((p == c) & on).any()
    ]


def ref_iou(ignore):
    def ref(batches):
        y, p = _np(batches, "labels"), _np(batches, "predictions")
        return skm.jaccard_score(
            y,
            p,
            labels=_present(batches, ignore),
            average="macro",
            sample_weight=_w(batches),
        )

    return ref


def ref_dice(ignore):
    def ref(batches):
        y, p = _np(batches, "labels"), _np(batches, "predictions")
        return skm.f1_score(
            y,
            p,
            labels=_present(batches, ignore),
            average="macro",
            sample_weight=_w(batches),
        )

    return ref


def ref_accuracy(batches):
    return skm.accuracy_score(
        _np(batches, "labels"), _np(batches, "predictions"), sample_weight=_w(batches)
    )


def ref_balanced(batches):
    return skm.balanced_accuracy_score(
        _np(batches, "labels"), _np(batches, "predictions"), sample_weight=_w(batches)
    )


def perplexity_batch(seed, weighted):
    g = _gen(seed)
    logits = torch.randn(6, 7, C, generator=g)
    labels = torch.randint(0, C, (6, 7), generator=g)
    mask = (
        (torch.rand(6, 7, generator=g) > 0.3).float() if weighted else torch.ones(6, 7)
    )
    nll = torch.nn.functional.cross_entropy(
        logits.double().reshape(-1, C), labels.reshape(-1), reduction="none"
    )
    out = {
        "labels": labels,
        "loss": (nll * mask.reshape(-1)).sum(),
        "_logits": logits,
        "_mask": mask,
    }
    if weighted:
        out["weights"] = mask
    return out


def ref_perplexity(batches):
    total, count = 0.0, 0
    # log-softmax in numpy float64, independent of torch's cross_entropy
    for b in batches:
        x = b["_logits"].double().numpy().reshape(-1, C)
        logp = (
            x
            - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))
            - x.max(1, keepdims=True)
        )
        m = b["_mask"].numpy().reshape(-1)
        total += float(
            -(logp[np.arange(len(x)), b["labels"].numpy().reshape(-1)] * m).sum()
        )
        count += int((m > 0).sum())
    return math.exp(total / count)


def mean_batch(seed, weighted):
    g = _gen(seed)
    out = {"values": torch.randn(3, 5, generator=g)}
    if weighted:
        out["weights"] = torch.rand(3, 5, generator=g)
    return out


def ref_mean(batches):
    return np.average(_np(batches, "values"), weights=_w(batches))


def at_k_batch(seed, weighted, num_labels):
    g = _gen(seed)
    scores = torch.randn(12, 8, generator=g)
    labels = torch.stack(
        [torch.randperm(8, generator=g)[:num_labels] for _ in range(12)]
    )
    out = {"labels": labels, "predictions": scores}
    if weighted:
        out["weights"] = torch.rand(12, generator=g)
    return out


def ref_at_k(k, kind):
    def ref(batches):  # plain Python sets
        tp = fx = 0.0
        for b in batches:
            w = b.get("weights", torch.ones(len(b["labels"])))
            for row_labels, row_scores, wi in zip(
                b["labels"].tolist(), b["predictions"], w.tolist()
            ):
                top = set(np.argsort(-row_scores.numpy(), kind="stable")[:k].tolist())
                hits = len(top & set(row_labels))
                tp += hits * wi
                fx += ((k if kind == "precision" else len(row_labels)) - hits) * wi
        return tp / (tp + fx)

    return ref


def auc_batch(seed, weighted, n_thresholds):
    g = _gen(seed)
    labels = (torch.rand(40, generator=g) > 0.6).long()
    # bucket midpoints: no two distinct predictions share a threshold bucket, so the grid is exact
    bucket = torch.randint(0, n_thresholds - 1, (40,), generator=g) + labels * 3
    preds = (
        (bucket.clamp(max=n_thresholds - 2).double() + 0.5) / (n_thresholds - 1)
    ).float()
    out = {"labels": labels, "predictions": preds}
    if weighted:
        out["weights"] = torch.rand(40, generator=g)
    return out


def ref_auc(batches):
    return skm.roc_auc_score(
        _np(batches, "labels"), _np(batches, "predictions"), sample_weight=_w(batches)
    )


ROWS = [
    (
        "accuracy",
        lambda: AccuracyMetric("m"),
        lambda s: classes_batch(s, None),
        ref_accuracy,
    ),
    (
        "accuracy-mask",
        lambda: AccuracyMetric("m"),
        lambda s: classes_batch(s, "mask"),
        ref_accuracy,
    ),
    (
        "mpca",
        lambda: MeanPerClassAccuracyMetric(C, name="m"),
        lambda s: classes_batch(s, None),
        ref_balanced,
    ),
    (
        "mpca-weights",
        lambda: MeanPerClassAccuracyMetric(C, name="m"),
        lambda s: classes_batch(s, "real"),
        ref_balanced,
    ),
    (
        "fbeta-micro",
        lambda: FBetaScoreMetric(C, name="m"),
        lambda s: classes_batch(s, None),
        ref_fbeta(1.0, "micro", []),
    ),
    (
        "fbeta-micro-b2-ignore",
        lambda: FBetaScoreMetric(C, beta=2.0, ignore_labels=[0, 3], name="m"),
        lambda s: classes_batch(s, "real"),
        ref_fbeta(2.0, "micro", [0, 3]),
    ),
    (
        "fbeta-macro-ignore",
        lambda: FBetaScoreMetric(
            C, beta=0.5, average_type="macro", ignore_labels=[1], name="m"
        ),
        lambda s: classes_batch(s, "mask"),
        ref_fbeta(0.5, "macro", [1]),
    ),
    (
        "miou",
        lambda: MeanIOUMetric(C, name="m"),
        lambda s: classes_batch(s, None),
        ref_iou([]),
    ),
    (
        "miou-ignore-w",
        lambda: MeanIOUMetric(C, ignore_classes=[2], name="m"),
        lambda s: classes_batch(s, "real"),
        ref_iou([2]),
    ),
    (
        "dice",
        lambda: DiceCoefficientMetric(C, name="m"),
        lambda s: classes_batch(s, None),
        ref_dice([]),
    ),
    (
        "dice-ignore-mask",
        lambda: DiceCoefficientMetric(C, ignore_classes=[0, 4], name="m"),
        lambda s: classes_batch(s, "mask"),
        ref_dice([0, 4]),
    ),
    (
        "perplexity",
        lambda: PerplexityMetric("m"),
        lambda s: perplexity_batch(s, False),
        ref_perplexity,
    ),
    (
        "perplexity-mask",
        lambda: PerplexityMetric("m"),
        lambda s: perplexity_batch(s, True),
        ref_perplexity,
    ),
    ("mean", lambda: MeanMetric("m"), lambda s: mean_batch(s, False), ref_mean),
    ("mean-weights", lambda: MeanMetric("m"), lambda s: mean_batch(s, True), ref_mean),
    (
        "p@3",
        lambda: PrecisionAtKMetric(3, name="m"),
        lambda s: at_k_batch(s, False, 2),
        ref_at_k(3, "precision"),
    ),
    (
        "p@2-w",
        lambda: PrecisionAtKMetric(2, name="m"),
        lambda s: at_k_batch(s, True, 3),
        ref_at_k(2, "precision"),
    ),
    (
        "r@3",
        lambda: RecallAtKMetric(3, name="m"),
        lambda s: at_k_batch(s, False, 2),
        ref_at_k(3, "recall"),
    ),
    (
        "r@1-w",
        lambda: RecallAtKMetric(1, name="m"),
        lambda s: at_k_batch(s, True, 1),
        ref_at_k(1, "recall"),
    ),
    ("auc", lambda: AUCMetric(name="m"), lambda s: auc_batch(s, False, 200), ref_auc),
    (
        "auc-w-11",
        lambda: AUCMetric(11, name="m"),
        lambda s: auc_batch(s, True, 11),
        ref_auc,
    ),
]


def _inputs(batch):
    return {k: v for k, v in batch.items() if not k.startswith("_")}


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_metric_matches_reference(row):
    _, factory, make_batch, reference = row
    metric = factory()
    batches = [make_batch(seed) for seed in range(N_BATCHES)]
    for b in batches:
        metric.update(**_inputs(b))
    assert float(metric) == pytest.approx(reference(batches), rel=1e-9, abs=1e-12)
    metric.reset()
    assert all(float(t.abs().sum()) == 0 for t in metric.buffers())


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_metric_update_traces_and_replays_like_eager(row, trace_and_replay):
    _, factory, make_batch, _ = row
    eager = factory()
    eager.name = "eager"
    traced = factory()
    for seed in range(N_BATCHES):
        inputs = _inputs(make_batch(seed))
        want = eager(**inputs)
        got = trace_and_replay(traced, **inputs)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for (name, a), (_, b) in zip(traced.named_buffers(), eager.named_buffers()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)


def test_at_k_single_label_matches_sklearn_top_k_accuracy():
    b = at_k_batch(7, True, 1)
    y, scores, w = (
        b["labels"].reshape(-1).numpy(),
        b["predictions"].numpy(),
        b["weights"].numpy(),
    )
    want = skm.top_k_accuracy_score(
        y, scores, k=3, labels=list(range(8)), sample_weight=w
    )
    recall, precision = RecallAtKMetric(3, name="r"), PrecisionAtKMetric(3, name="p")
    recall.update(**b), precision.update(**b)
    assert float(recall) == pytest.approx(want, rel=1e-9)
    assert float(precision) == pytest.approx(want / 3, rel=1e-9)


def test_auc_on_continuous_predictions_approximates_sklearn():
    g = _gen(11)
    labels = (torch.rand(500, generator=g) > 0.5).long()
    preds = torch.sigmoid(torch.randn(500, generator=g) + labels.float())
    auc = AUCMetric(name="auc")
    auc.update(labels, preds)
    assert float(auc) == pytest.approx(
        skm.roc_auc_score(labels.numpy(), preds.numpy()), abs=5e-3
    )


def test_mean_iou_and_dice_are_zero_without_data_and_absent_classes_are_skipped():
    miou = MeanIOUMetric(3, name="iou")
    assert float(miou) == 0.0
    miou.update(
        torch.tensor([0, 0, 1]), torch.tensor([0, 1, 1])
    )  # class 2 absent: mean of 2 classes
    assert float(miou) == pytest.approx((1 / 2 + 1 / 2) / 2)


@pytest.mark.parametrize(
    "factory, match",
    [
        (lambda: FBetaScoreMetric(1), "num_classes"),
        (lambda: FBetaScoreMetric(3, beta=0), "beta"),
        (lambda: FBetaScoreMetric(3, average_type="weighted"), "average_type"),
        (lambda: MeanIOUMetric(3, ignore_classes=[3]), "ignored classes"),
        (lambda: DiceCoefficientMetric(2, ignore_classes=[0, 1]), "every one"),
        (lambda: PrecisionAtKMetric(0), "k must be"),
        (lambda: RecallAtKMetric(1.5), "k must be"),
        (lambda: AUCMetric(1), "num_thresholds"),
        (lambda: AUCMetric(curve="DET"), "curve"),
        (lambda: AUCMetric(summation_method="midpoint"), "summation_method"),
        (lambda: MeanPerClassAccuracyMetric(0), "num_classes"),
    ],
)
def test_bad_constructor_arguments(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


@pytest.mark.parametrize(
    "metric, kwargs, match",
    [
        (
            lambda: MeanIOUMetric(3),
            {"labels": torch.zeros(4), "predictions": torch.zeros(5)},
            "same shape",
        ),
        (
            lambda: MeanIOUMetric(3),
            {
                "labels": torch.zeros(4),
                "predictions": torch.zeros(4),
                "weights": torch.ones(3),
            },
            "weights",
        ),
        (
            lambda: PrecisionAtKMetric(2),
            {"labels": torch.zeros(4, 1), "predictions": torch.zeros(4)},
            "batch",
        ),
        (
            lambda: PrecisionAtKMetric(9),
            {"labels": torch.zeros(4, 1), "predictions": torch.zeros(4, 8)},
            "larger than",
        ),
        (
            lambda: RecallAtKMetric(1),
            {
                "labels": torch.zeros(4, 1),
                "predictions": torch.zeros(4, 8),
                "weights": torch.ones(3),
            },
            "one value per row",
        ),
        (
            lambda: PerplexityMetric("ppl"),
            {"labels": torch.zeros(4), "loss": torch.zeros(4)},
            "summed loss",
        ),
    ],
)
def test_bad_update_arguments(metric, kwargs, match):
    with pytest.raises(ValueError, match=match):
        metric().update(**kwargs)
