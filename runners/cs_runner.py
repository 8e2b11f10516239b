"""The CSX runners: the same loop and hooks, with each step traced once, compiled and replayed.

Which hooks run where on CSX:

* every hook runs on the host, between steps, as on CPU; the hooks never run inside the graph;
* the step between ``on_*_batch_start`` and ``on_*_batch_end`` is the compiled graph (forward,
  backward, clipping, loss scaling, optimizer and LR steps, metric updates); its Python ran once;
* ``loss`` given to ``on_*_batch_end`` is the step's device tensor: read it in a step closure;
* values reach the host on log steps (loss), checkpoint steps and the last step (weights) only; the
  per-step NaN check stays on the device and is read on those steps, so a bad loss stops the run at
  the next log or checkpoint step (naming the first bad step), never after writing its weights.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable, Optional

import torch

from cs_run.backend import Backend
from cs_run.backend import backend as make_backend
from cs_run.distributed import ClusterConfig, ClusterOptions
from cs_run.engine.step import CompiledStep
from cs_run.errors import ParamsError
from cs_run.params import Params, RunConfig
from cs_run.runners import _build
from cs_run.runners._run_options import RunOptions
from cs_run.runners._step import eval_step, train_step
from cs_run.runners.base import PyTorchBaseRunner
from cs_run.tracing import compile as cs_compile

__all__ = ["PyTorchCSRunner", "PyTorchCSCompiler", "create_backend"]

logger = logging.getLogger("cs_run.runners")

# Cluster keys that only mean something on the vendor's appliance (python_paths does act locally):
# accepted, recorded, and logged once when they differ from RunConfig's defaults.
_APPLIANCE_ONLY = [f.name for f in dataclasses.fields(ClusterOptions) if f.metadata.get("appliance_only")]


def create_backend(params: Params, options: Optional[RunOptions] = None) -> Backend:
    """The process's CSX backend from runconfig (compile_dir, compile/validate only, cluster flags) and
    the run's resolved ``options`` (its compile_tier; without them, runconfig's, checked by the backend)."""
    rc = params.runconfig
    defaults = RunConfig()
    for key in _APPLIANCE_ONLY:
        value = getattr(rc, key)
        if value != getattr(defaults, key):
            logger.info("runconfig.%s=%s is recorded in the resolved params but has no effect on this machine "
                        "(it configures the Cerebras appliance)", key, value)
    cluster = ClusterConfig(**{f.name: getattr(rc, f.name) for f in dataclasses.fields(ClusterOptions)})
    return make_backend("CSX", artifact_dir=rc.model_dir, compile_dir=rc.compile_dir, compile_only=rc.compile_only,
                        validate_only=rc.validate_only, cluster_config=cluster,
                        compile_tier=rc.compile_tier if options is None else options.compile_tier)


class PyTorchCSRunner(PyTorchBaseRunner):
    """Runs train and eval steps on the CSX engine: traced once, compiled (cached), replayed.

    With a compile-only or validate-only backend (``trace_only``) :meth:`run` traces the train (or
    eval) step on one batch and runs nothing: validate-only checks compliance and reports the graph,
    compile-only also compiles it into compile_dir, so the next CSX run of the same model hits the
    cache. No weights change and no checkpoint is written. Being a mode of this class, it works for
    every subclass, the user's too.

    Args:
        backend: the CSX backend to run on; by default one is made from runconfig (compile_dir,
            compile_only / validate_only, cluster flags).
    """

    device_name = "CSX"
    devices = ("CSX",)

    def __init__(self, params: Params, *, device: str = "CSX", backend: Optional[Backend] = None,
                 options: Optional[RunOptions] = None, **builders: Optional[Callable]) -> None:
        # The backend comes first: the vendor API configures it before the model is built.
        options = options if options is not None else RunOptions.resolve(params, "CSX")
        backend = backend if backend is not None else create_backend(params, options)
        if not backend.is_csx:
            raise ParamsError(f"PyTorchCSRunner needs a CSX backend, got {backend.backend_type!r}")
        super().__init__(params, device="CSX", backend=backend, options=options, **builders)
        cs_compile(self.model, self.backend)
        self.trace_only = self.backend.compile_only or self.backend.validate_only
        self._cs_train_step = self._compiled_train_step() if self.optimizer is not None else None
        self._cs_eval_step = self._compiled_eval_step()
        # How many steps are left is what tier auto weighs against an inductor build (engine/compile.py).
        if self._cs_train_step is not None:
            self._cs_train_step.steps_left = self._train_steps_left
        self._cs_eval_step.steps_left = self.evaluator.steps_left

    # The compiled functions close over the model, optimizer, schedule and scaler: the engine finds their
    # tensors through the closure and makes them graph state. Python settings are frozen at the trace.
    def _compiled_train_step(self) -> CompiledStep:
        step = functools.partial(train_step, self.model, optimizer=self.optimizer, lr_scheduler=self.lr_scheduler,
                                 grad_scaler=self.grad_scaler, config=self.step_config)
        return CompiledStep(_named(step, "csx_train_step"), self.backend.engine_options())

    def _compiled_eval_step(self) -> CompiledStep:
        step = functools.partial(eval_step, self.model, config=self.step_config)
        return CompiledStep(_named(step, "csx_eval_step"), self.backend.engine_options())

    def _train_steps_left(self) -> Optional[int]:
        """This training run's steps still to run, the current one included; None outside training."""
        progress = self.progress
        return None if progress.run_start is None else progress.run_steps - progress.run_step

    def _train_step(self, micro_batches: list) -> torch.Tensor:
        return self._cs_train_step(micro_batches)

    def _eval_step(self, batch: Any) -> torch.Tensor:
        return self._cs_eval_step(batch)

    def _run(self, mode: str) -> dict[str, Any]:
        """Run ``mode``; with a compile-only / validate-only backend, trace its step instead (see the class)."""
        return self._trace(mode) if self.trace_only else super()._run(mode)

    def _trace(self, mode: str) -> dict[str, Any]:
        if mode not in ("train", "eval"):
            raise ParamsError(f"--mode: {mode!r}: compile-only / validate-only trace the 'train' or 'eval' step")
        what = "compile-only" if self.backend.compile_only else "validate-only"
        step_fn = self._cs_train_step if mode == "train" else self._cs_eval_step
        try:  # the params and the data function's batches, before model_dir is made or written
            if step_fn is None:
                raise ParamsError("params: missing section optimizer (needed to trace the train step)")
            loader = _build.build_dataloader(self.params, mode, self._data_fns[mode])
            accum = self.params.optimizer.grad_accum_steps if mode == "train" else 1
            batches = self._next_batches(iter(loader), accum)
            if len(batches) < accum:
                accum_key = " and optimizer.grad_accum_steps" if mode == "train" else ""
                raise ParamsError(f"params: {mode}_input: the loader yielded no full step to trace; check "
                                  f"{mode}_input.batch_size, drop_last_batch{accum_key}")
        except ParamsError as e:
            raise self.params.locate_error(e) from e.__cause__
        with self._open_model_dir(f"{what.replace('-', '_')} ({mode})"):
            logger.info("cs-run %s of the %s step, model_dir %s", what, mode, self.model_dir)
            self.model.train(mode == "train")
            step_fn(batches if mode == "train" else batches[0])
            summary = step_fn.last_summary  # the engine's "traced" line above has logged it: said once
            logger.info("%s passed: the %s step traced%s", what, mode,
                        "" if self.backend.validate_only else " and compiled")
            return {"summary": summary.format(), "graph": summary}

    @property
    def _defers_loss_check(self) -> bool:
        return True  # the compiled step's loss is read on log and checkpoint steps only, also on a CPU


PyTorchCSCompiler = PyTorchCSRunner
"""The earlier name of the compile-only / validate-only runner, now a mode of :class:`PyTorchCSRunner`."""


def _named(fn: functools.partial, name: str) -> functools.partial:
    fn.__qualname__ = fn.__name__ = name  # what the engine's log and recompile warnings call the step
    return fn
