"""Build optimizers and LR schedulers from a params file's ``optimizer`` block (the vendor's porting and custom optimizer guides).

Names resolve case-insensitively over every subclass of :class:`~cs_run.optim.Optimizer` (or
:class:`~cs_run.optim.lr_scheduler.LRScheduler`) defined anywhere, so a user's class works by name
once its module is imported. Model Zoo spellings of keys are accepted; anything else unknown is a
:class:`~cs_run.errors.ParamsError` that lists the valid choices.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from cs_run.errors import ParamsError

from . import lr_scheduler as _lrs
from . import scheduler as _s
from . import weight_decay_scheduler as _wds
from .optimizer import Optimizer
from .parallel_schedulers import ParallelSchedulers
from .param_groups import configure_param_groups

logger = logging.getLogger(__name__)

__all__ = ["OptimizerBlock", "configure_from_params", "configure_lr_scheduler", "configure_optimizer",
           "configure_schedulers", "resolve_optimizer_class", "resolve_scheduler_class", "split_optimizer_block"]

# Model Zoo key -> constructor argument. Applied only when the class takes the target and not the key.
_OPTIMIZER_ALIASES = {"learning_rate": "lr", "weight_decay_rate": "weight_decay", "epsilon": "eps"}
_PAIRED_ALIASES = {"betas": ("beta1", "beta2"), "eps": ("eps1", "eps2"), "etas": ("eta1", "eta2"),
                   "step_sizes": ("step_size_min", "step_size_max")}
_SCHEDULER_ALIASES = {
    "steps": "total_iters", "decay_steps": "total_iters", "learning_rate": "initial_learning_rate",
    "initial_lr": "initial_learning_rate", "end_lr": "end_learning_rate", "values": "learning_rates",
    "boundaries": "milestones", "decay_rate": "gamma",
}
_SCHEDULER_TARGET_ALIASES = {"learning_rate": ("initial_learning_rate", "lr", "value")}


def _all_subclasses(base: type) -> list[type]:
    found, todo = [], list(base.__subclasses__())
    while todo:
        cls = todo.pop(0)
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def _did_you_mean(name: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unknown_class(where: str, name: Any, table: dict[str, type]) -> ParamsError:
    """The error for a class name ``table`` (lower-case name -> class) lacks: the known names, a close one."""
    names = sorted({c.__name__ for c in table.values()}, key=str.lower)
    return ParamsError(f"{where}: unknown {name!r}; expected one of {', '.join(names)}{_did_you_mean(str(name), names)}")


def resolve_optimizer_class(optimizer_type: str, where: str = "optimizer.optimizer_type") -> type[Optimizer]:
    """The Optimizer subclass named ``optimizer_type`` (any case; the latest definition wins)."""
    table = {cls.__name__.lower(): cls for cls in _all_subclasses(Optimizer) if not inspect.isabstract(cls)}
    cls = table.get(str(optimizer_type).lower())
    if cls is None:
        raise _unknown_class(where, optimizer_type, table)
    return cls


_LR_ONLY = (_lrs.LRScheduler,)
_ANY_KEY = (_lrs.LRScheduler, _wds.WeightDecayScheduler)
"""The scheduler families a name resolves in: an lr schedule (``learning_rate``), or either (the trainer's
``schedulers`` list, whose entries the vendor reads as LR or weight-decay schedulers)."""


def resolve_scheduler_class(name: str, where: str = "learning_rate.scheduler",
                            families: tuple[type, ...] = _LR_ONLY) -> type[_s.Scheduler]:
    """The scheduler subclass of ``families`` named ``name`` (LRScheduler by default); the ``LR`` suffix
    of an lr schedule is optional ("CosineDecay")."""
    table: dict[str, type] = {}
    for family in families:
        for cls in _all_subclasses(family):
            if not inspect.isabstract(cls):
                table[cls.__name__.lower()] = cls
    if _lrs.LRScheduler in families:
        table.setdefault("chainedscheduler", _lrs.ChainedLR)
    key = str(name).lower()
    cls = table.get(key) or (table.get(key + "lr") if _lrs.LRScheduler in families else None)
    if cls is None:
        raise _unknown_class(where, name, table)
    return cls


def _family(cls: type) -> tuple[type, ...]:
    """The family the schedules nested in ``cls`` come from: its own (an LR sequence holds LR schedules)."""
    return (_wds.WeightDecayScheduler,) if issubclass(cls, _wds.WeightDecayScheduler) else _LR_ONLY


def _coerce(value: Any, default: Any) -> Any:
    """YAML reads ``1e-3`` as a string and tuples as lists: convert where the default says so."""
    if isinstance(value, str) and isinstance(default, (int, float)) and not isinstance(default, bool):
        try:
            return float(value)
        except ValueError:
            return value
    if isinstance(value, list) and isinstance(default, tuple):
        return tuple(value)
    return value


def _match_kwargs(cls: type, skip: int, given: dict[str, Any], aliases: dict[str, str],
                  where: str) -> tuple[dict[str, Any], dict[str, inspect.Parameter]]:
    """Map ``given`` keys onto ``cls.__init__``'s parameters (exact, any case, or an alias)."""
    params = dict(list(inspect.signature(cls.__init__).parameters.items())[skip:])
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = {n: p for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    lower = {n.lower(): n for n in named}
    kwargs: dict[str, Any] = {}
    for key, value in given.items():
        target = key if key in named else lower.get(str(key).lower()) or aliases.get(key)
        if target not in named:
            if takes_any:
                kwargs[key] = value
                continue
            raise ParamsError(f"{where}.{key}: unknown key for {cls.__name__}; expected one of "
                              f"{', '.join(named)}{_did_you_mean(str(key), named)}")
        coerced = _coerce(value, named[target].default)
        if target in kwargs and kwargs[target] != coerced:  # one value twice (R_1.7's steps and decay_steps): one
            raise ParamsError(f"{where}.{key}: {target!r} is given twice with different values (as {key!r} and "
                              f"another spelling: {coerced!r} and {kwargs[target]!r}); keep one")
        kwargs[target] = coerced
    return kwargs, named


def _merge_pairs(kwargs: dict[str, Any], named: Any) -> None:
    """beta1/beta2 -> betas (the missing half from the default), and the other pairs alike."""
    for target, (first, second) in _PAIRED_ALIASES.items():
        if target not in named or (first not in kwargs and second not in kwargs) or first in named:
            continue
        default = named[target].default
        pair = list(default) if isinstance(default, (tuple, list)) else [None, None]
        for index, key in enumerate((first, second)):
            if key in kwargs:
                pair[index] = _coerce(kwargs.pop(key), 0.0)
        kwargs[target] = tuple(pair)


def configure_optimizer(optimizer_type: str, params: Any, **kwargs: Any) -> Optimizer:
    """Build the optimizer named ``optimizer_type`` (any case, user subclasses included) on ``params``.

    Args:
        optimizer_type: class name, e.g. "AdamW", "sgd", or a user's ``MyOptimizer``.
        params: model parameters or param groups.
        **kwargs: constructor arguments; Model Zoo spellings (learning_rate, weight_decay_rate,
            beta1/beta2, eps1/eps2, ...) are accepted. Without an lr the class default (or 0.0) is
            used: the LR scheduler sets the real value when it is built.

    Raises:
        ParamsError: unknown name, unknown or duplicate key, or a value the class rejects.
    """
    cls = resolve_optimizer_class(optimizer_type)
    signature = inspect.signature(cls.__init__).parameters
    _merge_pairs(kwargs, signature)
    kwargs, named = _match_kwargs(cls, 2, kwargs, _OPTIMIZER_ALIASES, "optimizer")
    if "lr" in named and "lr" not in kwargs and named["lr"].default is inspect.Parameter.empty:
        kwargs["lr"] = 0.0  # placeholder: configure_lr_scheduler writes the scheduled value
    try:
        return cls(params, **kwargs)
    except (ValueError, TypeError) as err:
        if isinstance(err, ParamsError):
            raise
        raise ParamsError(f"optimizer: {cls.__name__}: {err}") from err


def _unpack_entry(entry: Any, where: str) -> tuple[Any, dict[str, Any], str, str]:
    """A schedule entry's name, its arguments (a new dict), and the key paths of the arguments and the name.

    Two spellings exist: a params file's ``{scheduler: LinearLR, total_iters: 10}`` and the Model Zoo
    2.x trainer form's ``{LinearLR: {total_iters: 10}}`` (one key, the class name; the key path of its
    arguments is ``where.LinearLR``).
    """
    if not isinstance(entry, dict):
        raise ParamsError(f"{where}: expected a number or a mapping with 'scheduler', got {type(entry).__name__}")
    if "scheduler" not in entry and len(entry) == 1:
        (name, arguments), = entry.items()
        if arguments is None or isinstance(arguments, dict):
            return name, dict(arguments or {}), f"{where}.{name}", f"{where}.{name}"
    if "scheduler" not in entry:
        raise ParamsError(f"{where}.scheduler: missing; name the schedule, e.g. CosineDecayLR")
    arguments = dict(entry)
    return arguments.pop("scheduler"), arguments, where, f"{where}.scheduler"


def _milestones(entries: list[Any], where: str, key: str = "schedulers") -> list[int]:
    """The vendor's SequentialLR milestones: the running sum of every sub-schedule's ``total_iters`` but
    the last's (Model Zoo 2.10 ``trainer/validate.py``, ``compute_milestones``)."""
    milestones, total = [], 0
    for index, entry in enumerate(entries[:-1]):
        _, unpacked, path, _ = _unpack_entry(entry, f"{where}{key}[{index}]" if key else f"{where}[{index}]")
        iters = _total_iters(unpacked)
        if not isinstance(iters, int) or isinstance(iters, bool) or iters <= 0:
            raise ParamsError(f"{path}.total_iters: {'missing' if iters is None else repr(iters)}; every scheduler "
                              "but the last needs a positive integer total_iters in a SequentialLR (the milestones "
                              "are their running sum)")
        total += iters
        milestones.append(total)
    return milestones


def _nested(optimizer: torch.optim.Optimizer, cls: type, entry: dict[str, Any], where: str) -> None:
    """Build the schedules inside ``entry`` in place: a Sequential / Chained schedule's ``schedulers`` (with
    the milestones derived as the vendor derives them, and its ``param_group_tags`` handed to each, as the
    vendor's ``trainer/validate.py`` does) and ScalePerParam's ``scheduler``."""
    family = _family(cls)
    if issubclass(cls, _s.ScalePerParamScheduler) and "scheduler" in entry:
        entry["scheduler"] = _build_scheduler(optimizer, entry["scheduler"], f"{where}.scheduler", families=family)
        return
    children = entry.get("schedulers")
    if not isinstance(children, (list, tuple)) or not issubclass(cls, (_s.SequentialScheduler, _s.ChainedScheduler)):
        return
    if not children:
        raise ParamsError(f"{where}.schedulers: empty; list the schedules of the {cls.__name__}")
    if entry.get("param_group_tags") is not None:
        children = [_with_tags(child, entry["param_group_tags"], f"{where}.schedulers[{index}]", cls)
                    for index, child in enumerate(children)]
    sequential = issubclass(cls, _s.SequentialScheduler)
    if sequential:
        derived = _milestones(list(children), f"{where}.")
        given = entry.get("milestones")
        if given is None:
            entry["milestones"] = derived
        elif list(given) != derived:
            raise ParamsError(f"{where}.milestones: {list(given)} but the schedules' total_iters give {derived}; "
                              "drop milestones (they are derived) or make them agree")
    entry["schedulers"] = [_build_scheduler(optimizer, child, f"{where}.schedulers[{index}]", in_sequence=sequential,
                                            families=family)
                           for index, child in enumerate(children)]


def _with_tags(child: Any, tags: Any, where: str, parent: type) -> Any:
    """``child`` (an entry of a nested ``schedulers``) with its parent's ``param_group_tags``; a child that
    names its own is refused, as the vendor refuses it."""
    name, arguments, path, _ = _unpack_entry(child, where)
    if "param_group_tags" in arguments:
        raise ParamsError(f"{path}.param_group_tags: a schedule inside {parent.__name__} takes its "
                          f"param_group_tags from the {parent.__name__}; remove it here")
    arguments["param_group_tags"] = tags
    return {name: arguments} if "scheduler" not in child else {**arguments, "scheduler": name}


def _build_scheduler(optimizer: torch.optim.Optimizer, entry: Any, where: str, in_sequence: bool = False,
                     families: tuple[type, ...] = _LR_ONLY) -> _s.Scheduler:
    name, entry, where, name_where = _unpack_entry(entry, where)
    cls = resolve_scheduler_class(name, name_where, families)
    if cls is _lrs.LinearLR and "alpha" in entry:
        # The Model Zoo GPT-2 files put alpha (a cosine decay's floor) on a Linear phase; the Model Zoo's
        # Linear schedule never reads it, so it is logged and dropped rather than refused.
        alpha = entry.pop("alpha")
        if f"{where}.alpha" not in _LOGGED:
            _LOGGED.add(f"{where}.alpha")
            logger.info("%s.alpha=%s: no effect on a Linear schedule (the Model Zoo ignores it too)", where, alpha)
    params = inspect.signature(cls.__init__).parameters
    if in_sequence and "total_iters" not in params:  # the phase length of a SequentialLR entry only
        for key in ("total_iters", "steps", "decay_steps"):
            entry.pop(key, None)
    _nested(optimizer, cls, entry, where)
    aliases = {k: v for k, v in _SCHEDULER_ALIASES.items() if v in params and k not in params}
    if "learning_rate" in params:  # ConstantLR's own key: accept the other spellings for it
        aliases.update({alt: "learning_rate" for alt in _SCHEDULER_TARGET_ALIASES["learning_rate"]})
    takes_optimizer = "optimizer" in params
    kwargs, named = _match_kwargs(cls, 2 if list(params)[1:2] == ["optimizer"] else 1, entry, aliases, where)
    named.pop("optimizer", None)
    missing = [n for n, p in named.items() if p.default is inspect.Parameter.empty and n not in kwargs]
    if missing:
        raise ParamsError(f"{where}.{missing[0]}: missing (required by {cls.__name__}; it takes "
                          f"{', '.join(named)})")
    if takes_optimizer:
        kwargs["optimizer"] = optimizer
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as err:
        message = str(err).removeprefix(f"{cls.__name__}: ")  # the class's own messages may name it already
        named = where.endswith(f".{name}")  # the trainer form's key path ends with the class name
        raise ParamsError(f"{where}: {message}" if named else f"{where}: {cls.__name__}: {message}") from err


def _total_iters(entry: dict[str, Any]) -> Any:
    for key in ("total_iters", "steps", "decay_steps"):
        if key in entry:
            return entry[key]
    return None


def configure_lr_scheduler(optimizer: torch.optim.Optimizer, learning_rate: Any,
                           where: str = "learning_rate") -> _lrs.LRScheduler | None:
    """Build the schedule of a params file's ``optimizer.learning_rate`` (the vendor's cstorch porting guide).

    * a number: ConstantLR with that value;
    * a mapping with ``scheduler`` (any case, ``LR`` suffix optional) and its arguments, or the Model Zoo
      2.x form ``{SchedulerName: {arguments}}``; SequentialLR, ChainedLR and ScalePerParamLR take their
      schedules in either form, and a SequentialLR without ``milestones`` switches at the running sum of
      its schedules' ``total_iters`` (the vendor's rule);
    * a list of mappings: SequentialLR switching at the cumulative ``total_iters`` of every entry but
      the last, or ChainedLR when an entry says ``main_scheduler: ChainedLR``.

    When a param group carries ``adjust_learning_rate`` (muP groups of :func:`configure_param_groups`)
    the schedule is wrapped in ScalePerParamLR unless it is one, as the Model Zoo 2.10 trainer does.

    Returns None when ``learning_rate`` is None. Raises ParamsError naming the entry and key (``where``
    is the key path of ``learning_rate`` in messages).
    """
    scheduler = _configure(optimizer, learning_rate, where)
    if scheduler is not None and not isinstance(scheduler, _lrs.ScalePerParamLR) \
            and any("adjust_learning_rate" in group for group in optimizer.param_groups):
        scheduler = _lrs.ScalePerParamLR(optimizer, scheduler)
    return scheduler


def configure_schedulers(optimizer: torch.optim.Optimizer, entries: Any,
                         where: str = "schedulers") -> ParallelSchedulers:
    """Build the Model Zoo trainer's ``schedulers`` list (2.10 ``trainer/utils.py``): every entry its own
    schedule, side by side, not one sequence.

    Each entry is ``{SchedulerName: {arguments}}`` naming an LR scheduler (``SequentialLR``, ``CosineDecayLR``,
    ...) or a weight-decay scheduler (``CosineDecayWD``, ...), usually with ``param_group_tags`` (the tags of
    the optimizer's ``params`` groups it sets; a Sequential / Chained schedule hands its tags to the schedules
    inside it). An LR schedule is wrapped in ScalePerParamLR when a group carries ``adjust_learning_rate``,
    as the vendor does. The schedules must not overlap (:class:`~.parallel_schedulers.ParallelSchedulers`).

    Raises:
        ParamsError: naming the entry and key (``where`` is the list's key path).
    """
    if not isinstance(entries, (list, tuple)) or not entries:
        raise ParamsError(f"{where}: expected a non-empty list of '<SchedulerName>: {{...}}', got {entries!r}")
    built, names = [], []
    for index, entry in enumerate(copy.deepcopy(list(entries))):
        path = f"{where}[{index}]"
        if not isinstance(entry, dict) or len(entry) != 1 or not isinstance(next(iter(entry.values())), (dict, type(None))):
            raise ParamsError(f"{path}: expected one mapping '<SchedulerName>: {{...}}', got {entry!r}")
        scheduler = _build_scheduler(optimizer, entry, path, families=_ANY_KEY)
        if isinstance(scheduler, _lrs.LRScheduler) and not isinstance(scheduler, _lrs.ScalePerParamLR) \
                and any("adjust_learning_rate" in group for group in optimizer.param_groups):
            scheduler = _lrs.ScalePerParamLR(optimizer, scheduler, param_group_tags=scheduler.param_group_tags)
        built.append(scheduler)
        names.append(f"{path.removeprefix('params: ')}.{next(iter(entry))}")
    try:
        return ParallelSchedulers(built, names)
    except ValueError as err:
        raise ParamsError(f"{where}: {err}") from err


def _configure(optimizer: torch.optim.Optimizer, learning_rate: Any, where: str) -> _lrs.LRScheduler | None:
    if learning_rate is None:
        return None
    if isinstance(learning_rate, bool):
        raise ParamsError(f"{where}: expected a number, a mapping or a list, got a bool")
    if isinstance(learning_rate, (int, float, str)):
        try:
            value = float(learning_rate)
        except ValueError:
            raise ParamsError(f"{where}: {learning_rate!r} is not a number") from None
        return _lrs.ConstantLR(optimizer, learning_rate=value)
    if isinstance(learning_rate, dict):
        entry = dict(learning_rate)
        entry.pop("main_scheduler", None)
        return _build_scheduler(optimizer, copy.deepcopy(entry), where)
    if not isinstance(learning_rate, (list, tuple)) or not learning_rate:
        raise ParamsError(f"{where}: expected a number, a mapping or a non-empty list, got {learning_rate!r}")
    return _configure_list(optimizer, copy.deepcopy(list(learning_rate)), where)


def _configure_list(optimizer: torch.optim.Optimizer, entries: list[Any], where: str) -> _lrs.LRScheduler:
    mains = set()
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ParamsError(f"{where}[{index}]: expected a mapping with 'scheduler', got {entry!r}")
        if "main_scheduler" in entry:
            mains.add(str(entry.pop("main_scheduler")).lower().removesuffix("lr").removesuffix("scheduler"))
    if len(mains) > 1 or not mains <= {"chained", "sequential"}:
        raise ParamsError(f"{where}: main_scheduler must be one of ChainedLR, SequentialLR (one value), "
                          f"got {sorted(mains)}")
    schedulers = [_build_scheduler(optimizer, e, f"{where}[{i}]", in_sequence=mains != {"chained"})
                  for i, e in enumerate(entries)]
    if mains == {"chained"}:
        return _lrs.ChainedLR(schedulers)
    if len(schedulers) == 1:
        return schedulers[0]
    return _lrs.SequentialLR(optimizer, schedulers, _milestones(entries, where, key=""))


# ------------------------------------------------------------------ the Model Zoo ``optimizer:`` block

STEP_KEYS = ("grad_accum_steps", "max_gradient_norm", "max_gradient_value", "loss_scaling_factor",
             "initial_loss_scale", "steps_per_increase", "min_loss_scale", "max_loss_scale", "overflow_tolerance",
             "log_summaries")
"""Block keys that configure the training step (accumulation, clipping, loss scaling, summaries), not the
optimizer class: the runner's and the GradScaler's business."""
PARAM_GROUP_KEYS = ("adjust_learning_rate", "params")
"""Block keys that split the model's parameters into groups (the vendor's ``configure_param_groups``)."""
RECORDED_KEYS = {
    "disable_lr_steps_reset": "R_1.x appliance LR-step bookkeeping; schedules here always count global steps",
    "ws_summary": "weight-streaming appliance summaries",
    "use_bias_correction": "read by no Model Zoo code (AdamW's bias correction is correct_bias, on by default)",
}
"""Block keys that configure only the vendor's appliance: accepted, logged once, no effect here."""


@dataclass
class OptimizerBlock:
    """A Model Zoo ``optimizer:`` block split by meaning (see :func:`split_optimizer_block`)."""

    optimizer_type: str
    """Class name (any case)."""
    learning_rate: Any
    """A number, a schedule mapping or a list of them (:func:`configure_lr_scheduler`)."""
    schedulers: Any = None
    """The trainer form's side-by-side schedules (:func:`configure_schedulers`), instead of learning_rate."""
    kwargs: dict = field(default_factory=dict)
    """Constructor arguments, Model Zoo spellings included (beta1/beta2, epsilon, weight_decay_rate, ...)."""
    step: dict = field(default_factory=dict)
    """:data:`STEP_KEYS` present in the block."""
    param_groups: dict = field(default_factory=dict)
    """:data:`PARAM_GROUP_KEYS` present in the block."""
    recorded: dict = field(default_factory=dict)
    """:data:`RECORDED_KEYS` present in the block (no effect here)."""


def split_optimizer_block(block: dict, where: str = "optimizer") -> OptimizerBlock:
    """Split a Model Zoo ``optimizer:`` block into class, schedule, constructor, step and group keys.

    Every other key is a constructor argument; it is checked when the optimizer is built, so an
    unknown one fails there with the valid choices.

    Raises:
        ParamsError: not a mapping, or optimizer_type / learning_rate missing.
    """
    if not isinstance(block, dict):
        raise ParamsError(f"{where}: expected a mapping, got {type(block).__name__}")
    rest = dict(block)
    if "optimizer_type" not in rest:
        raise ParamsError(f"{where}.optimizer_type: missing; name the optimizer class, e.g. AdamW")
    out = OptimizerBlock(optimizer_type=rest.pop("optimizer_type"), learning_rate=rest.pop("learning_rate", None),
                         schedulers=rest.pop("schedulers", None))
    for key in list(rest):
        if key in STEP_KEYS:
            out.step[key] = rest.pop(key)
        elif key in PARAM_GROUP_KEYS:
            out.param_groups[key] = rest.pop(key)
        elif key in RECORDED_KEYS:
            out.recorded[key] = rest.pop(key)
    out.kwargs = rest
    return out


_LOGGED: set[str] = set()


def configure_from_params(block: dict, model: torch.nn.Module, where: str = "optimizer"
                          ) -> tuple[Optimizer, _lrs.LRScheduler | None, dict]:
    """Optimizer and LR schedule of a Model Zoo ``optimizer:`` block, as the Model Zoo builds them.

    Returns ``(optimizer, lr_scheduler or None, step)`` (the schedule: ParallelSchedulers with ``schedulers``)
    where ``step`` holds the block's
    :data:`STEP_KEYS` for the runner / GradScaler. Appliance-only keys are logged once.
    Param-group keys (adjust_learning_rate, params) go through :func:`configure_param_groups`.
    """
    parts = split_optimizer_block(block, where)
    for key in parts.recorded:
        if key not in _LOGGED:
            _LOGGED.add(key)
            logger.info("%s.%s: recorded, no effect here (%s)", where, key, RECORDED_KEYS[key])
    params: Any = [p for p in model.parameters() if p.requires_grad]
    if parts.param_groups:  # the vendor's grouping: weight decay, adjust_learning_rate, tagged params
        params = configure_param_groups(model, {**parts.param_groups, **parts.kwargs})
    kwargs = dict(parts.kwargs)
    if parts.learning_rate is not None and isinstance(parts.learning_rate, (int, float, str)) \
            and not isinstance(parts.learning_rate, bool):
        kwargs.setdefault("learning_rate", parts.learning_rate)
    optimizer = configure_optimizer(parts.optimizer_type, params, **kwargs)
    if parts.schedulers is not None:
        return optimizer, configure_schedulers(optimizer, parts.schedulers, f"{where}.schedulers"), parts.step
    return optimizer, configure_lr_scheduler(optimizer, parts.learning_rate), parts.step
