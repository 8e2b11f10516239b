"""PyTorchBaseRunner: the training and eval loops every runner shares.

The loop reads top to bottom in :meth:`PyTorchBaseRunner.train`. Subclasses differ only in how a step
executes (:meth:`_train_step`, :meth:`_eval_step`) and how values reach the host
(:meth:`_fetch_loss`); they never copy the loop.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
from tqdm import tqdm

from cs_run import distributed, parallel, replicas
from cs_run._logging import held_records, run_log
from cs_run.backend import Backend
from cs_run.batches import RateMeter, batch_size, loader_length, move_to_device
from cs_run.checkpoint.h5 import TargetMismatchError, check_target
from cs_run.creation import manual_seed
from cs_run.errors import CheckpointError, ParamsError, TrainingError
from cs_run.exits import error_text
from cs_run.interrupts import Aborted, Interrupted, StopFlag, stop_on_signal
from cs_run.metrics import MetricSet
from cs_run.params import Params, save_params
from cs_run.registry import resolve_object
from cs_run.resolve import data_function, model_function, resolve_params
from cs_run.runners import _build, _checkpoints, _memory, _model_dir
from cs_run.runners._early_stopping import EarlyStopping
from cs_run.runners._options import TRAINING_MODES, RunOptions
from cs_run.runners._progress import Progress
from cs_run.runners._reporting import Summaries
from cs_run.runners._rng import capture_rng_state, preserved_rng, restore_rng_state
from cs_run.runners._run_record import RunRecord
from cs_run.runners._step import StepConfig
from cs_run.runners.hooks import RunnerHooks
from cs_run.schedule import StepBudget, is_checkpoint_step, is_log_step
from cs_run.utils.streaming import RestartableDataLoader, StreamingLoader, load_state, replica_state

__all__ = ["PyTorchBaseRunner"]

logger = logging.getLogger("cs_run.runners")

def _runner_for_device(cls: Any, expected: type, spec: Any, device: str) -> type:
    """The user's runner class for ``device``: a subclass of the device's runner as it is, a subclass of
    PyTorchBaseRunner (hooks only, one class for every device) combined with the device's runner."""
    name = spec if isinstance(spec, str) else getattr(spec, "__qualname__", spec)
    if isinstance(cls, type) and issubclass(cls, expected):
        return cls
    device_runners = [c for c in PyTorchBaseRunner.__subclasses__() if c.__module__.startswith("cs_run.runners.")]
    if not (isinstance(cls, type) and issubclass(cls, PyTorchBaseRunner)) or issubclass(cls, tuple(device_runners)):
        raise ParamsError(f"params: runconfig.runner: {name!r} must be a subclass of cs_run.runners.{expected.__name__} "
                          f"for --device {device}, or of cs_run.runners.PyTorchBaseRunner alone (one class for "
                          "every device)")
    key = (cls, expected)
    if key not in _COMBINED:
        _COMBINED[key] = type(cls.__name__, (cls, expected), {"__module__": cls.__module__,
                                                              "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
    return _COMBINED[key]


_COMBINED: dict[tuple[type, type], type] = {}


def check_batch_split(params: Params, num_replicas: int) -> None:
    """The params' batch sizes are global batches: each must split evenly over the replicas."""
    for name in ("train_input", "eval_input"):
        section = getattr(params, name)
        if num_replicas > 1 and section is not None:
            try:
                replicas.split_batch(section.batch_size, num_replicas)
            except ValueError as e:
                raise ParamsError(f"params: {name}.batch_size: {e}") from None


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
                 lr_scheduler_fn: Optional[Callable] = None, options: Optional[RunOptions] = None) -> None:
        self.params = params
        self._data_fns = {"train": train_data_fn, "eval": eval_data_fn}
        self.device_type = device.upper()
        self.options = options if options is not None else RunOptions.resolve(params, self.device_type)
        """The run's options, checked once when the run was resolved (:meth:`create`); read them here."""
        self.backend = backend
        self.torch_device = backend.torch_device if backend is not None else self._resolve_torch_device(self.device_type)
        rc = params.runconfig
        self.model_dir = Path(rc.model_dir)
        self.progress = Progress()  # the train loop's step and epoch counters
        distributed.set_num_workers_per_csx(rc.num_workers_per_csx)
        if rc.seed is not None:
            manual_seed(rc.seed)
        # Build what can be wrong before anything is written: model and optimizer errors are params errors.
        self._metrics = MetricSet()  # what evaluate() reports: this run's metrics only (docs/architecture.md)
        with self._metrics.collecting():
            self.model = _build.build_model(params, model_fn).to(self.torch_device)
        self._metrics.add_module(self.model)
        self.sparsity = _build.build_sparsity(params, self.model)  # the params' sparsity section, or None
        self.strategy = parallel.use(parallel.build_strategy(rc.sharding, rc.offload))
        self.model = self.strategy.shard(self.model, self.torch_device)  # before the optimizer holds its parameters
        self.optimizer = None
        self.lr_scheduler = None
        self.grad_scaler = None
        if params.optimizer is not None:
            if optimizer_fn is not None:  # built by the caller (Trainer); its schedule too, if any
                self.optimizer = optimizer_fn(self.model)
                self.lr_scheduler = lr_scheduler_fn(self.optimizer) if lr_scheduler_fn else None
            else:
                self.optimizer = _build.build_optimizer(params.optimizer, self.model)
                self.lr_scheduler = _build.build_lr_scheduler(params.optimizer, self.optimizer)
            self.grad_scaler = _build.build_grad_scaler(params.optimizer)
            if self.sparsity is not None:
                self.sparsity.apply(self.optimizer)
        opt = params.optimizer
        self.step_config = StepConfig(
            max_gradient_norm=opt.max_gradient_norm if opt else None,
            max_gradient_value=opt.max_gradient_value if opt else None,
            autocast_dtype=_build.resolve_autocast_dtype(params.model, self.torch_device.type, self.device_type),
            device_type=self.torch_device.type,
        )
        if self.step_config.autocast_dtype is not None:
            logger.info("Mixed precision: %s autocast on %s", self.step_config.autocast_dtype, self.torch_device.type)
        self._train_loader = None
        self._eval_loader = None  # the first evaluation's, built by run() before model_dir is opened
        self._epoch_start_rng: Optional[dict] = None
        self._pending_resume: Optional[dict] = None
        self._summaries = Summaries(self.model_dir)
        self._stop = StopFlag()  # the signal flag while train() runs (docs/architecture.md#interrupts)
        self._saved: tuple[int, Optional[Path]] = (-1, None)  # (global step, path) of the newest checkpoint
        self._start: Optional[Path] = None  # the start checkpoint, resolved once before model_dir is written
        self._budget: Optional[tuple[int, StepBudget]] = None  # (start step, the training run's steps from it)
        self.should_stop = False
        """Set it in a hook to end training after the current step (with a checkpoint of that step)."""
        self._eval_during_training = False  # train_and_eval: every runconfig.eval_frequency steps
        self._eval_every: Optional[int] = None  # those steps in this run (train() resolves a fraction)
        self._last_eval: tuple[int, dict] = (-1, {})  # (global step, results) of the newest periodic eval
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
        ``builders`` (model_fn, train_data_fn, eval_data_fn, optimizer_fn, lr_scheduler_fn) replace the
        params' model, data and optimizer factories. ``mode``, when known, is checked against the
        params' sections first. Nothing of the user's code runs before model_dir, the sections and the
        model and data functions' keys are checked.
        """
        device = device.upper()
        collected = MetricSet()  # the run's metrics include those its user modules register when imported
        with _held_for_run_log(params) as created, collected.collecting():  # run.log begins with the creation's lines
            built = PyTorchBaseRunner._create(params, device, runner, mode, backend, builders)
        built._created_records = created
        built._metrics.update(collected)
        built._metrics.add_imported(built._code_modules(builders))  # also when imported by an earlier run
        return built

    def _code_modules(self, builders: dict[str, Optional[Callable]]) -> set[str]:
        """The modules of the run's own code: its model's and its runner's classes, the functions that
        build its model and data (whose module-level metrics are the run's: docs/architecture.md)."""
        fns = [fn for fn in builders.values() if fn is not None]
        if builders.get("model_fn") is None:
            fns.append(model_function(self.params))
        for split, name in (("train", "train_input"), ("eval", "eval_input")):
            if getattr(self.params, name) is not None and builders.get(f"{split}_data_fn") is None:
                fns.append(data_function(self.params, name))
        names = {type(m).__module__ for m in self.model.modules()} | {c.__module__ for c in type(self).__mro__}
        return names | {fn.__module__ for fn in fns if isinstance(getattr(fn, "__module__", None), str)}

    @staticmethod
    def _create(params: Params, device: str, runner: Optional[str], mode: Optional[str],
                backend: Optional[Backend], builders: dict[str, Optional[Callable]]) -> "PyTorchBaseRunner":
        rc = params.runconfig
        # The device's runner among the package's own subclasses (cs_run.runners imports them all).
        found = [c for c in PyTorchBaseRunner.__subclasses__() if device in c.devices
                 and c.__module__.startswith("cs_run.runners.")]
        if not found:
            raise ParamsError(f"--device: {device!r} is not one of CPU, GPU, CSX")
        expected: type = found[0]
        options = RunOptions.resolve(params, device)  # each run option, checked once and carried typed
        try:
            parallel.check_strategy(rc.sharding, rc.offload, rc.num_csx, device)
            strategy = parallel.build_strategy(rc.sharding, rc.offload)  # the runner makes it current (__init__)
            if mode != "eval_all" and not options.trace_only:  # the modes that load it
                _checkpoints.check_start_checkpoint(params, options.checkpoint_path)  # before anything is written
            _model_dir.check_model_dir(rc.model_dir)  # before any user code runs or anything is written
            if strategy.writes:  # ordinal 0 holds model_dir's lock (docs/architecture.md#replicas)
                _model_dir.check_not_locked(rc.model_dir)
            data_fns = {"train": builders.get("train_data_fn"), "eval": builders.get("eval_data_fn")}
            if mode is not None and not options.trace_only:
                options = options.for_mode(mode, params, data_fns)
            resolve_params(params, model_fn=builders.get("model_fn"), optimizer_fn=builders.get("optimizer_fn"),
                           data_fns=data_fns)
            spec = runner or rc.runner
            cls = expected
            if spec:
                cls = spec if isinstance(spec, type) else resolve_object(spec, key="runconfig.runner")
                cls = _runner_for_device(cls, expected, spec, device)
            target = backend.torch_device if backend is not None else torch.device(
                "cuda" if device in ("GPU", "CSX") and torch.cuda.is_available() else "cpu")
            _memory.check_model_fits(params, target, training=options.training or (
                mode is None and params.optimizer is not None), model_fn=builders.get("model_fn"),
                optimizer_fn=builders.get("optimizer_fn"))  # before a byte of the model is allocated
            if not options.trace_only:  # N replicas: launch or join them (never returns in a launcher)
                check_batch_split(params, rc.num_csx)
                strategy.start(rc.num_csx, device, rc.collective_timeout)
            return cls(params, device=device, backend=backend, options=options, **builders)
        except ParamsError as e:  # a value in the params file: name its file:line
            raise params.locate_error(e) from e.__cause__

    @staticmethod
    def _resolve_torch_device(device: str) -> torch.device:
        if device == "GPU":
            if not torch.cuda.is_available():
                raise ParamsError("--device GPU: no CUDA device is visible (torch.cuda.is_available() is False); "
                                  "use --device CPU")
            return torch.device("cuda")
        return torch.device("cpu")

    def run(self, mode: str) -> dict[str, Any]:
        """Run ``mode`` (train, eval, train_and_eval, eval_all); returns the eval results, if any."""
        if mode != self.options.mode:  # a runner created without this mode: its checks now, once
            try:
                self.options = self.options.for_mode(mode, self.params, self._data_fns)
            except ParamsError as e:
                raise self.params.locate_error(e) from e.__cause__
        if mode == "eval_all" and not _checkpoints.list_checkpoints(self.model_dir):  # a typo'd model_dir stays unmade
            raise ParamsError(f"eval_all: no checkpoint_<step>.mdl files in {self.model_dir}; give the --model_dir "
                              "of a run that saved checkpoints")
        with _held_for_run_log(self.params) as early:  # run.log begins with their lines
            self._check_before_writing(mode)
        early, self._created_records = [*self._created_records, *early], []  # the creation's lines go first, once
        with self._open_model_dir(mode, early), self._metrics.collecting():  # a metric the first step creates is the run's
            logger.info("cs-run %s on %s, model_dir %s", mode, self.device_type, self.model_dir)
            try:
                if mode == "train":
                    self.train()
                    return {}
                if mode == "eval":
                    if self._start is None:
                        logger.warning("No checkpoint in %s and no checkpoint_path: evaluating randomly "
                                       "initialized weights", self.model_dir)
                    return self.evaluate(checkpoint=self._start)
                if mode == "train_and_eval":  # the Model Zoo's: evaluations during training only in this mode
                    self._eval_during_training = True
                    self.train()
                    step, results = self._last_eval
                    return results if step == self.global_step and results else self.evaluate()
                return self.eval_all()
            except ParamsError as e:  # e.g. a data function rejecting its section's values
                raise self.params.locate_error(e) from e.__cause__
            finally:
                self._summaries.close()

    def _check_before_writing(self, mode: str) -> None:
        """What the run can refuse before it starts, refused before model_dir is made or written
        (docs/architecture.md#a-runs-files-and-its-end): the checkpoint it starts from must fit the
        model, its loaders are built (a data function's refusal, such as a missing data_dir; an empty
        eval loader), the early-stopping metric must be one the eval reports, and a training run's step
        budget must hold from the checkpoint's global step. eval_all's checkpoints must all fit the model
        (a damaged one is not refused here: the evaluation skips it). The loaders built here are the run's,
        as are the start checkpoint and the step budget resolved here."""
        training = mode in TRAINING_MODES
        self._train_loader = self._eval_loader = self._start = self._budget = None
        try:
            start = None
            if mode == "eval_all":
                self._check_all_fit()
            else:
                self._start = self._initial_checkpoint()  # resolved once (one broadcast among replicas)
                start = self._check_start_fits(self._start, training)
            if training:
                self._train_loader = _build.build_dataloader(self.params, "train", self._data_fns["train"])
                _check_replica_loader(self._train_loader, self.params.train_input)
                if self._early_stopping is not None:
                    self._early_stopping.check_metric(["eval/loss", *self._metrics.metrics()], self.params.head,
                                                      self.params.name("runconfig.early_stopping_metric"))
                self._step_budget(_checkpoints.stored_step(start) if start and self.options.loads_step else 0)
            if mode != "train":  # built before training, so it leaves training's random streams as they were
                with preserved_rng(getattr(self._train_loader, "generator", None)) if training else \
                        contextlib.nullcontext():
                    self._eval_loader = self._build_eval_loader()
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
        rc = self.params.runconfig
        if rc.eval_frequency and not self._eval_during_training:  # the Model Zoo's own files set it for train too
            logger.info("%s=%s has no effect here: only train_and_eval (cs-run train-and-eval, a Trainer.fit with "
                        "a val_dataloader) evaluates during training, as in the Model Zoo",
                        self.params.name("runconfig.eval_frequency"), rc.eval_frequency)
        if self._early_stopping is not None:
            self._early_stopping.log_start()
        loader, progress = self._train_loader, self.progress  # the loader: built and checked by run()
        self._load_initial_state(self._start)  # the start checkpoint run() resolved and checked
        budget = self._step_budget(progress.global_step)  # run() computed it, unless the load fell back
        self._restore_data_position(loader)  # after the budget: an epoch is a fresh loader's pass
        if self._pending_resume is not None and progress.epoch_step >= budget.steps_per_epoch:
            # The checkpoint closed an epoch: the next one starts fresh from the checkpoint's RNG.
            restore_rng_state(self._pending_resume["rng"], getattr(loader, "generator", None))
            self._pending_resume = None
            progress.epoch_done()
        if rc.save_initial_checkpoint and progress.global_step == 0:
            self._save_checkpoint()
        progress.start_run(budget.steps)
        ef = rc.eval_frequency  # steps between periodic evals: a count, or a fraction of this run (the vendor's)
        self._eval_every = math.ceil(ef * budget.steps) if isinstance(ef, float) else ef
        end_step = progress.global_step + budget.steps
        logger.info("Training %d steps (global step %d -> %d), %d per epoch", budget.steps, progress.global_step,
                    end_step, budget.steps_per_epoch)
        if self.strategy.writes:  # now, not earlier: a run refused before its first step keeps the previous run's
            save_params(self.params, self.model_dir)
        self.model.train()
        self._rate = RateMeter(window=rc.log_steps or budget.steps)
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
            self._after_train_step(loss, micro_batches, end_step)
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
        step, path = self._saved
        if step != self.global_step:
            self._raise_on_bad_loss()  # never checkpoint weights a NaN step produced
            path = self._save_checkpoint()
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
        resume = self._pending_resume
        self._pending_resume = None
        if resume is not None:
            restore_rng_state(resume["epoch_start_rng"], generator)
        self._epoch_start_rng = capture_rng_state(generator)
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

    def _after_train_step(self, loss: torch.Tensor, micro_batches: list, end_step: int) -> None:
        """Host work after a step: loss check, logging, checkpoint, periodic eval."""
        rc = self.params.runconfig
        step, run_step, run_steps = self.progress.global_step, self.progress.run_step, self.progress.run_steps
        self._rate.tick(sum(batch_size(b) for b in micro_batches) * self.strategy.world_size)  # all replicas' samples
        log_step = is_log_step(run_step, run_steps, rc.log_steps)
        checkpoint_step = is_checkpoint_step(run_step, run_steps, rc.checkpoint_steps)
        self._track_loss(loss, step)
        if log_step or checkpoint_step:
            self._raise_on_bad_loss()  # never checkpoint weights a NaN step produced
        if log_step:
            value = self.strategy.mean_value(self._fetch_loss(loss))  # the global batch's loss
            rate, global_rate = self._rate.rate, self._rate.global_rate
            self._report_compile_time(step)
            logger.info("| Train Device=%s, Step=%d, Loss=%.5f, Rate=%.2f samples/sec, GlobalRate=%.2f samples/sec",
                        self.device_name, step, value, rate, global_rate)
            self._write_train_summaries(step, value, rate, global_rate)
        if self._eval_during_training and self._eval_every and run_step % self._eval_every == 0 and step != end_step:
            with preserved_rng(getattr(self._train_loader, "generator", None)):  # the last step's: run()'s final eval
                results = self.evaluate()
            self._last_eval = (step, results)
            self.model.train()
            if results and self._early_stopping is not None and self._early_stopping.update(results, step):
                self.should_stop = True
        if checkpoint_step:  # after the eval, so the checkpoint holds the early-stopping state of this step
            self._save_checkpoint()

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
        groups = self.optimizer.param_groups
        for i, group in enumerate(groups):
            scalars["lr" if len(groups) == 1 else f"lr/group_{i}"] = float(group["lr"])
        if self.grad_scaler is not None:
            scalars["loss_scale"] = self.grad_scaler.get_scale()
        self._summaries.add_scalars("train", scalars, step)

    def _fetch_loss(self, loss: torch.Tensor) -> float:
        return float(loss)  # host sync point (free on an eager CPU step, which already ran)

    def _track_loss(self, loss: torch.Tensor, step: int) -> None:
        """Per-step NaN/inf check. The eager runner reads the value at once, so it stops at the bad step."""
        value = float(loss)
        if not math.isfinite(value):
            self._raise_bad_loss(value, step)

    def _raise_on_bad_loss(self) -> None:
        """Called on log and checkpoint steps; runners that defer the per-step check raise here."""

    def _raise_bad_loss(self, value: float, step: int) -> None:
        last = _checkpoints.newest_finite_checkpoint(self.model_dir)
        kept = f"the newest checkpoint with finite weights is {last}" if last else \
            "no checkpoint with finite weights exists"
        raise TrainingError(f"loss is {value} at step {step}; training stopped and {kept}. Lower the "
                            "learning rate, enable gradient clipping (optimizer.max_gradient_norm) or "
                            "check the data")

    # ------------------------------------------------------------------------------------ evaluation

    def evaluate(self, checkpoint: Optional[Path] = None) -> dict[str, float]:
        """Evaluate on eval_input (after loading ``checkpoint`` if given); returns loss and metrics."""
        if checkpoint is not None:
            self._load_weights(checkpoint)
        loader, self._eval_loader = self._eval_loader, None  # run() built the first evaluation's
        if loader is None:
            loader = self._build_eval_loader()
        available, limit = loader_length(loader), self.params.runconfig.eval_steps
        if limit and available is not None and limit > available:
            logger.warning("%s=%d but the eval loader has %d batches: evaluating %d",
                           self.params.name("runconfig.eval_steps"), limit, available, available)
        total_steps = min(x for x in (limit, available) if x is not None) if (limit or available) else None
        self.model.eval()
        self._metrics.reset()
        self.on_eval_start()
        self.on_eval_epoch_start()
        total_loss, steps = None, 0
        with self._progress("Eval", total_steps) as bar:
            for batch in loader:
                if total_steps is not None and steps >= total_steps:
                    break
                if self._stop.requested:  # a signal during a periodic eval: the train loop saves and stops
                    logger.warning("Eval interrupted after %d batches: no eval results for step %d", steps,
                                   self.global_step)
                    return {}
                batch = self.on_eval_batch_start(self._to_device(batch))
                loss = self._eval_step(batch)
                steps += 1
                self.on_eval_batch_end(loss, 0, steps)
                total_loss = loss.float() if total_loss is None else total_loss + loss.float()
                bar.update(1)
        if steps == 0:
            raise _no_eval_batch(self.params)
        early_exit = available is not None and steps < available
        self.on_eval_epoch_end(early_exit=early_exit)
        self.on_eval_end(early_exit=early_exit)
        loss_sum, all_steps = self.strategy.sum_values(self._fetch_loss(total_loss), steps)  # over replicas' shards
        results = {"eval/loss": loss_sum / all_steps, **self._metrics.compute()}
        summary = ", ".join(f"{k}={v:.5f}" for k, v in results.items())
        logger.info("| Eval Device=%s, GlobalStep=%d, Batches=%d, %s", self.device_name, self.global_step, steps,
                    summary)
        self._summaries.add_scalars("eval", {k.removeprefix("eval/"): v for k, v in results.items()},
                                    self.global_step, flush=True)
        self.on_eval_metrics(dict(results), self.global_step)
        return results

    def _build_eval_loader(self) -> Any:
        loader = _build.build_dataloader(self.params, "eval", self._data_fns["eval"])
        if loader_length(loader) == 0:
            raise _no_eval_batch(self.params)
        return loader

    def eval_all(self) -> dict[str, dict[str, float]]:
        """Evaluate every checkpoint in model_dir, oldest first; results keyed by step."""
        found = _checkpoints.list_checkpoints(self.model_dir)
        if not found:
            raise CheckpointError(f"eval_all: no checkpoint_<step>.mdl files in {self.model_dir}")
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

    # ----------------------------------------------------------------------------------- checkpoints

    def _initial_checkpoint(self) -> Optional[Path]:
        """The checkpoint the run starts from: the one the user named, else (autoload) the newest in model_dir."""
        path = self.options.checkpoint_path
        if path is not None:
            if not path.is_file():
                raise ParamsError(f"params: runconfig.checkpoint_path: no such file {path}")
            return path
        latest = _checkpoints.latest_checkpoint(self.model_dir) if self.options.autoload_checkpoint else None
        return self.strategy.broadcast_object(latest)  # every replica resumes from ordinal 0's choice

    def _start_target(self, training: bool) -> dict[str, Any]:
        """The live tensors a start checkpoint goes into: the model's, and the optimizer's to train
        (read in place; with a sharded strategy through :meth:`Strategy.load_target`)."""
        target = {"model": self.model.state_dict()}
        if training and self.optimizer is not None:
            target["optimizer"] = self.optimizer.state_dict()  # state tensors are read in place
        return target

    def _start_candidates(self, path: Path, training: bool) -> list[Path]:
        """The checkpoints a start from ``path`` tries, in order: autoload (training) falls back past
        damaged or truncated checkpoints, newest first; an explicit one, or an eval's, is final."""
        if self.options.checkpoint_path or not training:
            return [path]
        return [path, *(p for _, p in reversed(_checkpoints.list_checkpoints(self.model_dir)) if p != path)]

    def _check_start_fits(self, path: Optional[Path], training: bool) -> Optional[Path]:
        """The checkpoint the run starts from (``path`` or, autoloading, an older fallback), checked against
        the model (keys, dtypes, shapes; no tensor data read) before model_dir is written; None when it
        starts fresh. A damaged autoload candidate is left to the load, which skips it with a warning."""
        if path is None:
            return None
        target = self._start_target(training)
        explicit = self.options.checkpoint_path is not None
        for candidate in self._start_candidates(path, training):
            try:
                check_target(candidate, self.strategy.load_target(target, torch.device("meta")))
                return candidate
            except TargetMismatchError as e:
                raise _checkpoints.not_this_models(self.params, e, autoloaded=not explicit, training=training) from None
            except CheckpointError:
                if explicit or not training:
                    raise
        return None

    def _check_all_fit(self) -> None:
        """eval_all: every checkpoint in model_dir fits the model (keys, dtypes, shapes; no tensor data
        read), oldest first; a damaged one is left to the evaluation, which logs and skips it."""
        target = self.strategy.load_target(self._start_target(training=False), torch.device("meta"))
        for _, path in _checkpoints.list_checkpoints(self.model_dir):
            try:
                check_target(path, target)
            except TargetMismatchError as e:
                raise _checkpoints.not_this_models(self.params, e, autoloaded=True, every=path) from None
            except CheckpointError:
                continue

    def _checkpoint_state(self) -> dict[str, Any]:
        """Everything an exact resume needs (weights, optimizer, schedule, scaler, RNG, data position)."""
        state: dict[str, Any] = {"model": self.model.state_dict(), "global_step": self.global_step}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        state = self.strategy.gather(state)  # sharded tensors whole (a collective): the one-file form
        if self.lr_scheduler is not None:
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        if self.grad_scaler is not None:
            state["grad_scaler"] = self.grad_scaler.state_dict()
        if self.sparsity is not None:
            state["sparsity"] = self.sparsity.state_dict()
        if self._early_stopping is not None:
            state["early_stopping"] = self._early_stopping.state_dict()
        generator = getattr(self._train_loader, "generator", None)
        state["rng"] = capture_rng_state(generator)
        if self._epoch_start_rng is not None:
            state["dataloader"] = {"epoch": self.progress.epoch, "epoch_step": self.progress.epoch_step,
                                   "epoch_start_rng": self._epoch_start_rng, **self._data_topology()}
            loader = self._train_loader
            if isinstance(loader, StreamingLoader) and loader.is_restartable:
                state["dataloader"]["workers"] = loader.state_dict()  # a collective with several replicas
            elif isinstance(loader, RestartableDataLoader):  # the replica streams itself (one worker)
                steps = self.progress.run_step
                state["dataloader"]["workers"] = replica_state(
                    loader, steps, steps * self.params.optimizer.grad_accum_steps, self.progress.samples_streamed)
        return state

    def _data_topology(self) -> dict[str, int]:
        return {"num_csx": distributed.get_world_size(), "num_workers_per_csx": distributed.num_workers_per_csx()}

    def _restore_data_position(self, loader: Any) -> None:
        """Put the train loader where the checkpoint's data position says (see
        docs/architecture.md#streaming-workers): a restartable loader loads the saved workers' state
        (deaggregated for each worker, whatever the topology; nothing is replayed); otherwise the epoch's
        done batches are replayed, which is exact in the topology that wrote the checkpoint and keeps the
        step count (not the samples) in another."""
        resume = self._pending_resume
        if resume is None:
            return
        saved = {k: resume.get(k) for k in self._data_topology()}
        if resume.get("workers") is not None and isinstance(loader, StreamingLoader) and loader.is_restartable:
            loader.load_state_dict(resume["workers"])
            resume["positioned"] = True
        elif resume.get("workers") is not None and isinstance(loader, RestartableDataLoader):
            load_state(loader, resume["workers"])
            resume["positioned"] = True
        elif saved != self._data_topology() and all(v is not None for v in saved.values()):
            logger.warning("The checkpoint's data position was written with num_csx=%s x num_workers_per_csx=%s "
                           "input streams and this run has %s x %s: it resumes at the same step by replaying the "
                           "epoch's done batches with the new streams, which is exact only if the data function's "
                           "global order does not depend on the number of streams (a restartable dataloader records "
                           "its position exactly)", saved["num_csx"], saved["num_workers_per_csx"],
                           *self._data_topology().values())

    def _save_checkpoint(self) -> Path:
        path = _checkpoints.checkpoint_path(self.model_dir, self.global_step)
        state = self._checkpoint_state()
        bad = _checkpoints.nonfinite_keys(state)  # one device-side reduction, read once per checkpoint
        if bad:
            good = _checkpoints.newest_finite_checkpoint(self.model_dir)
            kept = f"the newest checkpoint with finite weights is {good}; a rerun resumes from it" if good \
                else "no checkpoint with finite weights exists; a rerun starts fresh"
            more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
            raise TrainingError(f"weights are not finite after step {self.global_step} ({bad[0]}{more} hold nan or "
                                f"inf); training stopped, nothing was saved for this step and {kept}. Lower the "
                                "learning rate, enable gradient clipping (optimizer.max_gradient_norm) or check "
                                "the data")
        self._saved = (self.global_step, path)
        if self.strategy.writes:  # the replicas' (gathered) states are equal: ordinal 0 writes it once
            _checkpoints.save_checkpoint(state, path)
            logger.info("Saved checkpoint %s", path)
            _checkpoints.prune_checkpoints(self.model_dir, self.params.runconfig.max_checkpoints)
            self.on_checkpoint_saved(str(path), self.global_step)
        return path

    def _load_initial_state(self, path: Optional[Path]) -> None:
        """Resume training from ``path``: weights, optimizer, schedule, scaler, step, RNG and data position."""
        if path is None:
            return
        wanted = self.options.load_states
        live = {k: v for k, v in self._start_target(training=True).items() if wanted is None or k in wanted}
        target = self.strategy.load_target(live)
        for candidate in self._start_candidates(path, training=True):
            try:
                state = self.strategy.place_loaded(live, _checkpoints.load_checkpoint(candidate, target))
                path = candidate
                break
            except TargetMismatchError as e:  # an older fallback of another model (run() checked the newest)
                raise _checkpoints.not_this_models(self.params, e,
                                                   autoloaded=self.options.checkpoint_path is None) from None
            except CheckpointError as e:
                if self.options.checkpoint_path is not None:
                    raise
                logger.warning("Skipping checkpoint %s: %s", candidate, e)
        else:
            raise CheckpointError(f"no checkpoint in {self.model_dir} can be read (see the warnings above); use another "
                                  "--model_dir or --set runconfig.autoload_checkpoint=false to start fresh")
        if wanted is not None:
            state = self._keep_states(state, wanted, path)
        self.progress.global_step = int(state.get("global_step", 0))
        for key, part in (("optimizer", self.optimizer), ("lr_scheduler", self.lr_scheduler),
                          ("grad_scaler", self.grad_scaler), ("sparsity", self.sparsity)):
            if part is not None and key in state:
                part.load_state_dict(state[key])
        if self._early_stopping is not None and "early_stopping" in state:
            self._early_stopping.load_state_dict(state["early_stopping"])
        data = state.get("dataloader")
        if data is not None:
            self.progress.epoch, self.progress.epoch_step = int(data["epoch"]), int(data["epoch_step"])
            self._pending_resume = {"epoch_start_rng": data["epoch_start_rng"], "rng": state["rng"],
                                    **{k: data.get(k) for k in ("num_csx", "num_workers_per_csx", "workers")}}
        elif "rng" in state:
            restore_rng_state(state["rng"])
        logger.info("Resuming from checkpoint %s at global step %d", path, self.global_step)

    def _keep_states(self, state: dict[str, Any], wanted: frozenset[str], path: Path) -> dict[str, Any]:
        """The Model Zoo's LoadCheckpointStates: only ``wanted`` states of the checkpoint; the rest start
        fresh. A name the checkpoint does not hold is an error naming the key."""
        unknown = sorted(wanted - set(state))
        if unknown:
            raise ParamsError(f"params: runconfig.load_checkpoint_states: {', '.join(unknown)} not in {path.name}, "
                              f"which holds {', '.join(sorted(state))}{self.params.where('runconfig.load_checkpoint_states')}")
        dropped = sorted(set(state) - wanted)
        if dropped:
            logger.info("Not loading %s of %s (runconfig.load_checkpoint_states: %s)", ", ".join(dropped), path.name,
                        ", ".join(sorted(wanted)))
        return {k: v for k, v in state.items() if k in wanted}

    def _load_weights(self, path: Path) -> None:
        live = self._start_target(training=False)
        state = self.strategy.place_loaded(live, _checkpoints.load_checkpoint(path, self.strategy.load_target(live)))
        self.progress.global_step = int(state.get("global_step", 0))
        logger.info("Loaded weights of %s (global step %d)", path, self.global_step)

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


def _held_for_run_log(params: Params) -> contextlib.AbstractContextManager[list[logging.LogRecord]]:
    """The log records of the block, kept for run.log on ordinal 0 (its one writer); none elsewhere."""
    return held_records(params.runconfig.logging) if parallel.current().writes else contextlib.nullcontext([])


def _no_eval_batch(params: Params) -> ParamsError:
    """An eval loader without a batch, named as the user gave it (eval_input, the Trainer's val_dataloader)."""
    section = params.name("eval_input")
    fix = "eval_input.batch_size and drop_last_batch" if section == "eval_input" else "its batch_size and drop_last"
    return ParamsError(f"{params.head}{section}: the eval loader yields no batch; check {fix}")


def _check_replica_loader(loader, section) -> None:
    """Replicas step together (each step all-reduces): loaders of different lengths would leave one
    replica waiting for the others, so they are refused up front. A loader whose batch is the params'
    whole batch_size did not split it (the global batch would be N times larger): warned."""
    strategy = parallel.current()
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
