"""A run's options, resolved once: each is checked in one place when the run is resolved (device and
mode known, before the model is built or model_dir written) and then carried as one frozen, typed
:class:`RunOptions` (docs/architecture.md#run-options). Later code reads the value, never the
runconfig again: nothing is re-checked, re-spelled or renamed on the way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Union

from cs_run.errors import ParamsError
from cs_run.parallel import DATA_PARALLEL, Layout, resolve_layout
from cs_run.params import CompileTier, Params
from cs_run.schedule import StepOptions

__all__ = ["MODES", "TRAINING_MODES", "RunOptions"]

MODES = ("train", "eval", "train_and_eval", "eval_all")
TRAINING_MODES = ("train", "train_and_eval")
"""The modes that write model_dir/params_resolved.yaml when training starts (an eval never replaces it)."""
_STEP_KEYS = ("num_steps", "max_steps", "num_epochs", "steps_per_epoch")


@dataclass(frozen=True)
class RunOptions:
    """What a run was asked to do, checked. Built by :meth:`resolve`; :meth:`for_mode` adds a mode."""

    device: str
    """``CPU``, ``GPU`` or ``CSX``."""
    mode: Optional[str]
    """One of :data:`MODES`; None until the run is given one (a runner created without a mode)."""
    trace_only: bool
    """runconfig.compile_only or validate_only: the CSX runner traces a step and runs nothing."""
    compile_tier: Optional[CompileTier]
    """runconfig.compile_tier (None: the engine's default)."""
    checkpoint_path: Optional[Path]
    """The start checkpoint the user named (runconfig.checkpoint_path, ``--resume PATH``, the Trainer's
    ``ckpt_path``); None: the newest in model_dir when autoload_checkpoint, else none."""
    autoload_checkpoint: bool
    load_states: Optional[frozenset[str]]
    """runconfig.load_checkpoint_states as state names; None for all of them."""
    layout: Layout = DATA_PARALLEL
    """runconfig.sharding and offload, checked against the device and num_csx (the strategy is built from it)."""
    log_steps: int = 100
    """runconfig.log_steps: log loss and rate every this many run steps (and the last)."""
    checkpoint_steps: int = 0
    """runconfig.checkpoint_steps: checkpoint every this many run steps (0: the last only)."""
    save_initial_checkpoint: bool = False
    max_checkpoints: Optional[int] = None
    """runconfig.max_checkpoints: keep only the newest this many checkpoints (None: all)."""
    eval_steps: Optional[int] = None
    """runconfig.eval_steps: batches an evaluation takes (None: the whole eval loader)."""
    eval_frequency: Union[int, float, None] = None
    """runconfig.eval_frequency: train_and_eval evaluates every this many steps (a fraction: of the run)."""
    steps: Optional[StepOptions] = None
    """A training mode's step options, with the user's spelling of each key; None for the others."""

    @property
    def training(self) -> bool:
        return self.mode in TRAINING_MODES

    @property
    def loads_step(self) -> bool:
        """Whether a start checkpoint's global step is loaded (runconfig.load_checkpoint_states)."""
        return self.load_states is None or "global_step" in self.load_states

    @classmethod
    def resolve(cls, params: Params, device: str) -> "RunOptions":
        """The run's options from the params (file, ``--set`` and flags, already merged and checked key by
        key at load) for ``device``, refused when they ask for a trace on a device that cannot or a sharding
        or offload it or ``num_csx`` cannot run; :meth:`for_mode` adds the mode's checks. Nothing is read,
        created or written.

        Raises:
            ParamsError: naming the key or flag, what is wrong and how to fix it.
        """
        rc = params.runconfig
        trace_only = bool(rc.compile_only or rc.validate_only)
        if device != "CSX" and trace_only:
            raise ParamsError("params: runconfig.compile_only / validate_only need --device CSX "
                              "(cs-run compile-only / validate-only set it)")
        tier, path, states = rc.compile_tier, rc.checkpoint_path, rc.load_checkpoint_states
        if isinstance(states, str):
            states = None if states.strip().lower() == "all" else states.split(",")
        return cls(device=device, mode=None, trace_only=trace_only,
                   compile_tier=None if tier is None else CompileTier(tier),  # checked at load: a params key
                   checkpoint_path=Path(path) if path else None, autoload_checkpoint=rc.autoload_checkpoint,
                   load_states=None if states is None else frozenset(s.strip() for s in states),
                   layout=resolve_layout(rc.sharding, rc.offload, rc.num_csx, device),
                   log_steps=rc.log_steps, checkpoint_steps=rc.checkpoint_steps,
                   save_initial_checkpoint=rc.save_initial_checkpoint, max_checkpoints=rc.max_checkpoints,
                   eval_steps=rc.eval_steps, eval_frequency=rc.eval_frequency)

    def for_mode(self, mode: str, params: Params, data_fns: Optional[dict[str, Optional[Callable]]] = None
                 ) -> "RunOptions":
        """These options for ``mode``: refused when the mode needs a section the params lack (a data
        function passed in stands for its input section), or, when it trains, step options that say
        not how long to run or an early-stopping metric without evaluations during training."""
        if mode not in MODES:
            raise ParamsError(f"--mode: {mode!r} is not one of {', '.join(MODES)}")
        data_fns = data_fns or {}
        needs = {"train": ("train_input", "optimizer"), "eval": ("eval_input",), "eval_all": ("eval_input",),
                 "train_and_eval": ("train_input", "optimizer", "eval_input")}[mode]
        present = {"train_input": params.train_input is not None or data_fns.get("train") is not None,
                   "eval_input": params.eval_input is not None or data_fns.get("eval") is not None,
                   "optimizer": params.optimizer is not None}
        missing = [name for name in needs if not present[name]]
        if missing:
            raise ParamsError(f"params: mode {mode} needs section(s) {', '.join(missing)}, which the params lack"
                              f"{params.where()}")
        rc, steps = params.runconfig, None
        if mode in TRAINING_MODES:  # how long to train: known before any work, not after model_dir is opened
            names = {k: params.name(f"runconfig.{k}") for k in _STEP_KEYS}  # as the user spelled them
            steps = StepOptions(**{k: getattr(rc, k) for k in _STEP_KEYS},
                                grad_accum_steps=params.optimizer.grad_accum_steps, where=params.head,
                                names={**names, "grad_accum_steps": params.name("optimizer.grad_accum_steps")},
                                training=True)
        if mode in TRAINING_MODES and rc.early_stopping_metric is not None and \
                not (mode == "train_and_eval" and self.eval_frequency):
            raise ParamsError(f"{params.head}{params.name('runconfig.early_stopping_metric')} needs evaluations "
                              "during training, which only train_and_eval runs (cs-run train-and-eval, a Trainer.fit "
                              f"with a val_dataloader), every {params.name('runconfig.eval_frequency')} steps: use "
                              "that mode and set the key" + params.where("runconfig"))
        return replace(self, mode=mode, steps=steps)
