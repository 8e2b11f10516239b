"""The run options, declared once and rendered for every front door.

:class:`cs_run.params.RunConfig` (which embeds :class:`cs_run.distributed.ClusterOptions`) is the one
declaration: each field's type, range, choices and the docstring under it. A field whose metadata has
``flag`` is a run-script flag; :func:`run_options` describes those flags, from which ``cs-run``'s click
options (cs_run/frontends/cli.py) and the Model Zoo run.py argparse options (cs_run/frontends/modelzoo.py) are built, and
:func:`flag_overrides` turns the given flags into runconfig overrides. A field whose metadata has
``trainer`` is a key of that Trainer argument (``loop``, ``checkpoint``, ``logging``): :func:`trainer_keys`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from cs_run.cluster_config import ClusterOptions
from cs_run.errors import ParamsError
from cs_run.params import REMOVE, RunConfig

__all__ = ["RunOption", "USES", "COMMAND_USES", "EXTRA_OPTIONS", "run_options", "command_options", "flag_overrides",
           "flag_names", "resume_overrides", "trainer_keys", "cluster_keys", "field_docs"]


USES = ("train", "eval", "eval_all", "trace")
"""What a run command does; a flag's ``uses`` (field metadata ``flag: {"uses": (...)}``, default all) say
which of these it changes, and a command takes exactly the flags that change something it does."""

COMMAND_USES = {"train": ("train",), "eval": ("eval",), "train-and-eval": ("train", "eval"),
                "eval-all": ("eval_all",), "validate-only": ("trace",), "compile-only": ("trace",)}
"""The ``cs-run`` run commands and what each does (run.py's single ``--mode`` parser takes every flag)."""


@dataclass(frozen=True)
class RunOption:
    """One flag: a runconfig key (``--name``), or one of the few flags that are not a key (``resume``,
    ``print_config``, declared in :data:`EXTRA_OPTIONS`)."""

    name: str
    kind: str
    """"int", "str", "choice", "bool" (a switch) or "list" (the flag repeated / given several values)."""
    help: str
    key: Optional[str] = None
    """The runconfig key it sets (None: a flag that is not a key)."""
    cli: bool = True
    """Also a ``cs-run`` flag (compile_only / validate_only are ``cs-run`` subcommands instead)."""
    run_py: bool = True
    """Also a Model Zoo run.py flag."""
    short: Optional[str] = None
    """The Model Zoo run scripts' short spelling (run.py only: ``cs-run`` spells run flags out, so a short
    option means one thing across all its commands, e.g. ``-o`` is ``plot --output``)."""
    minimum: Optional[int] = None
    maximum: Optional[int] = None
    choices: tuple = ()
    path: Optional[str] = None
    """"dir", "file" or "checkpoint" (a file or a sharded checkpoint's folder) for a local path, made absolute
    against the current folder when given."""
    metavar: Optional[str] = None
    uses: tuple = USES
    """The run commands' jobs (:data:`USES`) it changes; ``cs-run`` commands without them refuse it."""
    default: Any = None
    """The runconfig key's default: the value when neither the flag nor the params file gives one."""
    appliance_only: bool = False
    """It configures only the vendor's appliance (checked and recorded; changes nothing here)."""

    @property
    def dest(self) -> str:
        """The Python name of its value (a flag's declared spelling, ``print_config``)."""
        return self.name.replace("-", "_")


EXTRA_OPTIONS = (
    RunOption(name="resume", kind="str", metavar="auto|none|PATH", uses=("train",),
              help="Where training starts: auto (the newest checkpoint in model_dir, the default), none (fresh "
                   "weights; model_dir's checkpoints are left alone) or a checkpoint file (runconfig "
                   "autoload_checkpoint / checkpoint_path)."),
    RunOption(name="print_config", kind="bool", run_py=False,
              help="Print the resolved params (file, --set and flags applied, defaults filled in) as YAML and "
                   "exit without running."),
)
"""The flags that are not one runconfig key each."""


def command_options(command: str) -> tuple[RunOption, ...]:
    """The flags of one ``cs-run`` run command (:data:`COMMAND_USES`), in declaration order."""
    uses = set(COMMAND_USES[command])
    return tuple(option for option in run_options() if option.cli and uses & set(option.uses))


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (and of its dataclass bases), as one line."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).replace("``", "").split())
    return docs


def _kind(hint: Any, meta: typing.Mapping) -> str:
    if "choices" in meta:
        return "choice"
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # Optional[X] -> X
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return {int: "int", bool: "bool", list: "list"}.get(typing.get_origin(hint) or hint, "str")


@functools.cache
def run_options() -> tuple[RunOption, ...]:
    """Every flag: the flag-marked RunConfig fields in declaration order (its own, then the cluster's),
    then :data:`EXTRA_OPTIONS`."""
    hints = typing.get_type_hints(RunConfig)
    docs = field_docs(RunConfig)
    own = [f for f in dataclasses.fields(RunConfig) if f.name not in cluster_keys()]
    cluster = [f for f in dataclasses.fields(RunConfig) if f.name in cluster_keys()]
    out = []
    for f in own + cluster:
        flag = f.metadata.get("flag")
        if flag is None:
            continue
        out.append(RunOption(name=f.name, key=f.name, kind=_kind(hints[f.name], f.metadata), help=docs.get(f.name, ""),
                             cli=flag.get("cli", True), short=flag.get("short"), minimum=f.metadata.get("min"),
                             maximum=f.metadata.get("max"), choices=tuple(f.metadata.get("choices", ())),
                             path=flag.get("path"), metavar=flag.get("metavar"), uses=tuple(flag.get("uses", USES)),
                             default=tuple(f.default_factory()) if f.default is dataclasses.MISSING else f.default,
                             appliance_only=f.metadata.get("appliance_only", False)))
    return tuple(out) + EXTRA_OPTIONS


@functools.cache
def cluster_keys() -> tuple[str, ...]:
    """The runconfig keys that configure the cluster (ClusterOptions' fields)."""
    return tuple(f.name for f in dataclasses.fields(ClusterOptions))


def flag_overrides(values: typing.Mapping[str, Any]) -> dict[str, Any]:
    """The flags the user gave (CLI or run.py) as ``runconfig.KEY`` overrides.

    Local paths are made absolute against the current folder, repeated flags become lists. A flag the
    user did not give (None, empty) is left out, so it overrides neither the file nor a ``--set``.

    Raises:
        ParamsError: ``--resume`` together with ``--checkpoint_path`` (two answers to one question).
    """
    out: dict[str, Any] = {}
    for option in run_options():
        value = values.get(option.dest)
        if option.key is None or value is None or (option.kind == "list" and not value):
            continue
        if option.path and any(isinstance(v, str) and not v.strip() for v in (value if option.kind == "list"
                                                                                else [value])):
            raise ParamsError(f"--{option.name}: an empty path (it would be the current folder); give a name")
        if option.kind == "list":
            value = [_absolute(v) if option.path else str(v) for v in value]
        elif option.path:
            value = _absolute(value)
        out[f"runconfig.{option.key}"] = value
    resume = values.get("resume")
    if resume is not None:
        if "runconfig.checkpoint_path" in out:
            raise ParamsError("--resume and --checkpoint_path: give one of them (--resume PATH starts from PATH)")
        out.update(resume_overrides(resume))
    return out


def flag_names(values: typing.Mapping[str, Any]) -> dict[str, str]:
    """``{runconfig key path: "--flag"}`` of the flags the user gave (what :func:`flag_overrides` set from
    them), so a message about a value can name the flag it came from (``--resume`` for checkpoint_path)."""
    names = {f"runconfig.{option.key}": f"--{option.name}" for option in run_options()
             if option.key is not None and values.get(option.dest) not in (None, (), [])}
    resume = values.get("resume")
    if resume is not None:
        names.update({key: "--resume" for key, value in resume_overrides(resume).items() if value is not REMOVE})
    return names


def resume_overrides(value: str) -> dict[str, Any]:
    """``--resume auto|none|PATH`` as runconfig overrides: auto resumes from the newest checkpoint in
    model_dir, none starts fresh, a path starts from that checkpoint (the file's checkpoint_path goes)."""
    choice = str(value).strip()
    if choice.lower() == "auto":
        return {"runconfig.autoload_checkpoint": True, "runconfig.checkpoint_path": REMOVE}
    if choice.lower() == "none":
        return {"runconfig.autoload_checkpoint": False, "runconfig.checkpoint_path": REMOVE}
    if not choice:
        raise ParamsError("--resume: expected auto, none or a checkpoint file, got ''")
    return {"runconfig.checkpoint_path": _absolute(choice)}


def _absolute(value: Any) -> str:
    return str(Path(value).expanduser().resolve())


@functools.cache
def trainer_keys(argument: str) -> dict[str, str]:
    """``{Trainer key: runconfig key}`` of one Trainer argument ("loop", "checkpoint", "logging")."""
    out = {}
    for f in dataclasses.fields(RunConfig):
        spec = f.metadata.get("trainer")
        group, key = (spec, f.name) if isinstance(spec, str) else (spec or (None, None))
        if group == argument:
            out[key] = f.name
    return out
