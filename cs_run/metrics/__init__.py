"""On-system evaluation metrics (``cstorch.metrics``).

Each metric keeps tensor state that a traced step updates in place; read values on the host after
the run with ``float(metric)`` or :func:`compute_all_metrics`.
"""

from cs_run.metrics.accuracy import AccuracyMetric as AccuracyMetric
from cs_run.metrics.metric import Metric as Metric
from cs_run.metrics.metric import compute_all_metrics as compute_all_metrics
from cs_run.metrics.metric import get_all_metrics as get_all_metrics
from cs_run.metrics.metric import register_metric as register_metric
from cs_run.metrics.metric import reset_all_metrics as reset_all_metrics
from cs_run.metrics.metric import unregister_metric as unregister_metric

__all__ = [
    "AccuracyMetric",
    "Metric",
    "compute_all_metrics",
    "get_all_metrics",
    "register_metric",
    "reset_all_metrics",
    "unregister_metric",
]
