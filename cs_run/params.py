"""Params files in the Model Zoo layout: load, override, validate, resolve, write.

A params file has five sections: ``train_input``, ``eval_input``, ``model``, ``optimizer`` and
``runconfig``, and may have a sixth, ``sparsity`` (the cstorch sparse API's config, checked by
:mod:`cs_run.sparsity_params`). Every check runs once, at load time, before any work starts, and every error names the
full key path (and the line in the file where there is one), what is wrong and how to fix it.

Keys that belong to a specific model or data function (``model.depth``, ...) are validated against
that function's signature: its parameter names are the valid keys and its annotations their types.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from cs_run import _yaml, vendor_params
from cs_run._checks import check_value, unknown_key_message
from cs_run._logging import Note, collecting_notes, defer
from cs_run.cluster_config import ClusterOptions
from cs_run.errors import CsRunError, ParamsError
from cs_run.lora_params import check_lora_params
from cs_run.parallel import Offload, Sharding
from cs_run.registry import apply_model_defaults, sections_reading_data_processor
from cs_run.schedule import MIN_STEPS, check_step_options
from cs_run.sparsity_params import check_sparsity

__all__ = [
    "CompileTier",
    "Params",
    "InputParams",
    "ModelParams",
    "OptimizerParams",
    "RunConfig",
    "load_params",
    "apply_overrides",
    "save_params",
    "params_yaml",
    "build_section",
    "check_runconfig",
    "params_from_dict",
]

SECTIONS = ("train_input", "eval_input", "model", "optimizer", "runconfig", "sparsity")


class CompileTier(enum.StrEnum):
    """The values of ``runconfig.compile_tier`` (the ``--compile_tier`` flag, ``backend(compile_tier=)``),
    spelled here once: the params' choices, the flag's and the engine's (``cs_run/engine/compile.py``)."""

    AUTO = "auto"
    """The default: builds fx and inductor and keeps the one the first steps measure faster."""
    FX = "fx"
    """The traced graph's own code: bit-identical to eager, builds instantly."""
    INDUCTOR = "inductor"
    """Fused kernels: slower to build, cached in compile_dir."""

    @classmethod
    def parse(cls, value: Any, where: str = "compile_tier") -> "CompileTier":
        """``value`` as a tier: the one check of a tier given outside a params file (``backend()``, the
        engine's options); a params file's is checked at load time, as every key is.

        Raises:
            ParamsError: (a ValueError) ``value`` is no tier; the message lists the tiers.
        """
        try:
            return cls(value)
        except ValueError:
            raise ParamsError(f"Invalid {where} {value!r}; must be one of {', '.join(cls)}") from None


@dataclass
class InputParams:
    """``train_input`` / ``eval_input``: how a split's torch DataLoader is built."""

    data_fn: Optional[str] = None
    """Registry name or ``module:function`` building the DataLoader; defaults to the model's data."""
    data_dir: Union[str, list[str], None] = None
    """Folder with the split's files, or a list of folders (the Model Zoo's LM data reads them all); relative
    paths resolve against the working directory (the vendor's rule), else the params file's folder
    (logged). ``bundled:digits`` asks for the bundled digits."""
    batch_size: int = field(default=128, metadata={"min": 1})
    """Samples per batch (per micro-batch when gradients are accumulated)."""
    shuffle: bool = True
    """Shuffle every epoch (training); the order follows runconfig.seed."""
    shuffle_seed: Optional[int] = None
    """Seed of a dedicated shuffle generator; without it the order follows the global RNG (runconfig.seed)."""
    drop_last_batch: bool = True
    """Drop the last incomplete batch so every step sees the same shape (one graph on CSX)."""
    num_workers: int = field(default=0, metadata={"min": 0})
    """torch DataLoader worker processes."""
    prefetch_factor: Optional[int] = field(default=None, metadata={"min": 1})
    """Batches prefetched per worker (only with num_workers > 0)."""
    persistent_workers: bool = False
    """Keep workers alive between epochs (only with num_workers > 0)."""
    extra: dict = field(default_factory=dict)
    """Keys of the data function itself, validated against its signature."""


@dataclass
class ModelParams:
    """``model``: which model to build and its precision."""

    name: str = field(default="", metadata={"required": True})
    """Registry name (``fc_mnist``) or ``module:function`` returning a torch.nn.Module."""
    mixed_precision: bool = False
    """Run forward/backward under autocast (bfloat16 with use_bfloat16)."""
    use_bfloat16: bool = False
    """With mixed_precision, use bfloat16 instead of float16."""
    fp16_type: Optional[str] = field(default=None, metadata={"choices": ("float16", "bfloat16", "cbfloat16")})
    """With mixed_precision, the half type by name (overrides use_bfloat16)."""
    lora_params: Union[dict, list, None] = None
    """LoRA adapters for any model (the Model Zoo's ``Lora`` callback; :mod:`cs_run.lora_params`)."""
    extra: dict = field(default_factory=dict)
    """Keys of the model function itself, validated against its signature."""


@dataclass
class OptimizerParams:
    """``optimizer``: the optimizer, its schedule and the step's numerics."""

    optimizer_type: str = field(default="", metadata={"required": True})
    """Optimizer class name, case-insensitive (SGD, AdamW, ... or a user subclass)."""
    learning_rate: Union[float, dict, list, None] = field(default=None, metadata={"min": 0})
    """A number, a scheduler dict or a list of them (see cs_run.optim.configure_lr_scheduler); required
    unless ``schedulers`` is given."""
    schedulers: Optional[list] = None
    """The trainer form's ``schedulers`` (LR and weight-decay schedules side by side, each of the groups its
    ``param_group_tags`` names; see cs_run.optim.configure_schedulers), instead of ``learning_rate``."""
    grad_accum_steps: int = field(default=1, metadata={"min": MIN_STEPS})
    """Micro-batches whose gradients are summed before each optimizer step."""
    max_gradient_norm: Optional[float] = field(default=None, metadata={"min_exclusive": 0})
    """Clip gradients to this global L2 norm."""
    max_gradient_value: Optional[float] = field(default=None, metadata={"min_exclusive": 0})
    """Clip each gradient element to [-value, value]."""
    loss_scaling_factor: Union[float, str] = 1.0
    """Static loss scale, or "dynamic" for dynamic loss scaling."""
    initial_loss_scale: Optional[float] = field(default=None, metadata={"min_exclusive": 0})
    """Starting scale with dynamic loss scaling."""
    steps_per_increase: Optional[int] = field(default=None, metadata={"min": 1})
    """Clean steps before a dynamic loss scale grows."""
    min_loss_scale: Optional[float] = field(default=None, metadata={"min_exclusive": 0})
    """Lower bound of the dynamic loss scale."""
    max_loss_scale: Optional[float] = field(default=None, metadata={"min_exclusive": 0})
    """Upper bound of the dynamic loss scale."""
    overflow_tolerance: Optional[float] = field(default=None, metadata={"min": 0})
    """Fraction of overflowing steps tolerated before the dynamic loss scale is lowered."""
    log_summaries: bool = False
    """Also write per-parameter-group learning rates to the summaries."""
    extra: dict = field(default_factory=dict)
    """Keyword arguments of the optimizer class (momentum, betas, weight_decay, ...)."""


_ENGINE_USES = ("train", "eval", "eval_all", "trace")
"""The commands a CSX engine flag applies to: every run command (a flag's ``uses``, see cs_run.frontends.flags)."""


@dataclass
class RunConfig(ClusterOptions):
    """``runconfig``: how long to run, where to write, how often to log and checkpoint.

    The cluster keys (num_csx, python_paths, ...) are :class:`cs_run.distributed.ClusterOptions`'
    fields, embedded. A field whose metadata has ``flag`` is also a ``cs-run`` / run.py flag, and one
    with ``trainer`` a key of the Trainer's argument of that name (:mod:`cs_run.frontends.flags` generates them).
    """

    model_dir: str = field(default="./model_dir", metadata={"flag": {"short": "-o", "path": "dir"}})
    """Output folder: checkpoints, train/ and eval/ summaries, resolved params, run log."""
    max_steps: Optional[int] = field(default=None, metadata={"min": MIN_STEPS, "flag": {"uses": ("train",)},
                                                             "trainer": "loop"})
    """Total optimizer steps, counted across resumed runs."""
    num_steps: Optional[int] = field(default=None, metadata={"min": MIN_STEPS, "flag": {"uses": ("train",)},
                                                             "trainer": "loop"})
    """Steps to run in this invocation (exclusive with num_epochs)."""
    num_epochs: Optional[int] = field(default=None, metadata={"min": MIN_STEPS, "flag": {"uses": ("train",)},
                                                              "trainer": "loop"})
    """Epochs to run in this invocation (exclusive with num_steps)."""
    steps_per_epoch: Optional[int] = field(default=None, metadata={"min": MIN_STEPS, "trainer": "loop"})
    """Cap on steps per epoch; defaults to the train loader's length."""
    eval_steps: Optional[int] = field(default=None, metadata={"min": 1, "flag": {"uses": ("eval", "eval_all")},
                                                                  "trainer": "loop"})
    """Eval batches per evaluation; defaults to the whole eval loader."""
    eval_frequency: Optional[Union[int, float]] = field(default=None, metadata={"min_exclusive": 0, "trainer": "loop"})
    """In train_and_eval, also evaluate every this many steps (an integer), or after every this fraction
    of the run's steps (a float in (0, 1]: 0.5 evaluates halfway and at the end), counted from the run's
    start (the Model Zoo's rule; mode train never evaluates)."""
    early_stopping_metric: Optional[str] = field(default=None, metadata={"trainer": "loop"})
    """Stop training when this eval value (eval/loss, or a metric such as eval/accuracy) has not improved
    for early_stopping_patience evaluations in a row; needs train_and_eval and eval_frequency. The run ends with a checkpoint
    of its last step."""
    early_stopping_mode: Optional[str] = field(default=None, metadata={"choices": ("min", "max"),
                                                                       "trainer": "loop"})
    """min: lower is better, max: higher is better (default: min for a loss, perplexity or error, else max)."""
    early_stopping_patience: int = field(default=3, metadata={"min": 1, "trainer": "loop"})
    """Evaluations in a row without improvement before training stops."""
    early_stopping_min_delta: float = field(default=0.0, metadata={"min": 0, "trainer": "loop"})
    """The least change of the value that counts as an improvement."""
    checkpoint_steps: int = field(default=0, metadata={"min": 0, "trainer": ("checkpoint", "steps")})
    """Save a checkpoint every this many steps (0: only at the end)."""
    save_initial_checkpoint: bool = field(default=False, metadata={"trainer": "checkpoint"})
    """Save a checkpoint of the initial weights at step 0."""
    max_checkpoints: Optional[int] = field(default=None, metadata={"min": 1, "trainer": "checkpoint"})
    """Keep only the newest this many checkpoints in model_dir."""
    log_steps: int = field(default=100, metadata={"min": 1, "trainer": "logging"})
    """Log loss and rate every this many steps."""
    seed: Optional[int] = field(default=None, metadata={"min": -(2**63), "max": 2**64 - 1,
                                                         "flag": {"uses": ("train", "eval", "eval_all")}})
    """Seed of every RNG (torch, numpy, random); two runs with one seed give identical losses. Any
    integer torch.manual_seed accepts: -2**63 to 2**64 - 1."""
    checkpoint_path: Optional[str] = field(default=None, metadata={"flag": {"path": "checkpoint", "uses": ("train", "eval")}})
    """Start from this checkpoint instead of the newest one in model_dir."""
    autoload_checkpoint: bool = field(default=True, metadata={"trainer": ("checkpoint", "autoload")})
    """Resume from the newest checkpoint in model_dir when checkpoint_path is not given."""
    load_checkpoint_states: Union[str, list[str]] = "all"
    """Which states of the start checkpoint a training run loads: "all", or some of model, optimizer,
    lr_scheduler, grad_scaler, global_step, dataloader, rng (a list or a comma-separated string; the Model
    Zoo's LoadCheckpointStates). States left out start fresh: "model" takes the weights only."""
    logging: str = field(default="INFO", metadata={"choices": ("DEBUG", "INFO", "WARNING", "ERROR"), "flag": {},
                                                   "trainer": ("logging", "log_level")})
    """Log level of the console and of model_dir/run.log."""
    runner: Optional[str] = field(default=None, metadata={"flag": {"metavar": "MODULE:CLASS"}})
    """A custom runner class as ``module:Class`` (a subclass of one of cs-run's runners)."""
    disable_progress_bar: bool = field(default=False, metadata={"trainer": "logging"})
    """Hide the tqdm progress bars (they are hidden anyway when stderr is not a terminal)."""
    sharding: str = field(default=Sharding.NONE.value, metadata={"choices": tuple(s.value for s in Sharding),
                                                    "flag": {"uses": ("train", "eval", "eval_all")}})
    """How the num_csx replicas hold the model: none (data parallel: each holds all of it) or fsdp (torch
    FSDP2: parameters, gradients and optimizer state sharded 1/N per replica; CPU and GPU devices)."""
    offload: str = field(default=Offload.NONE.value, metadata={"choices": tuple(o.value for o in Offload),
                                                   "flag": {"uses": ("train", "eval", "eval_all")}})
    """cpu: keep the (sharded) parameters and optimizer state in host memory and copy each block to the
    device for its forward and backward (FSDP2's CPUOffloadPolicy); also with one replica."""
    # ---- CSX: the lazy-traced engine (the cluster keys come from ClusterOptions)
    compile_dir: Optional[str] = field(default=None, metadata={"flag": {"path": "dir", "uses": _ENGINE_USES}})
    """Compile cache of the CSX engine (default: the per-user cache every run shares, $CS_RUN_CACHE_DIR or
    ~/.cache/cs-run)."""
    compile_only: bool = field(default=False, metadata={"flag": {"cli": False}})
    """Trace and compile the step into compile_dir; run nothing (exclusive with validate_only)."""
    validate_only: bool = field(default=False, metadata={"flag": {"cli": False}})
    """Trace the step and report its graph or compliance error; compile and run nothing."""
    compile_tier: Optional[str] = field(default=None, metadata={"choices": tuple(t.value for t in CompileTier),
                                                              "flag": {"uses": _ENGINE_USES}})
    """CSX compile tier: auto (default: the faster of fx and inductor, measured on the first steps), fx
    (bit-identical to eager, instant), inductor (fused kernels, compiled once and cached)."""


@dataclass
class Params:
    """A whole params file, validated."""

    model: ModelParams
    optimizer: Optional[OptimizerParams]
    runconfig: RunConfig
    train_input: Optional[InputParams] = None
    eval_input: Optional[InputParams] = None
    sparsity: Any = None
    """The ``sparsity`` section as written (checked; ``cs_run.sparse.configure`` builds it), or None."""
    source: Optional[str] = None
    """The params file this came from (for messages), or None."""
    lines: dict = field(default_factory=dict, repr=False)
    """1-based line in ``source`` of each key path (``optimizer.learning_rate[0].scheduler``)."""
    overridden: frozenset = frozenset()
    """Key paths set on the command line (``--set`` or a flag)."""
    given_by: dict = field(default_factory=dict, repr=False)
    """The flag or API argument that set a key path, where one did (``runconfig.checkpoint_path``:
    ``--resume``), for the messages about that value."""
    notes: list[Note] = field(default_factory=list, repr=False)
    """What the load that made these params noted (a data_dir found next to the params file, a vendor
    key with no effect): each run of these params logs them when its log opens."""
    names: dict = field(default_factory=dict, repr=False)
    """What the user calls a key path where it is not the params file's (the Trainer's arguments:
    ``runconfig.num_steps`` is ``loop.num_steps``), for messages: :meth:`name`."""
    head: str = "params: "
    """The head of a message about these params' values: what the user gave (``Trainer: ``)."""

    def name(self, key_path: str) -> str:
        """``key_path`` as the user set it: a Trainer argument's key, else the params key path."""
        return user_name(self.names, key_path)

    def named(self, message: str) -> str:
        """``message`` in the words the user wrote where these params are not a file's (the Trainer's):
        a ``params: `` head as :attr:`head`, every key path as :meth:`name` names it, also one a data
        function wrote itself (``train_input.data_dir`` of the Trainer's dict input is
        ``train_dataloader.data_dir``)."""
        if not self.names:
            return message
        if message.startswith("params: "):
            message = self.head + message.removeprefix("params: ")

        return _KEY_PATH.sub(lambda match: self.name(match.group()), message)

    def where(self, key_path: str = "") -> str:
        """`` (file:line)`` of a key path (or of its nearest enclosing key), for an error message."""
        return Params.locator(self.source, self.lines, self.overridden)(key_path)

    @staticmethod
    def locator(source: Optional[str], lines: dict, overridden: frozenset = frozenset()):
        def locate(key_path: str) -> str:
            if key_path and any(key_path == k or key_path.startswith((k + ".", k + "[")) for k in overridden):
                return " (set on the command line)"
            probe = key_path
            while probe:
                if probe in lines:
                    return f" ({source}:{lines[probe]})"
                probe = probe[:max(probe.rfind("."), probe.rfind("["), 0)]
            return f" ({source})" if source else ""

        return locate

    def locate_error(self, err: ParamsError, section: str = "") -> ParamsError:
        """``err`` with the file:line of the most specific key it names (``section``'s keys first);
        unchanged when it has a location already or is about a command-line flag. Params without a
        file but with :attr:`names` (the Trainer's) get the message in those names (:meth:`named`)."""
        message = str(err)
        if self.names and not self.source:
            named = self.named(message)
            if named == message:
                return err
            renamed = ParamsError(named)
            renamed.__cause__ = err.__cause__
            return renamed
        if ((self.source and f"({self.source}" in message) or "(set on the command line)" in message
                or message.startswith("--") or not self.source):
            return err
        tokens = [token.rstrip(".") for token in re.findall(r"[A-Za-z_][\w.\[\]]*", message)]
        if not section:  # the first full key path the message names decides the section of the others
            section = next((t.split(".")[0] for t in tokens
                            if "." in t and (t in self.lines or t in self.overridden)), "")
        prefixes = [section] if section else list(SECTIONS)
        subject = next((t for t in tokens if "." in t and (t in self.lines or t in self.overridden)), "")
        if message.startswith("params: ") and subject and message.startswith(f"params: {subject}"):
            located = ParamsError(message + self.where(subject))  # the key the message is about, as given
            located.__cause__ = err.__cause__
            return located
        best = ""
        for token in tokens:
            for prefix in ["", *prefixes]:
                candidate = f"{prefix}.{token}" if prefix else token
                if candidate in self.overridden:  # set on the command line, maybe not in the file at all
                    best = candidate if len(candidate) > len(best) else best
                    continue
                while candidate and candidate not in self.lines:  # its nearest key present in the file
                    candidate = candidate[:max(candidate.rfind("."), candidate.rfind("["), 0)]
                if len(candidate) > len(prefix) and len(candidate) > len(best):  # names a part of the token
                    best = candidate
        located = ParamsError(message + self.where(best))
        located.__cause__ = err.__cause__
        return located

    def to_dict(self) -> dict:
        """Plain nested dict in the file layout, extras folded back into their sections."""
        out: dict = {}
        for name in SECTIONS:
            section = getattr(self, name)
            if section is None:
                continue
            if name == "sparsity":
                out[name] = section
                continue
            d = dataclasses.asdict(section)
            extra = d.pop("extra", {}) or {}
            d.update(extra)
            out[name] = d
        return out


_RUNCONFIG_KEYS = [f.name for f in dataclasses.fields(RunConfig)]
def user_name(names: dict[str, str], key_path: str) -> str:
    """``key_path`` in ``names``' words (:attr:`Params.names`): the longest named prefix of it renamed
    (``train_input.data_dir`` is ``train_dataloader.data_dir`` where ``train_input`` is named), else as is."""
    for cut in [len(key_path), *(i for i in range(len(key_path) - 1, 0, -1) if key_path[i] == ".")]:
        if key_path[:cut] in names:
            return names[key_path[:cut]] + key_path[cut:]
    return key_path


_KEY_PATH = re.compile(r"(?<![\w./\\-])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")  # a dotted key path, not a file path's part

_SECTION_TYPES = {
    "train_input": InputParams,
    "eval_input": InputParams,
    "model": ModelParams,
    "optimizer": OptimizerParams,
    "runconfig": RunConfig,
}
_PATH_KEYS = {("train_input", "data_dir"), ("eval_input", "data_dir"), ("runconfig", "model_dir"),
              ("runconfig", "checkpoint_path"), ("runconfig", "compile_dir")}
_PATH_LIST_KEYS = {("runconfig", "mount_dirs"), ("runconfig", "python_paths")}


# ----------------------------------------------------------------------------------------- loading

def load_params(path: str | os.PathLike, overrides: dict[str, Any] | None = None, *, defaults_fn=None,
                given_by: dict[str, str] | None = None) -> Params:
    """Parse and validate a params file with its overrides: the pure step, run by every entry point.

    It reads the file and nothing else: no module is imported and ``sys.path`` is not changed (that is
    :func:`cs_run.resolve.resolve_params`, the second step, run when a runner is created).

    Args:
        path: the YAML file (read as hostile input, see :mod:`cs_run._yaml`).
        overrides: dotted keys (``runconfig.max_steps``) to set after reading; relative paths among
            them resolve against the current folder, not the file's. Validated like the file.
        defaults_fn: called with the raw dict after reading, returns it with defaults filled in
            (the Model Zoo's ``default_params_fn``).
        given_by: the flag that set each of the overrides it names (:attr:`Params.given_by`).

    Raises:
        ParamsError: with the key path, the file and line (or "set on the command line"), and the fix.
    """
    path = Path(path)
    with collecting_notes() as notes:  # from the file's parse on (a key given twice)
        raw, lines = _yaml.parse(_yaml.read_text(path), str(path))
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ParamsError(f"params file must be a mapping of sections, got {type(raw).__name__} ({path})")
        overridden = frozenset(k for k, v in (overrides or {}).items() if v is not None and v is not REMOVE)
        for key in overridden:
            _yaml.check_finite(overrides[key], key, " (set on the command line)")
        located = Params.locator(str(path), lines, overridden)
        moves: dict[str, str] = {}
        raw = vendor_params.from_trainer_form(raw, located, moves)
        if moves:  # a trainer-form file: its flat keys' messages name the lines of the keys they came from
            lines = vendor_params.moved_lines(lines, moves)
            located = Params.locator(str(path), lines, overridden)
        if defaults_fn is not None:
            raw = defaults_fn(raw)

        raw = apply_model_defaults(raw, located)
        _refuse_empty_paths(raw, located)
        _resolve_relative_paths(raw, path.parent)
        if overrides:
            apply_overrides(raw, overrides)
            _refuse_empty_paths(raw, located)
        vendor_params.normalize(raw, located, _RUNCONFIG_KEYS, sections_reading_data_processor(raw))
        params = validate_params(raw, locate=located)
    params.source, params.lines, params.overridden, params.notes = str(path), lines, overridden, notes
    params.given_by = dict(given_by or {})
    # The default ./model_dir, not given in the file, is relative to the current folder.
    params.runconfig.model_dir = str(Path(params.runconfig.model_dir).expanduser().resolve())
    return params


def params_from_dict(raw: dict, *, base_dir: str | os.PathLike | None = None, source: str | None = None) -> Params:
    """Validate a params dict already read (the Model Zoo's ``main(params, ...)``): the vendor forms are
    brought into cs-run's sections, relative paths resolve as in :func:`load_params` (``base_dir``: the
    params file's folder), defaults are filled. Pure, like :func:`load_params`.

    Raises:
        ParamsError: with the key path and the fix.
    """
    where = f" ({source})" if source else ""
    with collecting_notes() as notes:
        raw = vendor_params.from_trainer_form(raw)
        _refuse_empty_paths(raw, lambda key: where)
        _resolve_relative_paths(raw, Path(base_dir) if base_dir is not None else Path.cwd())
        vendor_params.normalize(raw, lambda key: where, _RUNCONFIG_KEYS, sections_reading_data_processor(raw))
        params = validate_params(raw, locate=lambda key: where)
    params.source, params.notes = source, notes
    params.runconfig.model_dir = str(Path(params.runconfig.model_dir).expanduser().resolve())
    return params


REMOVE = object()
"""An override value that deletes the key (``--set optimizer.momentum=null``)."""


def apply_overrides(raw: dict, overrides: dict[str, Any]) -> None:
    """Set dotted keys in place; ``None`` values are skipped (an unset CLI flag), ``REMOVE`` deletes."""
    for dotted, value in overrides.items():
        if value is None:
            continue
        keys = dotted.split(".")
        if keys[0] not in SECTIONS:
            raise ParamsError(unknown_key_message(dotted, keys[0], SECTIONS, where=" (set on the command line)"))
        node = raw
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ParamsError(f"params: cannot set {dotted}: {key} is not a mapping (set on the command line)")
        if value is REMOVE:
            node.pop(keys[-1], None)
        else:
            node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``runconfig.log_steps=10`` -> ("runconfig.log_steps", 10); values are read as YAML (with the
    params file's limits), and ``null`` (or nothing after ``=``) removes the key, so its default applies."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ParamsError(f"--set expects KEY=VALUE (e.g. runconfig.log_steps=10), got {text!r}")
    key = key.strip()
    parsed = _yaml.parse_value(value, key) if value.strip() else None
    return key, REMOVE if parsed is None else parsed


def params_yaml(params: Params) -> str:
    """The resolved params as YAML text, in the file layout (what save_params writes, --print-config shows)."""
    return yaml.safe_dump(params.to_dict(), sort_keys=False)


def save_params(params: Params, model_dir: str | os.PathLike, name: str = "params_resolved.yaml") -> Path:
    """Write the resolved params (defaults filled in, paths absolute) next to the checkpoints."""
    out = Path(model_dir) / name
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".yaml.tmp")
    text = params_yaml(params)
    try:
        tmp.write_text(text)
        os.replace(tmp, out)
    except OSError as e:  # full disk, read-only folder: no half-written file stays behind
        tmp.unlink(missing_ok=True)
        raise CsRunError(f"cannot write {out}: {e.strerror or e}; free space or choose another model_dir") from None
    return out


# -------------------------------------------------------------------------------------- validation

def validate_params(raw: dict, *, locate=lambda key: "") -> Params:
    """Check sections, keys, types and ranges; fill defaults."""
    for name in raw:
        if name not in SECTIONS:
            raise ParamsError(unknown_key_message(name, name, SECTIONS, where=locate(name)))
    sections: dict[str, Any] = {}
    if raw.get("sparsity") is not None:
        runconfig = raw.get("runconfig") if isinstance(raw.get("runconfig"), dict) else {}
        check_sparsity(raw["sparsity"], "sparsity", locate, max_steps=runconfig.get("max_steps"))
        sections["sparsity"] = raw["sparsity"]
    for name, cls in _SECTION_TYPES.items():
        value = raw.get(name)
        if value is None:
            sections[name] = None
            continue
        if not isinstance(value, dict):
            raise ParamsError(f"params: {name} must be a mapping, got {type(value).__name__}{locate(name)}")
        sections[name] = build_section(cls, name, value, locate)
    if sections["model"] is None:
        raise ParamsError("params: missing required section 'model' (needs at least model.name)")
    check_lora_params(sections["model"].lora_params, "model.lora_params", locate)
    if sections["runconfig"] is None:
        sections["runconfig"] = RunConfig()
    _check_cross_keys(sections, locate)
    return Params(**sections)


def build_section(cls, section: str, values: dict, locate=lambda key: "", names: Optional[dict] = None,
                  head: str = "params: "):
    """One section dataclass from a dict: unknown keys, types and ranges checked (the Trainer uses it too,
    with its ``names`` for the key paths and its ``head``, as in :attr:`Params.names`)."""
    names = names or {}
    hints = typing.get_type_hints(cls)
    known = [f for f in dataclasses.fields(cls) if f.name != "extra"]
    has_extra = "extra" in hints
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in values.items():
        key_path = f"{section}.{key}"
        f = next((f for f in known if f.name == key), None)
        if f is None:
            if has_extra:
                extra[key] = value
                continue
            raise ParamsError(unknown_key_message(key_path, key, [k.name for k in known], where=locate(key_path)))
        if value is None and not f.metadata.get("required"):
            continue
        check_value(user_name(names, key_path), value, hints[key], f.metadata, where=locate(key_path), head=head)
        kwargs[key] = float(value) if hints[key] is float and isinstance(value, int) else value
    for f in known:
        if f.metadata.get("required") and f.name not in kwargs:
            key_path = f"{section}.{f.name}"
            raise ParamsError(f"params: missing required key {key_path}{locate(section)}")
    if cls is OptimizerParams:
        _check_schedule_keys(section, values, locate)
    if has_extra:
        kwargs["extra"] = extra
    return cls(**kwargs)


def _check_schedule_keys(section: str, values: dict, locate) -> None:
    """One schedule of the lr: ``learning_rate`` or ``schedulers`` (which may set it per group), never both."""
    given = [key for key in ("learning_rate", "schedulers") if values.get(key) is not None]
    if not given:
        raise ParamsError(f"params: missing required key {section}.learning_rate{locate(section)}")
    if len(given) == 2:
        raise ParamsError(f"params: {section}.learning_rate and {section}.schedulers are two schedules of the lr; "
                          f"keep one (a starting lr for the groups no schedule sets is {section}.lr)"
                          f"{locate(f'{section}.schedulers')}")


def _check_cross_keys(s: dict, locate) -> None:
    rc: RunConfig = s["runconfig"]
    check_runconfig(rc, locate)
    opt: OptimizerParams | None = s["optimizer"]
    if opt is not None:
        if opt.max_gradient_norm is not None and opt.max_gradient_value is not None:
            raise ParamsError("params: optimizer.max_gradient_norm and optimizer.max_gradient_value are "
                              f"mutually exclusive; clip by norm or by value{locate('optimizer')}")
        lsf = opt.loss_scaling_factor
        if isinstance(lsf, str) and lsf != "dynamic":
            raise ParamsError(f"params: optimizer.loss_scaling_factor: expected a number or 'dynamic', got "
                              f"{lsf!r}{locate('optimizer.loss_scaling_factor')}")
        if not isinstance(lsf, str) and lsf <= 0:
            raise ParamsError(f"params: optimizer.loss_scaling_factor: must be > 0, got {lsf}"
                              f"{locate('optimizer.loss_scaling_factor')}")


def check_runconfig(rc: RunConfig, locate=lambda key: "", names: Optional[dict] = None, head: str = "params: ") -> None:
    """The runconfig's rules across keys (a params file's, the Trainer's with its ``names`` and ``head``)."""
    names = names or {}

    def name(key: str) -> str:
        return user_name(names, f"runconfig.{key}")

    try:  # the schedule's own checks (cs_run.schedule), here with the file and line
        check_step_options(num_steps=rc.num_steps, max_steps=rc.max_steps, num_epochs=rc.num_epochs,
                           steps_per_epoch=rc.steps_per_epoch, where=head,
                           names={k: name(k) for k in ("num_steps", "max_steps", "num_epochs", "steps_per_epoch")})
    except ParamsError as e:
        raise ParamsError(f"{e}{locate('runconfig')}") from None
    if isinstance(rc.eval_frequency, float) and rc.eval_frequency > 1:
        raise ParamsError(f"{head}{name('eval_frequency')}: a float is the fraction of the run's steps between "
                          f"evaluations, in (0, 1]; got {rc.eval_frequency} (an integer counts steps)"
                          f"{locate('runconfig.eval_frequency')}")
    if rc.compile_only and rc.validate_only:
        raise ParamsError("params: runconfig.compile_only and runconfig.validate_only are mutually exclusive; "
                          f"set at most one{locate('runconfig')}")
    for label in rc.job_labels:
        if not isinstance(label, str) or "=" not in label:
            raise ParamsError(f"params: runconfig.job_labels: expected 'key=value', got {label!r}"
                              f"{locate('runconfig.job_labels')}")
    for key in ("python_paths", "mount_dirs"):
        for folder in getattr(rc, key):
            if not isinstance(folder, str) or not Path(folder).is_dir():
                raise ParamsError(f"params: runconfig.{key}: {folder!r} is not an existing folder"
                                  f"{locate(f'runconfig.{key}')}")


def resolve_data_dir(value: str, params_dir: Path, key: str = "data_dir") -> str:
    """The vendor's rule: a relative data path is relative to the working directory. When only the
    params file's folder has it, that folder is used and the choice is logged (cs-run's older rule)."""
    if value == vendor_params.BUNDLED_DATA:
        return value
    p = Path(value).expanduser()
    if p.is_absolute():
        return str(p)
    from_cwd, from_params = p.resolve(), (params_dir / p).resolve()
    if not from_cwd.exists() and from_params.exists():
        defer(__name__, f"params: {key} {value!r} is not in the working directory; using {from_params} "
                        "(relative to the params file)")
        return str(from_params)
    return str(from_cwd)


def _refuse_empty_paths(raw: dict, locate) -> None:
    """An empty path would resolve to the params file's (or the current) folder: a run into ``''`` wrote
    its checkpoints among whatever was there."""
    for section, key in sorted(_PATH_KEYS | _PATH_LIST_KEYS):
        node = raw.get(section)
        value = node.get(key) if isinstance(node, dict) else None
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if isinstance(item, str) and not item.strip():
                where = f"{section}.{key}" + (f"[{i}]" if isinstance(value, list) else "")
                raise ParamsError(f"params: {where}: an empty path (it would be the current folder); give a folder "
                                  f"name such as ./{key}{locate(f'{section}.{key}')}")


def _resolve_relative_paths(raw: dict, base: Path) -> None:
    def resolve(value: str) -> str:
        p = Path(value).expanduser()
        return str(p if p.is_absolute() else (base / p).resolve())

    for section, key in _PATH_KEYS | _PATH_LIST_KEYS:
        node = raw.get(section)
        if not isinstance(node, dict):
            continue
        value = node.get(key)
        if isinstance(value, str) and key == "data_dir":
            node[key] = resolve_data_dir(value, base, f"{section}.{key}")
        elif isinstance(value, list) and key == "data_dir":
            node[key] = [resolve_data_dir(v, base, f"{section}.{key}[{i}]") if isinstance(v, str) else v
                         for i, v in enumerate(value)]
        elif isinstance(value, str):
            node[key] = resolve(value)
        elif isinstance(value, list) and (section, key) in _PATH_LIST_KEYS:
            node[key] = [resolve(v) if isinstance(v, str) else v for v in value]
