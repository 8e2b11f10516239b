"""A run's evaluations in one object: the eval loop, its loader, the metrics it reports, the evaluations
during training (train_and_eval) and eval_all over model_dir's checkpoints.

The runner's loop asks; this answers, as :class:`~cs_run.runners._checkpointer.Checkpointer` does for
checkpoints. How an eval step runs stays the runner's (``_eval_step``, a subclass's), as do the hooks the loop
calls; which evaluations run, what they report and where it goes is decided here, once.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from cs_run.batches import loader_length
from cs_run.errors import CheckpointError, ParamsError
from cs_run.metrics import MetricSet
from cs_run.params import Params
from cs_run.runners import _build, _checkpoint_files
from cs_run.runners._rng import preserved_rng

if TYPE_CHECKING:
    from cs_run.runners.base import PyTorchBaseRunner

__all__ = ["Evaluator"]

logger = logging.getLogger("cs_run.runners")

LOSS = "eval/loss"
"""The key of an evaluation's mean loss; the run's metrics follow it under their own names."""


class Evaluator:
    """The evaluations of ``runner``'s run. It reads the runner's parts (model, eval step, hooks, strategy,
    summaries) when it evaluates, so a part a hook replaces is the one evaluated.

    Attributes:
        metrics: the run's metrics, what an evaluation reports besides the loss (docs/architecture.md, "A
            run's metrics"); the runner collects them while it is created and runs.
        loader: the first evaluation's loader, built by :meth:`prepare` before model_dir is written and
            taken by that evaluation (each later one builds its own).
        during_training: whether training evaluates every ``runconfig.eval_frequency`` steps (train_and_eval).
        last: ``(global step, results)`` of the newest evaluation during training.
    """

    def __init__(self, runner: "PyTorchBaseRunner") -> None:
        self._runner = runner
        self.metrics = MetricSet()
        self.loader: Any = None
        self.during_training = False
        self.last: tuple[int, dict[str, float]] = (-1, {})
        self._position: Optional[tuple[int, Optional[int]]] = None  # (steps done, steps) of the evaluation running

    def begin_run(self, mode: str) -> None:
        """A run in ``mode`` starts: it evaluates during training only if it is train_and_eval (the Model Zoo's
        rule), whatever an earlier run of the same runner did, and with no evaluation of its own yet."""
        self.during_training = mode == "train_and_eval"
        self.last = (-1, {})

    def names(self) -> list[str]:
        """The keys an evaluation reports: the loss, then the run's metrics (what early stopping may watch)."""
        return [LOSS, *self.metrics.metrics()]

    def build_loader(self) -> Any:
        """A fresh eval loader from eval_input's data function; one without a batch is refused."""
        runner = self._runner
        loader = _build.build_dataloader(runner.params, "eval", runner._data_fns["eval"])
        if loader_length(loader) == 0:
            raise _no_eval_batch(runner.params)
        return loader

    def prepare(self) -> None:
        """Build the first evaluation's loader now, before model_dir is written, so a data function's
        refusal (a missing data_dir) or an empty eval loader leaves nothing behind."""
        self.loader = self.build_loader()

    # ------------------------------------------------------------------------------------ one evaluation

    def evaluate(self, checkpoint: Optional[Path] = None) -> dict[str, float]:
        """Evaluate on eval_input (after loading ``checkpoint`` if given); returns loss and metrics."""
        runner = self._runner
        runner.checkpoints.load(checkpoint, training=False)
        loader, self.loader = self.loader, None  # run() built the first evaluation's
        if loader is None:
            loader = self.build_loader()
        available, limit = loader_length(loader), runner.options.eval_steps
        if limit and available is not None and limit > available:
            logger.warning("%s=%d but the eval loader has %d batches: evaluating %d",
                           runner.params.name("runconfig.eval_steps"), limit, available, available)
        total_steps = min(x for x in (limit, available) if x is not None) if (limit or available) else None
        runner.model.eval()
        self.metrics.reset()
        runner.on_eval_start()
        runner.on_eval_epoch_start()
        total_loss, steps = None, 0
        with runner._progress("Eval", total_steps) as bar:
            for batch in loader:
                self._position = (steps, total_steps)
                if total_steps is not None and steps >= total_steps:
                    break
                if runner._stop.requested:  # a signal during a periodic eval: the train loop saves and stops
                    logger.warning("Eval interrupted after %d batches: no eval results for step %d", steps,
                                   runner.global_step)
                    return {}
                batch = runner.on_eval_batch_start(runner._to_device(batch))
                loss = runner._eval_step(batch)
                steps += 1
                runner.on_eval_batch_end(loss, 0, steps)
                total_loss = loss.float() if total_loss is None else total_loss + loss.float()
                bar.update(1)
        self._position = None
        if steps == 0:
            raise _no_eval_batch(runner.params)
        early_exit = available is not None and steps < available
        runner.on_eval_epoch_end(early_exit=early_exit)
        runner.on_eval_end(early_exit=early_exit)
        loss_sum, all_steps = runner.strategy.sum_values(runner._fetch_loss(total_loss), steps)  # over replicas' shards
        results = {LOSS: loss_sum / all_steps, **self.metrics.compute()}
        summary = ", ".join(f"{k}={v:.5f}" for k, v in results.items())
        logger.info("| Eval Device=%s, GlobalStep=%d, Batches=%d, %s", runner.device_name, runner.global_step, steps,
                    summary)
        runner._summaries.add_scalars("eval", {k.removeprefix("eval/"): v for k, v in results.items()},
                                      runner.global_step, flush=True)
        runner.on_eval_metrics(dict(results), runner.global_step)
        return results

    # ---------------------------------------------------------------------------- during training

    def log_start(self) -> None:
        """At the start of training: eval_frequency set where training does not evaluate is said to do nothing."""
        runner = self._runner
        frequency = runner.options.eval_frequency
        if frequency and not self.during_training:  # the Model Zoo's own files set it for train too
            logger.info("%s=%s has no effect here: only train_and_eval (cs-run train-and-eval, a Trainer.fit with "
                        "a val_dataloader) evaluates during training, as in the Model Zoo",
                        runner.params.name("runconfig.eval_frequency"), frequency)

    def after_train_step(self) -> dict[str, float]:
        """train_and_eval's evaluation after a training step: every eval_frequency steps from the run's start
        (a count, or a fraction of the run: the vendor's), not on the run's last step (:meth:`final` is that
        one). Its results, or {} when none was due or a signal interrupted it."""
        if not self.during_training:
            return {}
        runner = self._runner
        progress = runner.progress
        every = self._every()
        if not every or progress.run_step % every != 0 or progress.run_step == progress.run_steps:
            return {}
        with preserved_rng(getattr(runner._train_loader, "generator", None)):  # the last step's: final()
            results = self.evaluate()
        self.last = (progress.global_step, results)
        runner.model.train()
        return results

    def _every(self) -> Optional[int]:
        """train_and_eval's evaluation interval in steps (eval_frequency: a count or a fraction of the run)."""
        frequency, run_steps = self._runner.options.eval_frequency, self._runner.progress.run_steps
        return math.ceil(frequency * run_steps) if isinstance(frequency, float) else frequency

    def steps_left(self) -> Optional[int]:
        """Eval steps still to run, the current one included: the rest of this evaluation and, while training
        evaluates, those of its evaluations to come (as long as this one); None outside an evaluation of
        known length, and with replicas (their eval shards may differ in length, and tier auto's decision is a
        collective every replica must reach at the same step). What the CSX engine's tier auto weighs against
        an inductor build."""
        if self._position is None or self._position[1] is None or self._runner.strategy.world_size > 1:
            return None
        done, total = self._position
        progress, later = self._runner.progress, 0
        if self.during_training and progress.run_start is not None and progress.run_step < progress.run_steps:
            every = self._every()
            periodic = (progress.run_steps - 1) // every - progress.run_step // every if every else 0
            later = periodic + 1  # and the final one
        return total - done + later * total

    def final(self) -> dict[str, float]:
        """train_and_eval's results: the evaluation of the final weights, run now unless training ended
        with one (a stop at an evaluation step)."""
        step, results = self.last
        return results if step == self._runner.global_step and results else self.evaluate()

    # --------------------------------------------------------------------------------------- eval_all

    def eval_all(self) -> dict[str, dict[str, float]]:
        """Evaluate every checkpoint in model_dir, oldest first; results keyed by step."""
        model_dir = self._runner.model_dir
        found = _checkpoint_files.list_checkpoints(model_dir)
        if not found:
            raise CheckpointError(f"eval_all: no checkpoint_<step>.mdl files in {model_dir}")
        results, bad = {}, []
        for step, path in found:  # a bad checkpoint does not stop the others from being evaluated
            try:
                results[str(step)] = self.evaluate(checkpoint=path)
            except CheckpointError as e:
                logger.error("eval_all: cannot evaluate %s: %s", path, e)
                bad.append(path.name)
        if bad:
            raise CheckpointError(f"eval_all: evaluated {len(results)} of {len(found)} checkpoints; "
                                  f"{len(bad)} could not be read: {', '.join(bad)} (the log names each problem)")
        return results


def _no_eval_batch(params: Params) -> ParamsError:
    """An eval loader without a batch, named as the user gave it (eval_input, the Trainer's val_dataloader)."""
    section = params.name("eval_input")
    fix = "eval_input.batch_size and drop_last_batch" if section == "eval_input" else "its batch_size and drop_last"
    return ParamsError(f"{params.head}{section}: the eval loader yields no batch; check {fix}")
