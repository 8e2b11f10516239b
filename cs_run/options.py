"""The run options, declared once and rendered for every front door.

:class:`cs_run.params.RunConfig` (which embeds :class:`cs_run.distributed.ClusterOptions`) is the one
declaration: each field's type, range, choices and the docstring under it. A field whose metadata has
``flag`` is a run-script flag; :func:`run_options` describes those flags, from which ``cs-run``'s click
options (cs_run/cli.py) and the Model Zoo run.py argparse options (cs_run/modelzoo.py) are built, and
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

from cs_run.distributed import ClusterOptions
from cs_run.params import RunConfig

__all__ = ["RunOption", "run_options", "flag_overrides", "trainer_keys", "cluster_keys", "field_docs"]


@dataclass(frozen=True)
class RunOption:
    """One runconfig key that is also a flag (``--name``)."""

    name: str
    kind: str
    """"int", "str", "choice", "bool" (a switch) or "list" (the flag repeated / given several values)."""
    help: str
    cli: bool = True
    """Also a ``cs-run`` flag (compile_only / validate_only are ``cs-run`` subcommands instead)."""
    short: Optional[str] = None
    minimum: Optional[int] = None
    choices: tuple = ()
    path: Optional[str] = None
    """"dir" or "file" for a local path, made absolute against the current folder when given."""
    metavar: Optional[str] = None


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
    """Every flag-marked RunConfig field, in declaration order (RunConfig's own fields, then the cluster's)."""
    hints = typing.get_type_hints(RunConfig)
    docs = field_docs(RunConfig)
    own = [f for f in dataclasses.fields(RunConfig) if f.name not in cluster_keys()]
    cluster = [f for f in dataclasses.fields(RunConfig) if f.name in cluster_keys()]
    out = []
    for f in own + cluster:
        flag = f.metadata.get("flag")
        if flag is None:
            continue
        out.append(RunOption(name=f.name, kind=_kind(hints[f.name], f.metadata), help=docs.get(f.name, ""),
                             cli=flag.get("cli", True), short=flag.get("short"), minimum=f.metadata.get("min"),
                             choices=tuple(f.metadata.get("choices", ())), path=flag.get("path"),
                             metavar=flag.get("metavar")))
    return tuple(out)


@functools.cache
def cluster_keys() -> tuple[str, ...]:
    """The runconfig keys that configure the cluster (ClusterOptions' fields)."""
    return tuple(f.name for f in dataclasses.fields(ClusterOptions))


def flag_overrides(values: typing.Mapping[str, Any]) -> dict[str, Any]:
    """The flags the user gave (CLI or run.py) as ``runconfig.KEY`` overrides.

    Local paths are made absolute against the current folder, repeated flags become lists. A flag the
    user did not give (None, empty) is left out, so it overrides neither the file nor a ``--set``.
    """
    out: dict[str, Any] = {}
    for option in run_options():
        value = values.get(option.name)
        if value is None or (option.kind == "list" and not value):
            continue
        if option.kind == "list":
            value = [_absolute(v) if option.path else str(v) for v in value]
        elif option.path:
            value = _absolute(value)
        out[f"runconfig.{option.name}"] = value
    return out


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
