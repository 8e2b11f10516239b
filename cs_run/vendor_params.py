"""The Model Zoo's own params vocabulary, release by release: which vendor keys exist and what each means here.

A vendor params file (R_1.6.0 ... Release_2.10.0, the flat sections, the 1.9/2.0 ``csconfig`` section and
the 2.5+ ``trainer: {init, fit}`` form) is brought into cs-run's five sections before validation:

* ``native``: the key is cs-run's own key of the same name (validated as usual);
* ``mapped``: renamed to the cs-run key with the same meaning (``autoload_last_checkpoint`` ->
  ``autoload_checkpoint``, ``num_wgt_servers`` -> ``max_wgt_servers``, ...);
* ``recorded``: the key configures only the vendor's appliance (or a vendor feature with no counterpart
  here); its value is type-checked against the vendor's schema, kept in :data:`RECORDED`, noted in the
  log of each run of the params that set it, and has no effect.

Any other key stays an error with the did-you-mean. The tables below were written from the vendor's
runconfig schemas (``common/pytorch/schema/runconfig_schema.yaml``, Release_1.8 ... 2.10), the
fc_mnist params files of every release and the 2.10 Trainer's legacy-key table.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from cs_run._checks import unknown_key_message
from cs_run._logging import defer
from cs_run.errors import ParamsError

__all__ = ["FORMS", "RECORDED", "RUNCONFIG_KEYS", "INPUT_KEYS", "MODEL_KEYS", "OPTIMIZER_KEYS", "CSCONFIG_KEYS",
           "TRAINER_KEYS", "BUNDLED_DATA", "detect_form", "from_trainer_form", "moved_lines", "normalize"]

logger = logging.getLogger(__name__)

BUNDLED_DATA = "bundled:digits"
"""``data_dir`` value that asks for the bundled scikit-learn digits explicitly (never a silent fallback)."""

FORMS = {
    "1.6": ("R_1.6.0", "R_1.6.1"),
    "1.7": ("R_1.7.0", "R_1.7.1"),
    "1.8": ("Release_1.8.0",),
    "1.9/2.0 csconfig": ("Release_1.9.1", "Release_2.0.2", "Release_2.0.3"),
    "2.1-2.9": ("Release_2.1.0", "Release_2.1.1", "Release_2.2.0", "Release_2.2.1", "Release_2.3.0",
                "Release_2.3.1", "Release_2.7.0", "Release_2.7.1", "Release_2.8.0", "Release_2.9.0",
                "Release_2.10.0"),
    "2.5+ trainer": ("Release_2.5.0", "Release_2.6.0", "Release_2.7.0", "Release_2.8.0", "Release_2.9.0",
                     "Release_2.10.0"),
}
"""Params-file forms and the Model Zoo releases whose fc_mnist ships one (2.4 ships no fc_mnist)."""

_APPLIANCE = "configures the vendor's appliance (cluster, pods, images, memory)"
_DEBUG = "a vendor compiler / appliance debug switch"
_GPU_DIST = "multi-GPU torch.distributed setup of the vendor's GPU runner; cs-run runs one process"
_R1_API = "selects between the vendor's 1.x runner APIs; cs-run has one"

# runconfig: key -> (action, cs-run key or reason, schema types). From the union of the 1.8 ... 2.10 schemas.
RUNCONFIG_KEYS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # native
    **{k: ("native", k, t) for k, t in {
        "checkpoint_path": ("string", "null"), "checkpoint_steps": ("integer", "null"),
        "compile_dir": ("string", "null"), "compile_only": ("boolean", "null"), "eval_frequency": ("integer", "null"),
        "eval_steps": ("integer", "null"), "job_labels": ("array", "null"), "log_steps": ("integer",),
        "logging": ("string", "null"), "max_checkpoints": ("integer", "null"), "max_steps": ("integer", "null"),
        "model_dir": ("string",), "mount_dirs": ("array", "null"), "num_csx": ("integer",),
        "num_epochs": ("integer", "null"), "num_steps": ("integer", "null"), "num_workers_per_csx": ("integer",),
        "python_paths": ("array", "null"), "save_initial_checkpoint": ("boolean",), "seed": ("integer", "null"),
        "steps_per_epoch": ("integer", "null"), "transfer_processes": ("integer", "null"),
        "validate_only": ("boolean", "null"), "load_checkpoint_states": ("string", "array", "null")}.items()},
    # mapped
    "autoload_last_checkpoint": ("mapped", "autoload_checkpoint", ("boolean", "null")),
    "keep_checkpoint_max": ("mapped", "max_checkpoints", ("integer", "null")),
    "num_wgt_servers": ("mapped", "max_wgt_servers", ("integer", "null")),
    "num_act_servers": ("mapped", "max_act_per_csx", ("integer", "null")),
    # recorded: no effect here
    "mode": ("recorded", "the mode comes from --mode (the vendor's CLI writes it here)", ("string",)),
    "target_device": ("recorded", "the device comes from the command line (CPU/GPU/CSX)", ("string",)),
    "save_losses": ("recorded", "losses are always written to model_dir's summaries", ("boolean",)),
    "show_debug_metrics": ("recorded", "vendor appliance debug metrics", ("boolean",)),
    "experimental_api": ("recorded", _R1_API, ("boolean", "null")),
    "use_cstorch_optimizer_step": ("recorded", _R1_API, ("boolean", "null")),
    "execution_strategy": ("recorded", "pipelined vs weight streaming: the CSX engine has one strategy", ("string", "null")),
    "enable_summaries": ("recorded", "summaries are always written", ("boolean",)),
    "save_summary_steps": ("recorded", "summaries are written every log_steps", ("integer", "null")),
    "summary_dir": ("recorded", "summaries go to model_dir/train and model_dir/eval", ("string", "null")),
    "legacy_event_dirs": ("recorded", "summaries go to model_dir/train and model_dir/eval", ("boolean",)),
    "is_pretrained_checkpoint": ("recorded", "checkpoints load with their optimizer state when present", ("boolean",)),
    "disable_strict_checkpoint_loading": ("recorded", "checkpoint loading is always strict", ("boolean", "null")),
    "precision_opt_level": ("recorded", "vendor compiler precision level", ("integer", "null")),
    "check_loss_values": ("recorded", "NaN/inf losses always stop the run", ("boolean",)),
    "log_initialization": ("recorded", _DEBUG, ("boolean", "null")),
    "log_input_summaries": ("recorded", _DEBUG, ("boolean", "null")),
    "lazy_initialization": ("recorded", _DEBUG, ("boolean",)),
    "retrace_every_iteration": ("recorded", _DEBUG, ("boolean", "null")),
    "drop_data": ("recorded", _DEBUG, ("boolean", "null")),
    "dump_activations": ("recorded", _DEBUG, ("boolean",)),
    "skip_train_recv_activations": ("recorded", _DEBUG, ("boolean", "null")),
    "enable_act_frequency": ("recorded", _DEBUG, ("boolean",)),
    "debug_args": ("recorded", _DEBUG, ("object", "null")),
    "debug_args_path": ("recorded", _DEBUG, ("string", "null")),
    "ini": ("recorded", _DEBUG, ("object", "null")),
    "experimental": ("recorded", _DEBUG, ("object",)),
    "op_profiler_config": ("recorded", _DEBUG, ("object", "null")),
    "wsc_log_level": ("recorded", _DEBUG, ("object", "null")),
    "fabric_type_blacklist": ("recorded", _DEBUG, ("array", "null")),
    "autogen_policy": ("recorded", _DEBUG, ("string", "null")),
    "use_cs_grad_accum": ("recorded", "gradient accumulation follows optimizer.grad_accum_steps", ("boolean", "null")),
    "use_appliance_data": ("recorded", _APPLIANCE, ("boolean", "null")),
    "multireplica": ("recorded", _APPLIANCE, ("boolean", "null")),
    "num_replicas": ("recorded", _APPLIANCE, ("integer",)),
    "service_dir": ("recorded", _APPLIANCE, ("string",)),
    "save_stream_size": ("recorded", _APPLIANCE, ("integer",)),
    "variant": ("recorded", _APPLIANCE, ("string", "null")),
    "cbcore_image": ("recorded", _APPLIANCE, ("string", "null")),
    "credentials_path": ("recorded", _APPLIANCE, ("string", "null")),
    "mgmt_address": ("recorded", _APPLIANCE, ("string", "null")),
    "mgmt_namespace": ("recorded", _APPLIANCE, ("string", "null")),
    "job_priority": ("recorded", _APPLIANCE, ("string", "null")),
    "job_time_sec": ("recorded", _APPLIANCE, ("integer", "null")),
    "disable_version_check": ("recorded", _APPLIANCE, ("boolean", "null")),
    "hf_cache_dir": ("recorded", "nothing is downloaded at run time", ("string", "null")),
    # R_1.7's GPT-3 files carry these TF Estimator keys; the vendor's PyTorch runner reads neither
    "log_step_count_steps": ("recorded", "a TF Estimator key the Model Zoo's PyTorch runner never read; the "
                             "logging interval is log_steps", ("integer", "null")),
    "save_checkpoint_steps": ("recorded", "a TF Estimator key the Model Zoo's PyTorch runner never read; the "
                              "checkpoint interval is checkpoint_steps", ("integer", "null")),
    **{k: ("recorded", _APPLIANCE, ("integer", "null")) for k in (
        "compile_crd_memory_gi", "execute_crd_memory_gi", "wrk_memory_gi", "act_memory_gi", "cmd_memory_gi",
        "wgt_memory_gi", "chf_memory_gi")},
    **{k: ("recorded", _GPU_DIST, t) for k, t in {
        "enable_distributed": ("boolean",), "dist_addr": ("string",), "dist_backend": ("string",),
        "init_method": ("string",), "main_process_id": ("integer",), "sync_batchnorm": ("boolean",)}.items()},
}

# train_input / eval_input keys of the vendor's fc_mnist files that are not cs-run's own InputParams keys.
INPUT_KEYS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "to_float16": ("native", "to_float16", ("boolean",)),
    "data_processor": ("recorded", "the vendor's data class; the model's data function (or data_fn) builds the "
                       "loader here", ("string",)),
    "split": ("recorded", "the section decides the split (train_input: train, eval_input: eval)", ("string",)),
    "micro_batch_size": ("recorded", "vendor CSX micro-batching; use optimizer.grad_accum_steps",
                         ("integer", "string", "object", "null")),
    "mixed_precision": ("recorded", "an input's copy (R_1.7-1.9 GPT-3 files) the vendor's data processors never "
                        "read; the precision is model.mixed_precision", ("boolean", "null")),
}
# model keys of the vendor files that are not cs-run ModelParams fields (passed to the model function).
MODEL_KEYS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "to_float16": ("native", "to_float16", ("boolean",)),
}
# optimizer keys of the vendor files that configure only the vendor: see cs_run.optim.factory.RECORDED_KEYS.
OPTIMIZER_KEYS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "disable_lr_steps_reset": ("recorded", "R_1.x appliance LR-step bookkeeping", ("boolean",)),
    "ws_summary": ("recorded", "weight-streaming appliance summaries", ("boolean",)),
    "use_bias_correction": ("recorded", "in the Model Zoo GPT-2 files but read by no Model Zoo code (AdamW's bias "
                            "correction is correct_bias, on by default)", ("boolean",)),
}
# csconfig (Release_1.9 / 2.0): read by the 1.9 CS runner only.
CSCONFIG_KEYS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "use_cbfloat16": ("mapped", "model.fp16_type", ("boolean",)),
}

# trainer form (2.5+): trainer.<path> -> flat key path ("" = recorded, reason in TRAINER_RECORDED).
TRAINER_KEYS: dict[str, str] = {
    "init.model_dir": "runconfig.model_dir", "init.seed": "runconfig.seed", "init.device": "runconfig.target_device",
    "init.backend.backend_type": "runconfig.target_device", "init.backend.compile_dir": "runconfig.compile_dir",
    "init.backend.compile_only": "runconfig.compile_only", "init.backend.validate_only": "runconfig.validate_only",
    "init.backend.cluster_config.num_csx": "runconfig.num_csx",
    "init.backend.cluster_config.max_wgt_servers": "runconfig.num_wgt_servers",
    "init.backend.cluster_config.max_act_per_csx": "runconfig.num_act_servers",
    "init.backend.cluster_config.num_workers_per_csx": "runconfig.num_workers_per_csx",
    "init.backend.cluster_config.mount_dirs": "runconfig.mount_dirs",
    "init.backend.cluster_config.python_paths": "runconfig.python_paths",
    "init.backend.cluster_config.job_labels": "runconfig.job_labels",
    **{f"init.backend.cluster_config.{k}": f"runconfig.{k}" for k in (
        "mgmt_address", "mgmt_namespace", "credentials_path", "cbcore_image", "job_priority", "job_time_sec",
        "disable_version_check")},
    **{f"init.backend.{k}": f"runconfig.{k}" for k in (
        "enable_distributed", "main_process_id", "dist_backend", "init_method", "sync_batchnorm")},
    "init.precision.enabled": "model.mixed_precision", "init.precision.fp16_type": "model.fp16_type",
    "init.precision.precision_opt_level": "runconfig.precision_opt_level",
    "init.precision.log_loss_scale": "optimizer.log_summaries",
    **{f"init.precision.{k}": f"optimizer.{k}" for k in (
        "loss_scaling_factor", "initial_loss_scale", "steps_per_increase", "min_loss_scale", "max_loss_scale",
        "max_gradient_norm", "max_gradient_value")},
    **{f"init.loop.{k}": f"runconfig.{k}" for k in (
        "num_steps", "max_steps", "num_epochs", "steps_per_epoch", "eval_frequency", "eval_steps")},
    "init.loop.grad_accum_steps": "optimizer.grad_accum_steps",
    "init.checkpoint.steps": "runconfig.checkpoint_steps",
    "init.checkpoint.autoload_last_checkpoint": "runconfig.autoload_last_checkpoint",
    "init.checkpoint.save_initial_checkpoint": "runconfig.save_initial_checkpoint",
    "init.checkpoint.disable_strict_checkpoint_loading": "runconfig.disable_strict_checkpoint_loading",
    "init.logging.log_steps": "runconfig.log_steps", "init.logging.log_level": "runconfig.logging",
    "init.logging.wsc_log_level": "runconfig.wsc_log_level",
    "init.logging.enable_act_frequency": "runconfig.enable_act_frequency",
    "fit.ckpt_path": "runconfig.checkpoint_path",
}
TRAINER_RECORDED = {
    "init.loggers": "vendor Trainer loggers (summaries go to model_dir)",
    "validate": "the eval dataloader comes from fit.val_dataloader (--mode eval runs it)",
    "validate_all": "the eval dataloader comes from fit.val_dataloader (--mode eval_all runs it)",
    "init.backend.csx.debug": "the vendor CSX backend's compiler / appliance debug flags",
    "init.backend.csx.performance": "the vendor CSX backend's appliance performance flags",
}
CHECKPOINT_NAME = "checkpoint_{step}.mdl"
"""The vendor Checkpoint callback's default ``checkpoint_name``: the only naming cs-run writes and autoloads."""

RECORDED: dict[str, Any] = {}
"""Every vendor key recorded (no effect here) by :func:`normalize` in this process, by key path."""

_JSON_TYPES = {"boolean": (bool,), "integer": (int,), "string": (str,), "array": (list,), "object": (dict,),
               "null": (type(None),), "number": (int, float)}


def detect_form(raw: dict) -> str:
    """Which release form a params dict has (see :data:`FORMS`)."""
    if "trainer" in raw:
        return "2.5+ trainer"
    if "csconfig" in raw:
        return "1.9/2.0 csconfig"
    rc = raw.get("runconfig") or {}
    if isinstance(rc, dict) and "save_losses" in rc:
        return "1.6-1.8"
    return "2.1-2.9"


def _check_type(path: str, value: Any, types: tuple[str, ...], locate) -> None:
    allowed = tuple(t for name in types for t in _JSON_TYPES[name])
    if isinstance(value, bool) and "boolean" not in types:
        ok = False
    else:
        ok = isinstance(value, allowed)
    if not ok:
        raise ParamsError(f"params: {path}: expected {' or '.join(types)} (vendor schema), got "
                          f"{type(value).__name__} {value!r}{locate(path)}")


def _record(path: str, value: Any, reason: str) -> None:
    RECORDED[path] = value
    defer(__name__, f"params: {path} = {value!r} is a Model Zoo key recorded with no effect here ({reason})")


def _apply_table(raw: dict, section: str, table: dict, locate, target_section: str | None = None) -> None:
    node = raw.get(section)
    if not isinstance(node, dict):
        return
    for key in [k for k in node if k in table]:
        action, target, types = table[key]
        path = f"{section}.{key}"
        if action == "native":  # cs-run's own key: its own check applies
            continue
        value = node.pop(key)
        if value is not None:
            _check_type(path, value, types, locate)
        if action == "recorded":
            _record(path, value, target)
        elif target in node and node[target] != value:
            raise ParamsError(f"params: {path} and {section}.{target} are the same setting with different "
                              f"values ({value!r} vs {node[target]!r}); keep one{locate(path)}")
        else:
            (raw.setdefault(target_section, {}) if target_section else node)[target] = value


def _check_unknown(raw: dict, section: str, table: dict, own: list, locate) -> None:
    """A key neither cs-run's (``own``) nor the vendor's: the error, with the did-you-mean over both."""
    node = raw.get(section)
    if not isinstance(node, dict):
        return
    for key in node:
        if key not in own and key not in table:
            path = f"{section}.{key}"
            raise ParamsError(unknown_key_message(path, key, own + sorted(table), where=locate(path)))


_LABELS = ("description", "tag")


def normalize(raw: dict, locate=lambda key: "", runconfig_keys: Optional[list] = None,
              data_processor_read: frozenset = frozenset()) -> dict:
    """Bring a flat vendor params dict (any release) into cs-run's sections, in place; returns it.

    The trainer form must go through :func:`from_trainer_form` first. ``runconfig_keys``: cs-run's own
    runconfig keys (for the did-you-mean of an unknown key; without them unknown keys are left to the
    section's own validation). ``data_processor_read``: the input sections whose data function reads
    ``data_processor`` (:func:`cs_run.registry.sections_reading_data_processor`); it stays in those.
    """
    for label in _LABELS:  # the 2.0/2.1 dit files' free-text labels: no runner read them
        if isinstance(raw.get(label), str):
            _record(label, raw.pop(label), "a label of the file, read by no Model Zoo runner")
    csconfig = raw.pop("csconfig", None)
    if csconfig is not None:
        if not isinstance(csconfig, dict):
            raise ParamsError(f"params: csconfig must be a mapping, got {type(csconfig).__name__}{locate('csconfig')}")
        for key, value in csconfig.items():
            if key not in CSCONFIG_KEYS:
                raise ParamsError(unknown_key_message(f"csconfig.{key}", key, list(CSCONFIG_KEYS),
                                                      where=locate(f"csconfig.{key}")))
            _check_type(f"csconfig.{key}", value, CSCONFIG_KEYS[key][2], locate)
        if csconfig.get("use_cbfloat16"):
            # Release_1.9's CS runner: cbfloat16 as the half type of mixed precision.
            raw.setdefault("model", {}).setdefault("fp16_type", "cbfloat16")
        else:
            _record("csconfig.use_cbfloat16", csconfig.get("use_cbfloat16"), "false keeps the default half type")
    if runconfig_keys is not None:
        _check_unknown(raw, "runconfig", RUNCONFIG_KEYS, list(runconfig_keys), locate)
    _apply_table(raw, "runconfig", RUNCONFIG_KEYS, locate)
    for section in ("train_input", "eval_input"):
        _apply_table(raw, section, {k: v for k, v in INPUT_KEYS.items()
                                    if k != "data_processor" or section not in data_processor_read}, locate)
    _apply_table(raw, "model", MODEL_KEYS, locate)
    _apply_table(raw, "optimizer", OPTIMIZER_KEYS, locate)
    return raw


def _set(out: dict, dotted: str, value: Any) -> None:
    section, _, key = dotted.partition(".")
    out.setdefault(section, {})[key] = value


def from_trainer_form(raw: dict, locate=lambda key: "", moves: Optional[dict] = None) -> dict:
    """The 2.5+ ``trainer: {init, fit, validate, validate_all}`` form as flat sections (a new dict).

    The inverse of the vendor Trainer's legacy-key table; a list of trainers is not supported here.
    ``moves``, when given, receives ``{flat key path: trainer key path}`` of every key moved (see
    :func:`moved_lines`), so messages about the flat keys can name the file's lines.
    """
    moves = {} if moves is None else moves
    if "trainer" not in raw:
        return raw
    trainer = _one_trainer(raw, locate)
    out: dict = {}
    init = trainer.get("init") or {}
    model = dict(init.get("model") or {})
    if model:
        out["model"] = model
        moves["model"] = "trainer.init.model"
    _init_optimizer(init.get("optimizer"), out, moves, locate)
    _init_schedulers(init.get("schedulers"), out, moves, locate)
    for part in _TRAINER_PARTS:
        if part in trainer:
            if part in TRAINER_RECORDED:
                _record(f"trainer.{part}", trainer[part], TRAINER_RECORDED[part])
            elif isinstance(trainer[part], dict):
                _walk_trainer(trainer[part], part, out, moves, locate)
    _sparsity_summaries(out, moves)
    unknown = [k for k in trainer if k not in _TRAINER_PARTS]
    if unknown:
        raise ParamsError(unknown_key_message(f"trainer.{unknown[0]}", unknown[0], list(_TRAINER_PARTS),
                                              where=locate(f"trainer.{unknown[0]}")))
    _dataloaders(trainer, out, moves)
    return out


_TRAINER_PARTS = ("init", "fit", "validate", "validate_all")


def _one_trainer(raw: dict, locate) -> dict:
    """The ``trainer`` mapping, the file's only section."""
    others = [k for k in raw if k != "trainer"]
    if others:
        raise ParamsError(f"params: the trainer form has only the 'trainer' section, found also {others}"
                          f"{locate(others[0])}")
    trainer = raw["trainer"]
    if isinstance(trainer, list):
        raise ParamsError("params: trainer: a list of trainers is not supported; keep one 'trainer' mapping"
                          f"{locate('trainer')}")
    if not isinstance(trainer, dict):
        raise ParamsError(f"params: trainer must be a mapping with init and fit{locate('trainer')}")
    return trainer


def _init_optimizer(opt: Any, out: dict, moves: dict, locate) -> None:
    """``init.optimizer: {Name: {...}}`` as the flat ``optimizer`` section."""
    if opt is None:
        return
    if not isinstance(opt, dict) or len(opt) != 1:
        raise ParamsError("params: trainer.init.optimizer: expected one mapping '<OptimizerName>: {...}'"
                          f"{locate('trainer.init.optimizer')}")
    (name, kwargs), = opt.items()
    out["optimizer"] = {"optimizer_type": name, **(kwargs or {})}
    moves.update({"optimizer": f"trainer.init.optimizer.{name}", "optimizer.optimizer_type": "trainer.init.optimizer"})


def _init_schedulers(scheds: Any, out: dict, moves: dict, locate) -> None:
    """``init.schedulers``: one learning-rate schedule of every group as ``optimizer.learning_rate``; several
    (or one naming param groups) side by side as ``optimizer.schedulers``, as the vendor's trainer builds them."""
    if scheds is None:
        return
    entries = scheds if isinstance(scheds, list) else [scheds]
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ParamsError(f"params: trainer.init.schedulers[{i}]: expected '<SchedulerName>: {{...}}'"
                              f"{locate('trainer.init.schedulers')}")
    # kept in the trainer form ({SequentialLR: {schedulers: [...]}}), which the optimizer factory reads
    (name, kwargs), = entries[0].items()
    if len(entries) == 1 and not _parallel(name, kwargs):  # one lr schedule of every group: learning_rate
        lr: Any = entries[0]
        if str(name).lower() in ("constantlr", "constant") and set(kwargs or {}) <= {"learning_rate"}:
            lr = (kwargs or {}).get("learning_rate")
        out.setdefault("optimizer", {})["learning_rate"] = lr
        moves["optimizer.learning_rate"] = "trainer.init.schedulers[0]"
        return
    section = out.setdefault("optimizer", {})
    if "learning_rate" in section:  # the optimizer's own lr (alias of lr): the groups no schedule sets
        section["lr"] = section.pop("learning_rate")
        moves["optimizer.lr"] = moves.get("optimizer", "trainer.init.optimizer") + ".learning_rate"
    section["schedulers"] = list(entries)
    moves["optimizer.schedulers"] = "trainer.init.schedulers"


def _walk_trainer(node: dict, prefix: str, out: dict, moves: dict, locate) -> None:
    """Each key below a trainer part: moved to its flat key, recorded, or refused by name."""
    for key, value in node.items():
        path = f"{prefix}.{key}"
        if path in TRAINER_KEYS:
            _set(out, TRAINER_KEYS[path], value)
            moves[TRAINER_KEYS[path]] = f"trainer.{path}"
        elif path in TRAINER_RECORDED or any(path.startswith(r + ".") for r in TRAINER_RECORDED):
            # a dotted key (the vendor's ``backend: {csx.debug.<flag>: ...}``) under a recorded one is recorded
            recorded = max((r for r in TRAINER_RECORDED if path == r or path.startswith(r + ".")), key=len)
            _record(f"trainer.{path}", value, TRAINER_RECORDED[recorded])
        elif path == "init.sparsity":  # the legacy layout's top-level section (the vendor's TRAINER_PARAMS_TO_LEGACY)
            if value is not None:
                out["sparsity"] = value
                moves["sparsity"] = "trainer.init.sparsity"
        elif path == "init.callbacks":
            _callbacks(value, out, moves, locate)
        elif path == "init.checkpoint.checkpoint_name":
            if value != CHECKPOINT_NAME:
                raise ParamsError(f"params: trainer.{path}: {value!r}: cs-run names checkpoints {CHECKPOINT_NAME} "
                                  f"(and autoloads that name); remove the key or set it to that"
                                  f"{locate(f'trainer.{path}')}")
            _record(f"trainer.{path}", value, "the vendor's default name, the one cs-run writes")
        elif path in ("init.model", "init.optimizer", "init.schedulers", "fit.train_dataloader",
                      "fit.val_dataloader"):
            continue
        elif isinstance(value, dict) and any(k.startswith(path + ".") for k in (*TRAINER_KEYS, *TRAINER_RECORDED)):
            _walk_trainer(value, path, out, moves, locate)
        else:
            prefix_keys = {k[len(prefix) + 1:].split(".")[0] for k in (*TRAINER_KEYS, *TRAINER_RECORDED)
                           if k.startswith(prefix + ".")}
            raise ParamsError(unknown_key_message(f"trainer.{path}", key, sorted(prefix_keys),
                                                  where=locate(f"trainer.{path}")))


def _sparsity_summaries(out: dict, moves: dict) -> None:
    """The LogSparsity callback: the legacy ``sparsity.add_summaries`` on every sparsity entry."""
    log_sparsity = moves.pop("sparsity.add_summaries", None)
    if log_sparsity is not None and out.get("sparsity") is not None:
        section = out["sparsity"]
        entries = section if isinstance(section, list) else [section]
        out["sparsity"] = [{**(e if isinstance(e, dict) else {"sparsity": e}), "add_summaries": True} for e in entries]
        out["sparsity"] = out["sparsity"] if isinstance(section, list) else out["sparsity"][0]


def _dataloaders(trainer: dict, out: dict, moves: dict) -> None:
    """``fit.train_dataloader`` / ``fit.val_dataloader`` (or ``validate.val_dataloader``) as the input sections."""
    fit = trainer.get("fit") or {}
    if fit.get("train_dataloader") is not None:
        out["train_input"] = dict(fit["train_dataloader"])
        moves["train_input"] = "trainer.fit.train_dataloader"
    if fit.get("val_dataloader") is not None:
        out["eval_input"] = dict(fit["val_dataloader"])
        moves["eval_input"] = "trainer.fit.val_dataloader"
    elif isinstance(trainer.get("validate"), dict) and trainer["validate"].get("val_dataloader") is not None:
        out["eval_input"] = dict(trainer["validate"]["val_dataloader"])
        moves["eval_input"] = "trainer.validate.val_dataloader"


def _parallel(name: Any, arguments: Any) -> bool:
    """Whether a lone ``schedulers`` entry needs the side-by-side form: it names param groups or sets the
    weight decay (the 2.10 weight-decay schedulers are the ``...WD`` classes)."""
    return str(name).upper().endswith("WD") or (isinstance(arguments, dict) and "param_group_tags" in arguments)


_FLAG_CALLBACKS = ("GlobalFlags", "ScopedTrainFlags", "ScopedValidateFlags")
_FLAGS = {
    "csx.performance.micro_batch_size": "the CSX compiler's micro-batch size: the whole batch runs at once here "
                                        "(optimizer.grad_accum_steps splits it)",
    "csx.performance.": "a Cerebras appliance performance setting",
    "csx.debug.": "a Cerebras appliance / compiler debug setting",
}
_NOTED_CALLBACKS = {
    "ComputeNorm": "the vendor Trainer's parameter and gradient norm summaries; not computed here",
}


_REQUIRED = object()
_ONE_KEY_CALLBACKS = {
    "LoadCheckpointStates": ("load_checkpoint_states", "runconfig.load_checkpoint_states", "all"),
    "KeepNCheckpoints": ("n", "runconfig.max_checkpoints", None),
    "Lora": ("lora_params", "model.lora_params", _REQUIRED),
}
"""Callbacks that stand for one legacy key: name -> (their argument, the flat key, its default)."""


def _callbacks(value: Any, out: dict, moves: dict, locate) -> None:
    """``trainer.init.callbacks``: flag callbacks noted per flag, LoadCheckpointStates as
    runconfig.load_checkpoint_states, LogSparsity as the sparsity section's add_summaries, Lora as
    model.lora_params, KeepNCheckpoints as runconfig.max_checkpoints; any other
    callback is an error naming it."""
    if not isinstance(value, list):
        raise ParamsError(f"params: trainer.init.callbacks: expected a list of '<CallbackName>: {{...}}', got "
                          f"{type(value).__name__}{locate('trainer.init.callbacks')}")
    known = [*_FLAG_CALLBACKS, *_NOTED_CALLBACKS, *_ONE_KEY_CALLBACKS, "LogSparsity"]
    for i, entry in enumerate(value):
        path = f"trainer.init.callbacks[{i}]"
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ParamsError(f"params: {path}: expected one mapping '<CallbackName>: {{...}}'{locate(path)}")
        (name, args), = entry.items()
        args = {} if args is None else args
        if not isinstance(args, dict):
            raise ParamsError(f"params: {path}.{name}: expected the callback's arguments as a mapping{locate(path)}")
        if name in _FLAG_CALLBACKS:
            for flag, setting in args.items():
                reason = _FLAGS.get(flag) or next((r for prefix, r in _FLAGS.items()
                                                   if prefix.endswith(".") and str(flag).startswith(prefix)), None)
                if reason is None:
                    raise ParamsError(f"params: {path}.{name}.{flag}: unknown flag; the Model Zoo's are under "
                                      f"csx.performance. and csx.debug.{locate(f'{path}.{name}.{flag}')}")
                _record(f"{path}.{name}.{flag}", setting, reason)
        elif name in _NOTED_CALLBACKS:
            _record(f"{path}.{name}", args, _NOTED_CALLBACKS[name])
        elif name == "LogSparsity":  # the vendor's TRAINER_PARAMS_TO_LEGACY pair: sparsity.add_summaries
            if args:
                raise ParamsError(f"params: {path}.LogSparsity: takes no arguments, got {sorted(args)}{locate(path)}")
            moves["sparsity.add_summaries"] = f"{path}.LogSparsity"
        elif name in _ONE_KEY_CALLBACKS:  # the vendor's TRAINER_PARAMS_TO_LEGACY pairs
            argument, flat, default = _ONE_KEY_CALLBACKS[name]
            unknown = sorted(set(args) - {argument})
            if unknown:
                raise ParamsError(unknown_key_message(f"{path}.{name}.{unknown[0]}", unknown[0], [argument],
                                                      where=locate(f"{path}.{name}.{unknown[0]}")))
            if argument not in args and default is _REQUIRED:
                raise ParamsError(f"params: {path}.{name}: needs {argument}{locate(path)}")
            _set(out, flat, args.get(argument, default))
            moves[flat] = f"{path}.{name}.{argument}"
        else:
            raise ParamsError(unknown_key_message(f"{path}.{name}", name, known, where=locate(path))
                              .replace("unknown key", "unknown callback", 1))


def moved_lines(lines: dict[str, int], moves: dict[str, str]) -> dict[str, int]:
    """``lines`` (key path -> line of the file) with the flat key paths of :func:`from_trainer_form`'s
    ``moves`` added: ``model.hidden_size`` gets the line of ``trainer.init.model.hidden_size``."""
    out = dict(lines)
    for flat, original in sorted(moves.items(), key=lambda item: len(item[1])):
        for key, line in lines.items():
            if key == original or key.startswith((original + ".", original + "[")):
                out[flat + key[len(original):]] = line
    return out
