"""Early stopping on an eval value: the runconfig's early_stopping_* keys (docs/architecture.md#a-runs-files-and-its-end)."""

from __future__ import annotations

import difflib
import logging
import math
from typing import Any, Iterable, Optional

from cs_run.errors import ParamsError
from cs_run.params import RunConfig

__all__ = ["EarlyStopping"]

logger = logging.getLogger("cs_run.runners")


class EarlyStopping:
    """Counts the periodic evaluations since ``metric`` last improved (by more than ``min_delta``); asks
    the loop to stop when they reach ``patience``. Its state is part of the runner's checkpoint."""

    def __init__(self, metric: str, mode: Optional[str], patience: int, min_delta: float) -> None:
        self.metric, self.patience, self.min_delta = metric, patience, min_delta
        lower = any(word in metric.lower() for word in ("loss", "perplexity", "error"))
        self.mode = mode or ("min" if lower else "max")
        self.best: Optional[float] = None
        self.best_step: Optional[int] = None
        self.wait = 0

    @classmethod
    def from_runconfig(cls, rc: RunConfig) -> Optional["EarlyStopping"]:
        if rc.early_stopping_metric is None:
            return None
        return cls(rc.early_stopping_metric, rc.early_stopping_mode, rc.early_stopping_patience,
                   rc.early_stopping_min_delta)

    def check_metric(self, names: Iterable[str], head: str = "params: ",
                     key: str = "runconfig.early_stopping_metric") -> None:
        """Before the first step: the metric is one the evaluation reports (its loss or a registered metric);
        the message names ``key`` (what the user set) after ``head``."""
        names = list(names)
        if self.metric not in names:
            close = difflib.get_close_matches(self.metric, names, n=1)
            hint = f"; did you mean {close[0]!r}" if close else ""
            raise ParamsError(f"{head}{key}: {self.metric!r} is not a value the "
                              f"evaluation reports{hint} (it reports {', '.join(names)})")

    def log_start(self) -> None:
        logger.info("Early stopping on %s (%s, patience %d evaluations, min_delta %g)", self.metric, self.mode,
                    self.patience, self.min_delta)

    def update(self, results: dict[str, float], step: int) -> bool:
        """One evaluation's results; True when training should stop."""
        value = results[self.metric]
        better = self.best is None or (value < self.best - self.min_delta if self.mode == "min"
                                       else value > self.best + self.min_delta)
        if better and math.isfinite(value):
            self.best, self.best_step, self.wait = value, step, 0
            return False
        self.wait += 1
        if self.wait < self.patience:
            return False
        logger.info("Early stopping at step %d: %s=%.5f has not improved on %.5f (step %d) for %d evaluations",
                    step, self.metric, value, self.best if self.best is not None else math.nan,
                    self.best_step if self.best_step is not None else -1, self.wait)
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        best, best_step = state.get("best"), state.get("best_step")
        self.best = None if best is None else float(best)
        self.best_step = None if best_step is None else int(best_step)
        self.wait = int(state.get("wait", 0))
