"""A run's checkpoints in one object: which one it starts from, whether it fits, loading, saving, pruning.

The runner's loop asks; this answers (Lightning's checkpoint connector, torchtitan's checkpointer). It
resolves the start checkpoint once (``start``, one broadcast among replicas), knows whether the user named
it (``explicit``), and reads and writes a checkpoint in one place each (:meth:`_read`, :meth:`_write`), so
how a checkpoint is stored (one file, or each replica its shard) changes there and nowhere else. The file
format is :mod:`cs_run.checkpoint`'s; the names and listing of model_dir's checkpoints are
:mod:`cs_run.runners._checkpoint_files`'.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from cs_run import distributed
from cs_run.checkpoint import check_target
from cs_run.checkpoint import info as checkpoint_info
from cs_run.checkpoint.atomic import resolve
from cs_run.checkpoint.h5 import TargetMismatchError
from cs_run.errors import CheckpointError, ParamsError, TrainingError
from cs_run.lora_params import LORA_SUFFIXES
from cs_run.runners import _checkpoint_files, _decoder_start, _hf_start, _optimizer_layout
from cs_run.runners._rng import capture_rng_state, restore_rng_state
from cs_run.utils.streaming import RestartableDataLoader, StreamingLoader, load_state, replica_state

if TYPE_CHECKING:
    from cs_run.runners.base import PyTorchBaseRunner

__all__ = ["Checkpointer"]

logger = logging.getLogger("cs_run.runners")


class Checkpointer:
    """The checkpoints of ``runner``'s run. It reads the runner's parts (model, optimizer, schedule, scaler,
    early stopping, progress, train loader) when it saves or loads, so a part a hook replaces is the one saved.

    Attributes:
        start: the checkpoint the run starts from, resolved once by :meth:`resolve_start` (None: fresh).
        saved: ``(global step, path)`` of the newest checkpoint this run saved.
        epoch_start_rng: the RNG state the train loop recorded when the current epoch's iterator was made.
        pending_resume: the loaded checkpoint's data position and RNG, until the train loop has used them.
    """

    def __init__(self, runner: "PyTorchBaseRunner") -> None:
        self._runner = runner
        self.start: Optional[Path] = None
        self.saved: tuple[int, Optional[Path]] = (-1, None)
        self.epoch_start_rng: Optional[dict] = None
        self.pending_resume: Optional[dict] = None
        self._in_memory: Optional[tuple[Path, dict[str, Any]]] = None  # a Hugging Face start, converted
        self._fresh_adapters_logged = False
        self._stored_model_keys: dict[Path, Optional[set[str]]] = {}  # a LoRA start's checkpoint headers, read once

    @property
    def explicit(self) -> bool:
        """Whether the user named the start checkpoint (runconfig.checkpoint_path, ``--resume PATH``)."""
        return self._runner.options.checkpoint_path is not None

    # ------------------------------------------------------------------------------ the start checkpoint

    def resolve_start(self) -> Optional[Path]:
        """The checkpoint the run starts from: the one the user named, else (autoload) the newest in
        model_dir; kept as :attr:`start`."""
        runner = self._runner
        path = runner.options.checkpoint_path
        if path is not None:
            if not os.path.exists(resolve(path)):  # a file, or a sharded run's folder (or its aside)
                raise ParamsError(f"params: runconfig.checkpoint_path: no such file {path}")
            self.start = path
            return path
        latest = _checkpoint_files.latest_checkpoint(runner.model_dir) if runner.options.autoload_checkpoint else None
        self.start = runner.strategy.broadcast_object(latest)  # every replica resumes from ordinal 0's choice
        return self.start

    def _target(self, training: bool, held: Optional[set[str]] = None, path: Optional[Path] = None) -> dict[str, Any]:
        """The live tensors a start checkpoint goes into: the model's, and the optimizer's to train
        (read in place; with a sharded strategy through :meth:`Strategy.load_target`). ``held``: the model
        keys of the checkpoint, when LoRA adapters it lacks altogether start from their initialisation.
        ``path``: the checkpoint, whose optimizer state may be an earlier cs-run's one group
        (:mod:`_optimizer_layout`)."""
        runner = self._runner
        target = {"model": self._without_fresh_adapters(runner.model.state_dict(), held)}
        if training and runner.optimizer is not None:
            one_group = path is not None and self._one_group(path)
            target["optimizer"] = (_optimizer_layout.one_group_form(runner.optimizer, runner.model) if one_group
                                   else runner.optimizer.state_dict())  # state tensors are read in place
        return target

    def _one_group(self, path: Path) -> bool:
        try:
            keys = [k["key"] for k in checkpoint_info(str(path))["keys"]]
        except CheckpointError:
            return False  # the load reports it
        return _optimizer_layout.is_one_group(_optimizer_layout.stored_groups(keys), self._runner.optimizer,
                                              self._runner.model)

    def _without_fresh_adapters(self, model: dict[str, Any], held: Optional[set[str]]) -> dict[str, Any]:
        """A LoRA run starting from its base model's weights (a checkpoint with no ``lora_A``/``lora_B`` at
        all) reads the base weights; its adapters keep their initialisation (B = 0: the model starts as the
        checkpoint's). A checkpoint with some adapters must hold them all (the fit check names the rest)."""
        if not self._adapters_fresh(held):
            return model
        adapters = [k for k in model if k.endswith(LORA_SUFFIXES)]
        if not self._fresh_adapters_logged:
            self._fresh_adapters_logged = True
            logger.info("LoRA: the start checkpoint holds no adapters, so this run fine-tunes its weights: they load, "
                        "the %d adapter tensors start from their initialisation (lora_B = 0: the model starts as the "
                        "checkpoint's), and unless runconfig.load_checkpoint_states says otherwise nothing else loads",
                        len(adapters))
        return {k: v for k, v in model.items() if k not in adapters}

    def _adapters_fresh(self, held: Optional[set[str]]) -> bool:
        """The model has LoRA adapters and the start checkpoint (its model keys ``held``) has none of them."""
        adapters = [k for k in self._runner.model.state_dict() if k.endswith(LORA_SUFFIXES)]
        return held is not None and bool(adapters) and not any(k in held for k in adapters)

    def _wanted_states(self, path: Path) -> Optional[frozenset[str]]:
        """runconfig.load_checkpoint_states; when unset, a LoRA fine-tune's start from a checkpoint without
        adapters reads the weights only (its optimizer state is of another parameter list)."""
        wanted = self._runner.options.load_states
        if wanted is None and self._adapters_fresh(self._model_keys(path)):
            return frozenset({"model"})
        return wanted

    def _model_keys(self, path: Path) -> Optional[set[str]]:
        """The start checkpoint's model keys when the model has LoRA adapters (the only reader of them), else
        None; a Hugging Face folder's are its converted state's, a damaged file's None (the read reports it)."""
        if not any(k.endswith(LORA_SUFFIXES) for k in self._runner.model.state_dict()):
            return None
        if self._in_memory is not None and path == self._in_memory[0]:
            return set(self._in_memory[1]["model"])
        if path not in self._stored_model_keys:  # the fit check, the start's states and its load each ask
            try:
                self._stored_model_keys[path] = _checkpoint_files.stored_model_keys(path)
            except CheckpointError:
                self._stored_model_keys[path] = None
        return self._stored_model_keys[path]

    def _candidates(self, path: Path, training: bool) -> list[Path]:
        """The checkpoints a start from ``path`` tries, in order: autoload (training) falls back past
        damaged or truncated checkpoints, newest first; an explicit one, or an eval's, is final."""
        if self.explicit or not training:
            return [path]
        return [path, *(p for _, p in reversed(_checkpoint_files.list_checkpoints(self._runner.model_dir)) if p != path)]

    def check_start_fits(self, path: Optional[Path], training: bool) -> Optional[Path]:
        """The checkpoint the run starts from (``path`` or, autoloading, an older fallback), checked against
        the model (keys, dtypes, shapes; no tensor data read) before model_dir is written; None when it
        starts fresh. Only what the load will read is checked: the states runconfig.load_checkpoint_states
        names, of those the checkpoint holds (a model-only checkpoint starts the optimizer fresh). A damaged
        autoload candidate is left to the load, which skips it with a warning."""
        if path is None:
            return None
        runner = self._runner
        if _hf_start.is_hf_folder(path):  # named by the user: no fallbacks
            self._in_memory = None
            state = _hf_start.hf_start_state(runner, _checkpoint_files.given_as(runner.params), path)
            _check_same_tensors(path, state["model"], self._target(False, set(state["model"]))["model"])
            self._in_memory = (path, state)
            return path
        if self._decoder_start(path):  # a DPO run from a fine-tuned decoder: the policy and the reference
            self._in_memory = (path, _decoder_start.decoder_start_state(runner, _checkpoint_files.given_as(runner.params),
                                                                        path))
            return path
        for candidate in self._candidates(path, training):
            try:
                target = self._loaded_part(self._target(training, self._model_keys(candidate), candidate), candidate,
                                           training)
                check_target(candidate, runner.strategy.load_target(target, torch.device("meta")))
                return candidate
            except TargetMismatchError as e:
                raise _checkpoint_files.not_this_models(runner.params, e, autoloaded=not self.explicit,
                                                   training=training) from None
            except CheckpointError:
                if self.explicit or not training:
                    raise
        return None

    def stored_step(self, path: Path) -> int:
        """The global step the run starts from ``path`` at: 0 for a model-only start converted in memory (a
        Hugging Face folder, a DPO run's decoder checkpoint), else the step the checkpoint was saved at."""
        if self._in_memory is not None and path == self._in_memory[0]:
            return 0
        return _checkpoint_files.stored_step(path)

    def _decoder_start(self, path: Path) -> bool:
        """``path`` is a plain decoder's checkpoint and the run's model a DPO model (see _decoder_start)."""
        try:
            stored = _checkpoint_files.stored_model_keys(path)
        except CheckpointError:
            return False  # the fit check below reports it
        return _decoder_start.is_decoder_start(self._runner, stored)

    def _loaded_part(self, target: dict[str, Any], path: Path, training: bool) -> dict[str, Any]:
        """The part of ``target`` a load of ``path`` reads: with runconfig.load_checkpoint_states, the states
        it names (one the checkpoint lacks is an error naming the key, before anything is written);
        otherwise every state of the target the checkpoint holds, the model's always (so a checkpoint of
        another model is still refused by its first key). An evaluation reads the model only."""
        wanted = self._wanted_states(path)
        if not training:
            return target
        if self._in_memory is not None and path == self._in_memory[0]:  # a model-only start, converted
            return {"model": target["model"]}
        held = _checkpoint_files.stored_states(path)
        if wanted is not None:
            self._check_wanted(wanted, held, path)
            return {k: v for k, v in target.items() if k in wanted}
        return {k: v for k, v in target.items() if k == "model" or k in held}

    def _check_wanted(self, wanted: frozenset[str], held: set[str], path: Path) -> None:
        """The Model Zoo's LoadCheckpointStates: a state name the checkpoint does not hold is an error."""
        unknown = sorted(wanted - held)
        if unknown:
            params = self._runner.params
            raise ParamsError(f"params: runconfig.load_checkpoint_states: {', '.join(unknown)} not in {path.name}, "
                              f"which holds {', '.join(sorted(held))}{params.where('runconfig.load_checkpoint_states')}")

    def check_all_fit(self) -> None:
        """eval_all: every checkpoint in model_dir fits the model (keys, dtypes, shapes; no tensor data
        read), oldest first; a damaged one is left to the evaluation, which logs and skips it."""
        runner = self._runner
        target = runner.strategy.load_target(self._target(training=False), torch.device("meta"))
        for _, path in _checkpoint_files.list_checkpoints(runner.model_dir):
            try:
                check_target(path, target)
            except TargetMismatchError as e:
                raise _checkpoint_files.not_this_models(runner.params, e, autoloaded=True, every=path) from None
            except CheckpointError:
                continue

    # ------------------------------------------------------------------------------------------ loading

    def _read(self, path: Path, live: dict[str, Any]) -> dict[str, Any]:
        """The one read of a checkpoint: ``live``'s tensors are read in place, the rest returned."""
        if self._in_memory is not None and path == self._in_memory[0]:  # a Hugging Face folder, converted
            model = self._in_memory[1]["model"]
            with torch.no_grad():
                for key, tensor in live["model"].items():
                    tensor.copy_(model[key])
            return {"model": live["model"]}
        return self._runner.strategy.read_checkpoint(path, live)  # sharded: each replica its rows

    def load(self, path: Optional[Path], training: bool = True) -> None:
        """Load ``path`` into the run. Training resumes from it: weights, optimizer, schedule, scaler, step,
        RNG and data position (an autoloaded one that cannot be read falls back to an older one); an
        evaluation takes its weights and global step only."""
        if path is None:
            return
        runner = self._runner
        if not training:
            state = self._read(path, self._target(training=False, held=self._model_keys(path)))
            runner.progress.global_step = int(state.get("global_step", 0))
            logger.info("Loaded weights of %s (global step %d)", path, runner.global_step)
            return
        for candidate in self._candidates(path, training=True):
            try:
                state = self._read(candidate, self._loaded_part(self._target(True, self._model_keys(candidate), candidate),
                                                                candidate, True))
                path = candidate
                break
            except TargetMismatchError as e:  # an older fallback of another model (run() checked the newest)
                raise _checkpoint_files.not_this_models(runner.params, e, autoloaded=not self.explicit) from None
            except CheckpointError as e:
                if self.explicit:
                    raise
                logger.warning("Skipping checkpoint %s: %s", candidate, e)
        else:
            raise CheckpointError(f"no checkpoint in {runner.model_dir} can be read (see the warnings above); use "
                                  "another --model_dir or --set runconfig.autoload_checkpoint=false to start fresh")
        wanted = self._wanted_states(path)
        if wanted is not None:
            state = self._keep_states(state, wanted, path)
        self._restore(state)
        self._log_fresh_states(state)
        if set(state) == {"model"}:
            logger.info("Starting from the weights of %s at global step 0 (no training state loaded)", path)
        else:
            logger.info("Resuming from checkpoint %s at global step %d", path, runner.global_step)

    def _restore(self, state: dict[str, Any]) -> None:
        """The loaded state's step, optimizer, schedule, scaler and early stopping into the run; its data
        position and RNG wait in :attr:`pending_resume` for the train loop (or the RNG is restored now)."""
        runner = self._runner
        runner.progress.global_step = int(state.get("global_step", 0))
        saved = state.get("optimizer")
        if saved is not None and _optimizer_layout.is_one_group(len(saved["param_groups"]), runner.optimizer,
                                                                runner.model):
            logger.info("The checkpoint's optimizer state is one param group (cs-run before its optimizers were "
                        "grouped as the Model Zoo's); each parameter's state goes to its group")
            state = {**state, "optimizer": _optimizer_layout.regrouped(saved, runner.optimizer, runner.model)}
        for key, part in (("optimizer", runner.optimizer), ("lr_scheduler", runner.lr_scheduler),
                          ("grad_scaler", runner.grad_scaler), ("sparsity", runner.sparsity)):
            if part is not None and key in state:
                part.load_state_dict(state[key])
        if runner._early_stopping is not None and "early_stopping" in state:
            runner._early_stopping.load_state_dict(state["early_stopping"])
        data = state.get("dataloader")
        if data is not None:
            runner.progress.epoch, runner.progress.epoch_step = int(data["epoch"]), int(data["epoch_step"])
            self.pending_resume = {"epoch_start_rng": data["epoch_start_rng"], "rng": state["rng"],
                                   **{k: data.get(k) for k in ("num_csx", "num_workers_per_csx", "workers")}}
        elif "rng" in state:
            restore_rng_state(state["rng"])

    def _keep_states(self, state: dict[str, Any], wanted: frozenset[str], path: Path) -> dict[str, Any]:
        """The Model Zoo's LoadCheckpointStates: only ``wanted`` states of the checkpoint; the rest start
        fresh. A name the checkpoint does not hold is an error naming the key."""
        self._check_wanted(wanted, set(state), path)
        dropped = sorted(set(state) - wanted)
        if dropped:
            logger.info("Not loading %s of %s (runconfig.load_checkpoint_states: %s)", ", ".join(dropped), path.name,
                        ", ".join(sorted(wanted)))
        return {k: v for k, v in state.items() if k in wanted}

    def _log_fresh_states(self, state: dict[str, Any]) -> None:
        """Each part of the run that the loaded state has nothing for starts as built, logged in the Model
        Zoo trainer's words (its optimizer, scheduler, precision and dataloader callbacks)."""
        runner = self._runner
        for key, part, line in (
                ("optimizer", runner.optimizer, "optimizer state not found in the checkpoint. Using default "
                                                "preinitialized state."),
                ("lr_scheduler", runner.lr_scheduler, "Scheduler state not found in the checkpoint. Using default "
                                                      "initialized state."),
                ("grad_scaler", runner.grad_scaler, "Gradient scaler state not found in the checkpoint. Using "
                                                    "default initialized state."),
                ("dataloader", runner._train_loader, "Dataloader state not found in the checkpoint. DataLoaders "
                                                     "will yield samples from the beginning.")):
            if part is not None and key not in state:
                logger.info(line)

    def restore_data_position(self, loader: Any) -> None:
        """Put the train loader where the checkpoint's data position says (see
        docs/architecture.md#streaming-workers): a restartable loader loads the saved workers' state
        (deaggregated for each worker, whatever the topology; nothing is replayed); otherwise the epoch's
        done batches are replayed, which is exact in the topology that wrote the checkpoint and keeps the
        step count (not the samples) in another."""
        resume = self.pending_resume
        if resume is None:
            return
        saved = {k: resume.get(k) for k in _data_topology()}
        if resume.get("workers") is not None and isinstance(loader, StreamingLoader) and loader.is_restartable:
            loader.load_state_dict(resume["workers"])
            resume["positioned"] = True
        elif resume.get("workers") is not None and isinstance(loader, RestartableDataLoader):
            load_state(loader, resume["workers"])
            resume["positioned"] = True
        elif saved != _data_topology() and all(v is not None for v in saved.values()):
            logger.warning("The checkpoint's data position was written with num_csx=%s x num_workers_per_csx=%s "
                           "input streams and this run has %s x %s: it resumes at the same step by replaying the "
                           "epoch's done batches with the new streams, which is exact only if the data function's "
                           "global order does not depend on the number of streams (a restartable dataloader records "
                           "its position exactly)", saved["num_csx"], saved["num_workers_per_csx"],
                           *_data_topology().values())

    # ------------------------------------------------------------------------------------------- saving

    def state(self) -> dict[str, Any]:
        """Everything an exact resume needs (weights, optimizer, schedule, scaler, RNG, data position)."""
        runner = self._runner
        progress = runner.progress
        state: dict[str, Any] = {"model": runner.model.state_dict(), "global_step": runner.global_step}
        if runner.optimizer is not None:
            state["optimizer"] = runner.optimizer.state_dict()
        state = runner.strategy.checkpoint_form(state)  # one-file: gathered whole (a collective); or each replica's shards
        if runner.lr_scheduler is not None:
            state["lr_scheduler"] = runner.lr_scheduler.state_dict()
        if runner.grad_scaler is not None:
            state["grad_scaler"] = runner.grad_scaler.state_dict()
        if runner.sparsity is not None:
            state["sparsity"] = runner.sparsity.state_dict()
        if runner._early_stopping is not None:
            state["early_stopping"] = runner._early_stopping.state_dict()
        loader = runner._train_loader
        state["rng"] = capture_rng_state(getattr(loader, "generator", None))
        if self.epoch_start_rng is not None:
            state["dataloader"] = {"epoch": progress.epoch, "epoch_step": progress.epoch_step,
                                   "epoch_start_rng": self.epoch_start_rng, **_data_topology()}
            if isinstance(loader, StreamingLoader) and loader.is_restartable:
                state["dataloader"]["workers"] = loader.state_dict()  # a collective with several replicas
            elif isinstance(loader, RestartableDataLoader):  # the replica streams itself (one worker)
                steps = progress.run_step
                state["dataloader"]["workers"] = replica_state(
                    loader, steps, steps * runner.params.optimizer.grad_accum_steps, progress.samples_streamed)
        return state

    def _write(self, state: dict[str, Any], path: Path) -> None:
        """The one write of a checkpoint: ordinal 0 the one file (the replicas' gathered states are equal), or
        each replica its shard into one folder (a sharded strategy)."""
        self._runner.strategy.save_checkpoint(state, path)

    def save(self) -> Path:
        """A checkpoint of the current step (refused when the weights are not finite), the old ones pruned
        to runconfig.max_checkpoints, and the runner's ``on_checkpoint_saved`` hook called."""
        runner = self._runner
        step = runner.global_step
        path = _checkpoint_files.checkpoint_path(runner.model_dir, step)
        state = self.state()
        bad = runner.strategy.agree_keys(_checkpoint_files.nonfinite_keys(state))  # one device-side reduction per checkpoint
        if bad:
            good = _checkpoint_files.newest_finite_checkpoint(runner.model_dir)
            kept = f"the newest checkpoint with finite weights is {good}; a rerun resumes from it" if good \
                else "no checkpoint with finite weights exists; a rerun starts fresh"
            more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
            raise TrainingError(f"weights are not finite after step {step} ({bad[0]}{more} hold nan or "
                                f"inf); training stopped, nothing was saved for this step and {kept}. Lower the "
                                "learning rate, enable gradient clipping (optimizer.max_gradient_norm) or check "
                                "the data")
        self.saved = (step, path)
        self._write(state, path)
        if runner.strategy.writes:
            logger.info("Saved checkpoint %s", path)
            _checkpoint_files.prune_checkpoints(runner.model_dir, runner.options.max_checkpoints)
            runner.on_checkpoint_saved(str(path), step)
        return path


def _check_same_tensors(path: Path, loaded: dict[str, Any], live: dict[str, Any]) -> None:
    """The converted weights of ``path`` are the model's tensors, name for name and shape for shape."""
    mismatch = _decoder_start.tensor_mismatch(loaded, live)
    if mismatch is not None:
        key, got, want = mismatch
        raise CheckpointError(f"Hugging Face folder {path}: {key}: gives {got}, the model {want}; convert it with "
                              f"{_hf_start.convert_command(path)} and use its params")


def _data_topology() -> dict[str, int]:
    """The input streams of this run: replicas x input workers per replica."""
    return {"num_csx": distributed.get_world_size(), "num_workers_per_csx": distributed.num_workers_per_csx()}
