"""PyTorchBaseRunner: the training loop every runner shares, and the run around it.

The loop reads top to bottom in :meth:`PyTorchBaseRunner.train`. Its parts with a job of their own are
objects it holds: the checkpoints (:class:`~cs_run.runners._checkpointer.Checkpointer`), the evaluations
(:class:`~cs_run.runners._evaluator.Evaluator`), the counters (:class:`~cs_run.runners._progress.Progress`).
Subclasses differ only in how a step executes (:meth:`_train_step`, :meth:`_eval_step`) and how values
reach the host (:meth:`_fetch_loss`); they never copy the loop.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
from tqdm import tqdm

from cs_run import distributed, parallel
from cs_run._logging import run_log
from cs_run._torch_compat import shut_down_loader_workers
from cs_run.backend import Backend
from cs_run.batches import RateMeter, batch_size, loader_length, move_to_device
from cs_run.creation import manual_seed
from cs_run.errors import ParamsError, TrainingError
from cs_run.exits import error_text
from cs_run.interrupts import Aborted, Interrupted, StopFlag, stop_on_signal
from cs_run.params import Params, save_params
from cs_run.runners import _build, _checkpoint_files, _create, _model_dir
from cs_run.runners._checkpointer import Checkpointer
from cs_run.runners._early_stopping import EarlyStopping
from cs_run.runners._evaluator import Evaluator
from cs_run.runners._loss_check import LossCheck
from cs_run.runners._progress import Progress
from cs_run.runners._reporting import SparsityLog, Summaries
from cs_run.runners._rng import capture_rng_state, preserved_rng, restore_rng_state
from cs_run.runners._run_options import TRAINING_MODES, RunOptions
from cs_run.runners._run_record import RunRecord
from cs_run.runners.hooks import RunnerHooks
from cs_run.schedule import StepBudget, is_checkpoint_step, is_log_step
from cs_run.sparsity_params import summaries_wanted
from cs_run.utils.streaming import StreamingLoader
from cs_run.utils.tensorboard import pop_summarized_scalars

__all__ = ["PyTorchBaseRunner"]

logger = logging.getLogger("cs_run.runners")

class PyTorchBaseRunner(RunnerHooks):
    """Owns the loop: step budget, accumulation, clipping, logging, loss checks, checkpoints, resume.

    Args:
        params: validated params (see :func:`cs_run.params.load_params`).
        device: "CPU" or "GPU" (and "CSX" for the CS runners).
        backend: the :class:`~cs_run.backend.Backend` to run on (its device); None: ``device`` decides.
    """

    device_name = "cpu"
    devices: tuple[str, ...] = ()
    """The ``--device`` values this runner class serves (what :meth:`create` picks it for)."""

    def __init__(self, params: Params, *, device: str = "CPU", backend: Optional[Backend] = None,
                 model_fn: Optional[Callable] = None, train_data_fn: Optional[Callable] = None,
                 eval_data_fn: Optional[Callable] = None, optimizer_fn: Optional[Callable] = None,
                 lr_scheduler_fn: Optional[Callable] = None, options: Optional[RunOptions] = None,
                 sparsity_fn: Optional[Callable] = None) -> None:
        self.params = params
        self._data_fns = {"train": train_data_fn, "eval": eval_data_fn}
        self.device_type = device.upper()
        self.options = options if options is not None else RunOptions.resolve(params, self.device_type)
        """The run's options, checked once when the run was resolved (:meth:`create`); read them here."""
        self.backend = backend
        self.torch_device = backend.torch_device if backend is not None else _create.resolve_torch_device(self.device_type)
        rc = params.runconfig
        self.model_dir = Path(rc.model_dir)
        self.progress = Progress()  # the train loop's step and epoch counters
        self._loss_check = LossCheck(self._defers_loss_check, self._raise_bad_loss)
        distributed.set_num_workers_per_csx(rc.num_workers_per_csx)
        if rc.seed is not None:
            manual_seed(rc.seed)
        # Build what can be wrong before anything is written: model and optimizer errors are params errors.
        self.evaluator = Evaluator(self)
        """The run's evaluations: the eval loop, its loader and metrics, evaluations during training, eval_all."""
        self.step_config = _build.build_step_config(params, self.torch_device, self.device_type)
        self.strategy = parallel.build_strategy(self.options.layout, self.step_config.autocast_dtype)  # bf16: FSDP2's too
        with self.evaluator.metrics.collecting():  # the model's metrics are the run's
            self.model = self.strategy.build(_build.ModelBuild(params, model_fn), self.torch_device)  # fsdp: on meta but ordinal 0
        self.evaluator.metrics.add_module(self.model)
        self.sparsity = _build.build_sparsity(params, self.model, sparsity_fn, self.options.layout)  # the section's / Trainer's, or None
        self.model = self.strategy.shard(self.model, self.torch_device)  # before the optimizer holds its parameters
        self.optimizer, self.lr_scheduler, self.grad_scaler = _build.build_training_parts(
            params, self.model, optimizer_fn, lr_scheduler_fn)
        if self.grad_scaler is not None:  # its state where the step runs: a CUDA graph takes no host inputs
            self.grad_scaler.to(self.torch_device)
        if self.sparsity is not None and self.optimizer is not None:
            self.sparsity.apply(self.optimizer)  # the masks reach the optimizer's state
        self._sparsity_log = (SparsityLog(self.sparsity) if self.sparsity is not None and self.optimizer is not None
                              and summaries_wanted(params.sparsity) else None)  # the vendor's LogSparsity
        self._train_loader = None
        self._summaries = Summaries(self.model_dir)
        self._stop = StopFlag()  # the signal flag while train() runs (docs/architecture.md#interrupts)
        self.checkpoints = Checkpointer(self)
        """The run's checkpoints: the start checkpoint (resolved once), loading, saving, pruning."""
        self._budget: Optional[tuple[int, StepBudget]] = None  # (start step, the training run's steps from it)
        self.should_stop = False
        """Set it in a hook to end training after the current step (with a checkpoint of that step)."""
        self._early_stopping = EarlyStopping.from_runconfig(rc)
        self._created_records: list[logging.LogRecord] = []  # create()'s log lines, for the first run's run.log

    @property
    def global_step(self) -> int:
        """Optimizer steps taken, counted across resumed runs (``self.progress.global_step``)."""
        return self.progress.global_step

    @global_step.setter
    def global_step(self, value: int) -> None:
        self.progress.global_step = value

    # --------------------------------------------------------------------------------- construction

    @staticmethod
    def create(params: Params, *, device: str = "CPU", runner: Optional[str] = None, mode: Optional[str] = None,
               backend: Optional[Backend] = None,
               **builders: Optional[Callable]) -> "PyTorchBaseRunner":
        """The runner for ``device``; ``runner`` (or runconfig.runner) names a user subclass ``module:Class``
        of it: :class:`~cs_run.runners.PyTorchRunner` (eager) on CPU and GPU,
        :class:`~cs_run.runners.PyTorchCSRunner` on CSX (compile_only / validate_only are its trace-only mode).

        ``backend`` is the backend to run on (the CSX runner makes one from runconfig when it is None);
        ``builders`` (model_fn, train_data_fn, eval_data_fn, optimizer_fn, lr_scheduler_fn, sparsity_fn)
        replace the params' model, data, optimizer and sparsity factories. ``mode``, when known, is checked against the
        params' sections first. Nothing of the user's code runs before model_dir, the sections and the
        model and data functions' keys are checked (:mod:`cs_run.runners._create`).
        """
        return _create.create(PyTorchBaseRunner, params, device, runner, mode, backend, builders)

    def run(self, mode: str) -> dict[str, Any]:
        """Run ``mode`` (train, eval, train_and_eval, eval_all); returns the eval results, if any."""
        parallel.use(self.strategy)  # this run's, for code it does not hand it to (a hook's cstorch.save)
        try:
            return self._run(mode)
        finally:  # a later run or cstorch.compile in this process starts from data parallel, not this run's
            parallel.use(parallel.Strategy())

    def _run(self, mode: str) -> dict[str, Any]:
        if mode != self.options.mode:  # a runner created without this mode: its checks now, once
            try:
                self.options = self.options.for_mode(mode, self.params, self._data_fns)
            except ParamsError as e:
                raise self.params.locate_error(e) from e.__cause__
        if mode == "eval_all" and not _checkpoint_files.list_checkpoints(self.model_dir):  # a typo'd model_dir stays unmade
            raise ParamsError(f"eval_all: no checkpoint_<step>.mdl files in {self.model_dir}; give the --model_dir "
                              "of a run that saved checkpoints")
        self.evaluator.begin_run(mode)
        with _create.held_for_run_log(self.params) as early:  # run.log begins with their lines
            self._check_before_writing(mode)
        early, self._created_records = [*self._created_records, *early], []  # the creation's lines go first, once
        with self._open_model_dir(mode, early), self.evaluator.metrics.collecting():  # a metric the first step creates is the run's
            logger.info("cs-run %s on %s, model_dir %s", mode, self.device_type, self.model_dir)
            try:
                if mode == "train":
                    self.train()
                    return {}
                if mode == "eval":
                    if self.checkpoints.start is None:
                        logger.warning("No checkpoint in %s and no checkpoint_path: evaluating randomly "
                                       "initialized weights", self.model_dir)
                    return self.evaluator.evaluate(checkpoint=self.checkpoints.start)
                if mode == "train_and_eval":
                    self.train()
                    return self.evaluator.final()
                return self.evaluator.eval_all()
            except ParamsError as e:  # e.g. a data function rejecting its section's values
                raise self.params.locate_error(e) from e.__cause__
            finally:
                self._summaries.close()
                for loader in (self._train_loader, self.evaluator.loader):  # persistent workers end with the run
                    shut_down_loader_workers(loader)

    def _check_before_writing(self, mode: str) -> None:
        """What the run can refuse before it starts, refused before model_dir is made or written
        (docs/architecture.md#a-runs-files-and-its-end): the checkpoint it starts from must fit the
        model, its loaders are built (a data function's refusal, such as a missing data_dir; an empty
        eval loader), the early-stopping metric must be one the eval reports, and a training run's step
        budget must hold from the checkpoint's global step. eval_all's checkpoints must all fit the model
        (a damaged one is not refused here: the evaluation skips it). The loaders built here are the run's,
        as are the start checkpoint and the step budget resolved here."""
        training = mode in TRAINING_MODES
        self._train_loader = self.evaluator.loader = self._budget = self.checkpoints.start = None
        try:
            start = None
            if mode == "eval_all":
                self.checkpoints.check_all_fit()
            else:  # resolved once (one broadcast among replicas)
                start = self.checkpoints.check_start_fits(self.checkpoints.resolve_start(), training)
            if training:
                self._train_loader = _build.build_dataloader(self.params, "train", self._data_fns["train"])
                _check_replica_loader(self._train_loader, self.params.train_input)
                if self._early_stopping is not None:
                    self._early_stopping.check_metric(self.evaluator.names(), self.params.head,
                                                      self.params.name("runconfig.early_stopping_metric"))
                self._step_budget(self.checkpoints.stored_step(start) if start and self.options.loads_step else 0)
            if mode != "train":  # built before training, so it leaves training's random streams as they were
                with preserved_rng(getattr(self._train_loader, "generator", None)) if training else \
                        contextlib.nullcontext():
                    self.evaluator.prepare()
        except ParamsError as e:
            raise self.params.locate_error(e) from e.__cause__

    @contextlib.contextmanager
    def _open_model_dir(self, mode: str, earlier: Iterable[logging.LogRecord] = ()) -> Iterator[None]:
        """The run's hold on model_dir: its lock (one writer at a time), the run's record in model_dir/runs/
        and the run log, which also gets the ``Error:`` line. Ordinal 0 is the one writer of a run of several
        replicas. (The resolved params are written when training starts: :meth:`train`.)"""
        if not self.strategy.writes:
            yield
            return
        with _model_dir.model_dir_lock(self.model_dir):
            record = RunRecord(self.model_dir, self.params, mode, self.device_type)
            with run_log(self.model_dir, self.params.runconfig.logging, self.params.notes, earlier) as log:
                try:
                    yield
                except BaseException as e:
                    text = error_text(e)
                    if text:  # an interrupt logged its own line
                        log.write(logging.ERROR, text)
                    outcome = "aborted" if isinstance(e, Aborted) else \
                        "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
                    record.finish(outcome, first_step=self.progress.run_start, last_step=self.global_step,
                                  message=text.splitlines()[-1] if text else str(e))
                    raise
                record.finish("completed", first_step=self.progress.run_start, last_step=self.global_step)

    # ------------------------------------------------------------------------------------- training

    def train(self) -> None:
        """Train for the step budget, resuming from the newest checkpoint when there is one."""
        self.evaluator.log_start()
        if self._early_stopping is not None:
            self._early_stopping.log_start()
        loader, progress = self._train_loader, self.progress  # the loader: built and checked by run()
        checkpoints = self.checkpoints
        checkpoints.load(checkpoints.start)  # the start checkpoint run() resolved and checked
        budget = self._step_budget(progress.global_step)  # run() computed it, unless the load fell back
        checkpoints.restore_data_position(loader)  # after the budget: an epoch is a fresh loader's pass
        if checkpoints.pending_resume is not None and progress.epoch_step >= budget.steps_per_epoch:
            # The checkpoint closed an epoch: the next one starts fresh from the checkpoint's RNG.
            restore_rng_state(checkpoints.pending_resume["rng"], getattr(loader, "generator", None))
            checkpoints.pending_resume = None
            progress.epoch_done()
        if self.options.save_initial_checkpoint and progress.global_step == 0:
            checkpoints.save()
        progress.start_run(budget.steps)
        end_step = progress.global_step + budget.steps
        logger.info("Training %d steps (global step %d -> %d), %d per epoch", budget.steps, progress.global_step,
                    end_step, budget.steps_per_epoch)
        if self.strategy.writes:  # now, not earlier: a run refused before its first step keeps the previous run's
            save_params(self.params, self.model_dir)
        self.model.train()
        pop_summarized_scalars()  # a model's scalars summarized outside this run's steps are not this run's
        self._rate = RateMeter(window=self.options.log_steps or budget.steps)
        self._compile_reported = False
        self._rate.start()
        self.on_train_start()
        with stop_on_signal(self.strategy.stop_grace(), self.strategy.report_end) as self._stop, \
                self._progress("Train", budget.steps) as bar:
            while progress.global_step < end_step and not self.should_stop:
                self.on_train_epoch_start()
                start = progress.global_step
                finished_epoch = self._train_epoch(loader, budget, end_step, bar)
                if progress.global_step == start:
                    raise ParamsError("params: train_input: the train loader yielded no full step; check "
                                      "train_input.batch_size, drop_last_batch and grad_accum_steps")
                self.on_train_epoch_end(early_exit=not finished_epoch)
                if finished_epoch:
                    progress.epoch_done()
        if self._stop.requested:  # the signal came during the last step, which is saved: the run is complete
            logger.warning("interrupted at the last step (%d), whose checkpoint is saved: training is complete",
                           progress.global_step)
        self._stop = StopFlag()
        # The last step saved its checkpoint in _after_train_step, a stop request in _stop_after_step.
        self.on_train_end(early_exit=progress.global_step < end_step)

    def _step_budget(self, initial_step: int) -> StepBudget:
        """The training run's steps from ``initial_step``: computed once, before model_dir is written
        (:meth:`_check_before_writing`), and again only when the load fell back to an older checkpoint."""
        if self._budget is None or self._budget[0] != initial_step:
            self._budget = (initial_step, self.options.steps.budget(loader_length(self._train_loader), initial_step))
        return self._budget[1]

    def _train_epoch(self, loader, budget: StepBudget, end_step: int, bar) -> bool:
        """Run steps until the epoch or the budget ends; True when the epoch ended."""
        progress = self.progress
        for micro_batches in self._epoch_batches(loader, budget.steps_per_epoch):
            samples = sum(batch_size(b) for b in micro_batches)
            micro_batches = self.on_train_batch_start(micro_batches)
            loss = self._train_step(micro_batches)
            progress.step_done(samples)
            self.on_train_batch_end(loss, progress.epoch, progress.global_step)
            self._after_train_step(loss, micro_batches)
            bar.update(1)
            if progress.global_step >= end_step:
                return progress.epoch_step >= budget.steps_per_epoch
            if self._stop_requested():
                self._stop_after_step()
                return progress.epoch_step >= budget.steps_per_epoch
        return True

    def _stop_requested(self) -> bool:
        """A signal or ``should_stop``; with several replicas any replica's, agreed after every step (one
        tiny host collective), so they all stop after the same step and with the same signal."""
        if self.strategy.world_size == 1:
            return self._stop.requested or self.should_stop
        signum, stop = self.strategy.agree_stop(self._stop.signum or 0, bool(self.should_stop))
        if signum and not self._stop.requested:
            self._stop.signum = signum
        self.should_stop = stop  # the outer loop reads it too
        return bool(signum or stop)

    def _stop_after_step(self) -> None:
        """A stop request (a signal, ``should_stop``) after a whole step: checkpoint the step, then end the
        loop; on a signal raise :class:`~cs_run.interrupts.Interrupted` with what was saved."""
        step, path = self.checkpoints.saved
        if step != self.global_step:
            self._loss_check.raise_if_bad()  # never checkpoint weights a NaN step produced
            path = self.checkpoints.save()
        if self._stop.requested:
            interrupted = Interrupted(self._stop.signum, self.global_step, path)
            logger.warning("%s", interrupted)
            raise interrupted
        logger.info("Training stopped early at step %d; checkpoint %s", self.global_step, path)

    def _epoch_batches(self, loader, steps_per_epoch: int) -> Iterator[list]:
        """Yield each step's micro-batches; a resumed epoch replays the same order and skips what was done.

        The RNG state just before the loader's iterator is created decides the shuffle order, so it is
        recorded with every checkpoint and restored, with the done batches skipped, on resume.
        """
        generator = getattr(loader, "generator", None)
        resume, self.checkpoints.pending_resume = self.checkpoints.pending_resume, None
        if resume is not None:
            restore_rng_state(resume["epoch_start_rng"], generator)
        self.checkpoints.epoch_start_rng = capture_rng_state(generator)
        if isinstance(loader, StreamingLoader):
            loader.set_epoch(self.progress.epoch)
        accum = self.params.optimizer.grad_accum_steps
        iterator = iter(loader)
        if resume is not None:
            for _ in range(0 if resume.get("positioned") else self.progress.epoch_step * accum):
                next(iterator)
            restore_rng_state(resume["rng"], generator)
        while self.progress.epoch_step < steps_per_epoch:
            micro = self._next_batches(iterator, accum)
            if len(micro) < accum:
                return
            yield micro

    def _next_batches(self, iterator: Iterator, count: int) -> list:
        """The next ``count`` batches of ``iterator`` on the device (fewer when it ends first)."""
        return [self._to_device(batch) for batch in itertools.islice(iterator, count)]

    def _after_train_step(self, loss: torch.Tensor, micro_batches: list) -> None:
        """Host work after a step: loss check, logging, checkpoint, periodic eval."""
        step, run_step, run_steps = self.progress.global_step, self.progress.run_step, self.progress.run_steps
        self._rate.tick(sum(batch_size(b) for b in micro_batches) * self.strategy.world_size)  # all replicas' samples
        log_step = is_log_step(run_step, run_steps, self.options.log_steps)
        checkpoint_step = is_checkpoint_step(run_step, run_steps, self.options.checkpoint_steps)
        self._loss_check.track(loss, step)
        if log_step or checkpoint_step:
            self._loss_check.raise_if_bad()  # never checkpoint weights a NaN step produced
        if log_step:
            value = self.strategy.mean_value(self._fetch_loss(loss))  # the global batch's loss
            rate, global_rate = self._rate.rate, self._rate.global_rate
            self._report_compile_time(step)
            logger.info("| Train Device=%s, Step=%d, Loss=%.5f, Rate=%.2f samples/sec, GlobalRate=%.2f samples/sec",
                        self.device_name, step, value, rate, global_rate)
            self._write_train_summaries(step, value, rate, global_rate)
        results = self.evaluator.after_train_step()  # train_and_eval's, every eval_frequency steps
        if results and self._early_stopping is not None and self._early_stopping.update(results, step):
            self.should_stop = True
        if checkpoint_step:  # after the eval, so the checkpoint holds the early-stopping state of this step
            self.checkpoints.save()

    def _report_compile_time(self, step: int) -> None:
        """Once per run, at the first log step after a compile: the compile time the rates leave out."""
        seconds = self._rate.compile_time
        if seconds > 0 and not self._compile_reported:
            self._compile_reported = True
            logger.info("Compile time %.2f s (tracing and compiling the step; not counted in Rate and GlobalRate)",
                        seconds)
            self._summaries.add_scalars("train", {"compile_seconds": seconds}, step)

    def _write_train_summaries(self, step: int, loss: float, rate: float, global_rate: float) -> None:
        """Loss, learning rate(s), loss scale and throughput into model_dir/train."""
        scalars = {"loss": loss, "samples_per_sec": rate, "global_samples_per_sec": global_rate}
        rates = [float(group["lr"]) for group in self.optimizer.param_groups]
        if len(set(rates)) == 1:  # one rate, however many groups (weight decay splits every run's in two)
            scalars["lr"] = rates[0]
        else:
            scalars.update({f"lr/group_{i}": rate for i, rate in enumerate(rates)})
        if self.grad_scaler is not None:
            scalars["loss_scale"] = self.grad_scaler.get_scale()
        if self._sparsity_log is not None:
            scalars.update(self._sparsity_log.latest)
        scalars.update(pop_summarized_scalars())  # the model's own (summarize_scalar), as the vendor's trainer logs them
        self._summaries.add_scalars("train", scalars, step)

    def _fetch_loss(self, loss: torch.Tensor) -> float:
        return float(loss)  # host sync point (free on an eager CPU step, which already ran)

    @property
    def _defers_loss_check(self) -> bool:
        """Whether the loss check waits on the device for a log or checkpoint step (:mod:`._loss_check`)."""
        return self.torch_device.type != "cpu"

    def _raise_bad_loss(self, value: float, step: int) -> None:
        last = _checkpoint_files.newest_finite_checkpoint(self.model_dir)
        kept = f"the newest checkpoint with finite weights is {last}" if last else \
            "no checkpoint with finite weights exists"
        raise TrainingError(f"loss is {value} at step {step}; training stopped and {kept}. Lower the "
                            "learning rate, enable gradient clipping (optimizer.max_gradient_norm) or "
                            "check the data")

    # ------------------------------------------------------------------------------------ evaluation

    def evaluate(self, checkpoint: Optional[Path] = None) -> dict[str, float]:
        """Evaluate on eval_input (after loading ``checkpoint`` if given); returns loss and metrics
        (:meth:`Evaluator.evaluate <cs_run.runners._evaluator.Evaluator.evaluate>`)."""
        return self.evaluator.evaluate(checkpoint)

    def eval_all(self) -> dict[str, dict[str, float]]:
        """Evaluate every checkpoint in model_dir, oldest first; results keyed by step (:attr:`evaluator`'s)."""
        return self.evaluator.eval_all()

    # -------------------------------------------------------------------------- subclass extension

    def _train_step(self, micro_batches: list) -> torch.Tensor:
        raise NotImplementedError

    def _eval_step(self, batch: Any) -> torch.Tensor:
        raise NotImplementedError

    def _to_device(self, batch: Any) -> Any:
        return move_to_device(batch, self.torch_device)

    def _progress(self, desc: str, total: int):
        disable = True if self.params.runconfig.disable_progress_bar or not self.strategy.writes else None  # None: a TTY
        return tqdm(total=total, desc=desc, unit="step", disable=disable, dynamic_ncols=True, leave=False)


def _check_replica_loader(loader, section) -> None:
    """Replicas step together (each step all-reduces): loaders of different lengths would leave one
    replica waiting for the others, so they are refused up front. A loader whose batch is the params'
    whole batch_size did not split it (the global batch would be N times larger): warned."""
    strategy = parallel.current()  # the run's: run() made it current
    n, length = strategy.world_size, loader_length(loader)
    if n > 1 and section is not None and getattr(loader, "batch_size", None) == section.batch_size > 1 \
            and strategy.writes:
        logger.warning("train_input.batch_size=%d is the global batch of %d replicas, but the data function's loader "
                       "yields %d per replica (a global batch of %d); call cstorch.distributed."
                       "get_streaming_batch_size(batch_size) in it", section.batch_size, n, section.batch_size,
                       section.batch_size * n)
    if n == 1 or length is None:
        return
    total, = strategy.sum_values(length)
    if total != length * n:
        raise ParamsError(f"params: train_input: the {n} replicas' train loaders differ in length (this replica's "
                          f"has {length} batches, all together {int(total)}); shard the data evenly by "
                          "cstorch.distributed.get_streaming_rank() / num_streamers() and keep drop_last_batch")
