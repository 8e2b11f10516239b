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

A short run cannot win back an inductor build (tens of seconds for a step that fx runs in a
millisecond), so where the build is not saved in the compile cache and the run's length is known,
:class:`PayoffGate` runs fx first, times it, and builds inductor (then the trial) only when the steps
left could save more than the build costs even if inductor took no time at all (:func:`payoff`).
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Callable

import torch

__all__ = ["PayoffGate", "TierTrial", "payoff"]

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


def payoff(steps_left: int, fx_step_seconds: float, compile_seconds: float) -> tuple[str, str]:
    """``("fx", why)`` when ``steps_left`` steps of ``fx_step_seconds`` each could not save the
    ``compile_seconds`` an inductor build costs even if inductor ran them in no time; else
    ``("inductor", why)``: build it and let the trial decide. Pure: the measured numbers come in."""
    most = steps_left * fx_step_seconds
    why = (f"{steps_left} steps left x {fx_step_seconds * 1e3:.3g} ms/step could save at most {most:.3g} s; "
           f"compiling inductor takes ~{compile_seconds:.3g} s")
    return ("fx", why) if most <= compile_seconds else ("inductor", why)


class PayoffGate:
    """``compile_tier: auto`` where inductor's build is not saved: fx first, inductor only if it can pay.

    The first call is an untimed warm-up, the next ``samples`` calls are timed fx steps; then
    :func:`payoff` decides from ``steps_left()`` (the steps still to run, this one included) and the
    median fx step. fx: the gate runs fx from then on. inductor: ``build()`` makes what runs from
    then on (the tier trial of both, or fx where the build failed). One log line says which and why.

    Args:
        fx: The fx executable.
        build: Builds inductor and returns the executable to run from then on (called at most once).
        steps_left: The steps still to run, this one included (None: unknown, build inductor).
        compile_seconds: The estimated cost of the inductor build.
        samples: Timed fx steps before the decision.
        device / clock / label: As :class:`TierTrial`'s.
        agree: With data-parallel replicas, maps this replica's decision to ordinal 0's (every replica
            decides at the same step, so all run the same tier).
    """

    def __init__(self, fx: Callable[..., Any], build: Callable[[], Callable[..., Any]], *,
                 steps_left: Callable[[], int | None], compile_seconds: float, samples: int = 5,
                 device: torch.device | None = None, clock: Callable[[], float] = time.perf_counter,
                 label: str = "step", agree: Callable[[str], str] | None = None) -> None:
        self._fx, self._build, self._steps_left = fx, build, steps_left
        self.compile_seconds, self.samples = compile_seconds, samples
        self._clock, self._label, self._agree = clock, label, agree
        self._cuda = device is not None and device.type == "cuda"
        self.fx_times: list[float] = []
        self._warm = False
        self.decision: str | None = None  # "fx" or "inductor" once decided
        self.reason = ""
        self.then: Callable[..., Any] | None = None  # what runs after the decision

    @property
    def choice(self) -> str | None:
        """The tier the step runs on for good (None while deciding, or while the trial after it runs)."""
        if self.then is None:
            return None
        return getattr(self.then, "choice", "fx")  # a TierTrial, or fx itself

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if self.then is not None:
            return self.then(*inputs)
        if not self._warm:  # first call: lazy allocations; not representative
            self._warm = True
            return self._fx(*inputs)
        self._sync()
        t0 = self._clock()
        out = self._fx(*inputs)
        self._sync()
        self.fx_times.append(self._clock() - t0)
        if len(self.fx_times) >= self.samples:
            self._decide()
        return out

    def _decide(self) -> None:
        left = self._steps_left()
        if left is None:
            decision, why = "inductor", "the run's length is unknown"
        else:  # this step has run: the steps after it are what inductor could speed up
            decision, why = payoff(max(left - 1, 0), statistics.median(self.fx_times), self.compile_seconds)
        if self._agree is not None:
            agreed = self._agree(decision)
            if agreed != decision:
                why = f"ordinal 0 decided it for every replica (here: {decision}, {why})"
            decision = agreed
        self.decision, self.reason = decision, why
        if decision == "fx":
            logger.info("compile_tier auto: %s runs on tier fx (%s)", self._label, why)
            self.then = self._fx
        else:
            logger.info("compile_tier auto: %s builds tier inductor to time it against fx (%s)", self._label, why)
            self.then = self._build()

    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()
