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
import logging
from typing import Any, Callable, Optional

import torch

from cs_run.distributed import ClusterOptions
from cs_run.errors import ParamsError
from cs_run.params import Params, RunConfig
from cs_run.runners import _build
from cs_run.runners._step import eval_step, train_step
from cs_run.runners.base import PyTorchBaseRunner

__all__ = ["PyTorchCSRunner", "PyTorchCSCompiler"]

logger = logging.getLogger("cs_run.runners")

# Cluster keys that only mean something on the vendor's appliance (python_paths does act locally):
# accepted, recorded, and logged once when they differ from RunConfig's defaults.
_APPLIANCE_ONLY = [f.name for f in dataclasses.fields(ClusterOptions) if f.metadata.get("appliance_only")]


def create_backend(params: Params):
    """The process's CSX backend from runconfig (compile_dir, compile/validate only, cluster flags)."""
    import cs_run
    from cs_run.distributed import ClusterConfig

    rc = params.runconfig
    defaults = RunConfig()
    for key in _APPLIANCE_ONLY:
        value = getattr(rc, key)
        if value != getattr(defaults, key):
            logger.info("runconfig.%s=%s is recorded in the resolved params but has no effect on this machine "
                        "(it configures the Cerebras appliance)", key, value)
    cluster = ClusterConfig(**{f.name: getattr(rc, f.name) for f in dataclasses.fields(ClusterOptions)})
    compile_dir = rc.compile_dir or f"{rc.model_dir}/cached_compile"
    return cs_run.backend("CSX", artifact_dir=rc.model_dir, compile_dir=compile_dir, compile_only=rc.compile_only,
                          validate_only=rc.validate_only, cluster_config=cluster, compile_tier=rc.compile_tier)


class PyTorchCSRunner(PyTorchBaseRunner):
    """Runs train and eval steps on the CSX engine: traced once, compiled (cached), replayed."""

    device_name = "CSX"

    def __init__(self, params: Params, *, device: str = "CSX", **builders: Optional[Callable]) -> None:
        self.backend = create_backend(params)  # first: the vendor API configures before building the model
        super().__init__(params, device="CSX", **builders)
        import cs_run

        cs_run.compile(self.model, self.backend)
        self._first_bad_step: Optional[torch.Tensor] = None
        self._bad_loss: Optional[torch.Tensor] = None
        self._cs_train_step = self._trace_train_step() if self.optimizer is not None else None
        self._cs_eval_step = self._trace_eval_step()

    def _resolve_torch_device(self, device: str) -> torch.device:
        return self.backend.torch_device

    # The traced functions close over the model, optimizer, schedule and scaler: the engine finds their
    # tensors through the closure and makes them graph state. Python settings are frozen at the trace.
    def _trace_train_step(self):
        import cs_run

        model, optimizer, lr_scheduler = self.model, self.optimizer, self.lr_scheduler
        grad_scaler, config = self.grad_scaler, self.step_config

        @cs_run.trace
        def csx_train_step(micro_batches):
            return train_step(model, micro_batches, optimizer, lr_scheduler, grad_scaler, config)

        return csx_train_step

    def _trace_eval_step(self):
        import cs_run

        model, config = self.model, self.step_config

        @cs_run.trace
        def csx_eval_step(batch):
            return eval_step(model, batch, config)

        return csx_eval_step

    def _train_step(self, micro_batches: list) -> torch.Tensor:
        return self._cs_train_step(micro_batches)

    def _eval_step(self, batch: Any) -> torch.Tensor:
        return self._cs_eval_step(batch)

    def _track_loss(self, loss: torch.Tensor, step: int) -> None:
        """Remember the first non-finite step on the device: no host sync per step."""
        bad = ~torch.isfinite(loss.detach())
        if self._first_bad_step is None:
            self._first_bad_step = torch.zeros((), dtype=torch.int64, device=loss.device)
            self._bad_loss = torch.zeros((), dtype=loss.dtype, device=loss.device)
        first = bad & (self._first_bad_step == 0)
        self._first_bad_step = torch.where(first, step, self._first_bad_step)
        self._bad_loss = torch.where(first, loss.detach(), self._bad_loss)

    def _raise_on_bad_loss(self) -> None:
        if self._first_bad_step is not None:
            step = int(self._first_bad_step)  # host sync point: log and checkpoint steps only
            if step:
                self._raise_bad_loss(float(self._bad_loss), step)


class PyTorchCSCompiler(PyTorchCSRunner):
    """compile-only / validate-only: traces the train (or eval) step on one batch; runs no step.

    validate-only checks compliance and reports the graph; compile-only also compiles it into
    compile_dir, so the next CSX run of the same model hits the cache. No weights change and no
    checkpoint is written.
    """

    def run(self, mode: str) -> dict[str, Any]:
        if mode not in ("train", "eval"):
            raise ParamsError(f"--mode: {mode!r}: compile-only / validate-only trace the 'train' or 'eval' step")
        what = "compile-only" if self.params.runconfig.compile_only else "validate-only"
        with self._open_model_dir():
            logger.info("cs-run %s of the %s step, model_dir %s", what, mode, self.model_dir)
            step_fn = self._cs_train_step if mode == "train" else self._cs_eval_step
            if step_fn is None:
                raise ParamsError("params: missing section optimizer (needed to trace the train step)")
            loader = _build.build_dataloader(self.params, mode, self._data_fns[mode])
            accum = self.params.optimizer.grad_accum_steps if mode == "train" else 1
            batches = []
            for batch in loader:
                batches.append(self._to_device(batch))
                if len(batches) == accum:
                    break
            if len(batches) < accum:
                raise ParamsError(f"params: {mode}_input: the loader yielded no full step to trace")
            self.model.train(mode == "train")
            step_fn(batches if mode == "train" else batches[0])
            summary = step_fn.compiled_step.last_summary
            logger.info("%s passed: %s", what, summary.format())
            return {"summary": summary.format(), "graph": summary}
