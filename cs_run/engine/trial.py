"""``compile_tier: auto``: pick the faster tier for this graph on this machine by timing real steps.

The first steps of the run are the trial. They alternate between the candidate executables, each call
a real training step on its own batch (nothing runs twice, nothing is thrown away), after one untimed
warm-up call per candidate. Once every candidate has ``min_samples`` timings and the trial has lasted
``min_seconds`` (or every candidate has ``max_samples``), the candidate with the lowest median step
time wins; a tie goes to the first candidate (fx, the bit-identical tier). The choice, the medians and
the reason are logged once. On CUDA the device is synchronised around trial steps only.

With data-parallel replicas (``agree``) every replica must run the same tier at every step (the
tiers' last bits differ, and the replicas' weights must not), so the trial ends at a step count
(``max_samples`` each) and ordinal 0's choice is broadcast (docs/architecture.md#replicas-on-csx).
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Callable

import torch

__all__ = ["TierTrial"]

logger = logging.getLogger(__name__)


class TierTrial:
    """A callable that runs like the fastest of ``executables`` once its trial has decided.

    Args:
        executables: Candidate name -> executable, in order of preference on a tie (fx first).
        device: Where the step runs (CUDA timings synchronise the device).
        min_samples / min_seconds / max_samples: When the trial ends (see the module docstring).
        clock: Seconds as a float; injectable for tests.
        label: Names the step in the log line.
        agree: With data-parallel replicas: maps this replica's choice to the one every replica uses
            (ordinal 0's). The trial then ends after ``max_samples`` each, a count every replica reaches
            at the same step, so all switch together and never run different tiers.
    """

    def __init__(self, executables: dict[str, Callable[..., Any]], *, device: torch.device | None = None,
                 min_samples: int = 5, min_seconds: float = 0.1, max_samples: int = 15,
                 clock: Callable[[], float] = time.perf_counter, label: str = "step",
                 agree: Callable[[str], str] | None = None) -> None:
        if not executables:
            raise ValueError("TierTrial needs at least one executable")
        self.executables = dict(executables)
        self.samples: dict[str, list[float]] = {k: [] for k in self.executables}
        self.min_samples, self.min_seconds, self.max_samples = min_samples, min_seconds, max_samples
        self._clock, self._label, self._agree = clock, label, agree
        self._cuda = device is not None and device.type == "cuda"
        self._warm: set[str] = set()
        self._turn = 0
        self.choice: str | None = next(iter(self.executables)) if len(self.executables) == 1 else None
        self.reason = "only candidate" if self.choice else ""

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if self.choice is not None:
            return self.executables[self.choice](*inputs)
        names = list(self.executables)
        tier = names[self._turn % len(names)]
        self._turn += 1
        fn = self.executables[tier]
        if tier not in self._warm:  # first call: lazy allocations, kernel loading; not representative
            self._warm.add(tier)
            return fn(*inputs)
        self._sync()
        t0 = self._clock()
        out = fn(*inputs)
        self._sync()
        self.record(tier, self._clock() - t0)
        return out

    def record(self, tier: str, seconds: float) -> None:
        """Adds one timed step of ``tier``; decides once the trial has enough samples."""
        self.samples[tier].append(seconds)
        if self.choice is None and self._enough():
            self._decide()

    def medians(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self.samples.items() if v}

    def _enough(self) -> bool:
        fewest = min(len(v) for v in self.samples.values())
        if self._agree is not None:
            return fewest >= self.max_samples
        total = sum(sum(v) for v in self.samples.values())
        return fewest >= self.max_samples or (fewest >= self.min_samples and total >= self.min_seconds)

    def _decide(self) -> None:
        med = self.medians()
        order = list(self.executables)
        best = min(order, key=lambda k: (med[k], order.index(k)))
        agreed = self._agree(best) if self._agree is not None else best
        others = ", ".join(f"{k} {med[k] * 1e3:.3f} ms" for k in order if k != best)
        n = min(len(v) for v in self.samples.values())
        self.choice = agreed
        self.reason = (f"median step {med[best] * 1e3:.3f} ms vs {others} "
                       f"(interleaved trial, {n} timed steps each)")
        if self._agree is not None:
            self.reason = f"ordinal 0's trial chose it for every replica (here: {best} {self.reason})"
        logger.info("compile_tier auto: %s runs on tier %s: %s", self._label, agreed, self.reason)

    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()
