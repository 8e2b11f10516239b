"""On-system evaluation metrics (``cstorch.metrics``).

Each metric keeps tensor state that a traced step updates in place; read values on the host after
the run with ``float(metric)`` or :func:`compute_all_metrics`.
"""

from cs_run.metrics.accuracy import AccuracyMetric as AccuracyMetric
from cs_run.metrics.accuracy import (
    MeanPerClassAccuracyMetric as MeanPerClassAccuracyMetric,
)
from cs_run.metrics.at_k import PrecisionAtKMetric as PrecisionAtKMetric
from cs_run.metrics.at_k import RecallAtKMetric as RecallAtKMetric
from cs_run.metrics.auc import AUCMetric as AUCMetric
from cs_run.metrics.confusion import DiceCoefficientMetric as DiceCoefficientMetric
from cs_run.metrics.confusion import FBetaScoreMetric as FBetaScoreMetric
from cs_run.metrics.confusion import MeanIOUMetric as MeanIOUMetric
from cs_run.metrics.mean import MeanMetric as MeanMetric
from cs_run.metrics.mean import PerplexityMetric as PerplexityMetric
from cs_run.metrics.metric import Metric as Metric
from cs_run.metrics.metric import MetricSet as MetricSet
from cs_run.metrics.metric import compute_all_metrics as compute_all_metrics
from cs_run.metrics.metric import get_all_metrics as get_all_metrics
from cs_run.metrics.metric import register_metric as register_metric
from cs_run.metrics.metric import reset_all_metrics as reset_all_metrics
from cs_run.metrics.metric import unregister_metric as unregister_metric

__all__ = [
    "AUCMetric",
    "AccuracyMetric",
    "DiceCoefficientMetric",
    "FBetaScoreMetric",
    "MeanIOUMetric",
    "MeanMetric",
    "MeanPerClassAccuracyMetric",
    "Metric",
    "MetricSet",
    "PerplexityMetric",
    "PrecisionAtKMetric",
    "RecallAtKMetric",
    "compute_all_metrics",
    "get_all_metrics",
    "register_metric",
    "reset_all_metrics",
    "unregister_metric",
]
