"""model_dir/runs/<timestamp>.yaml: what each invocation was and how it ended.

One file per ``run()``: cs-run / torch / Python versions, the command line, the params file and the keys
set on the command line, the mode and device, the run id of the scalars it writes (their ``run``
column); at the end the outcome (completed, interrupted, aborted, failed, with its message) and the
global steps it covered. Written at the start and rewritten at the end, each time atomically, so a
killed run leaves its start record.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import logging
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any, Optional

import torch
import yaml

from cs_run.params import Params
from cs_run.summaries import RUN_ID

__all__ = ["RUNS_DIR", "RunRecord"]

RUNS_DIR = "runs"
logger = logging.getLogger("cs_run.runners")


def _version() -> str:
    try:
        return importlib.metadata.version("cs-run")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _lookup(tree: dict, dotted: str) -> Any:
    node: Any = tree
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _command() -> str:
    argv = list(sys.argv) or [""]
    return shlex.join([Path(argv[0]).name, *argv[1:]])


class RunRecord:
    """The record of one invocation; :meth:`finish` completes it."""

    def __init__(self, model_dir: Path, params: Params, mode: str, device: str) -> None:
        now = datetime.datetime.now().astimezone()
        folder = Path(model_dir) / RUNS_DIR
        stem = now.strftime("%Y%m%d-%H%M%S")
        path, n = folder / f"{stem}.yaml", 1
        while path.exists():  # two runs in one second (the model_dir lock makes this race-free)
            n += 1
            path = folder / f"{stem}_{n:03d}.yaml"  # sorts after {stem}.yaml
        resolved = params.to_dict()
        self.path = path
        self.data: dict[str, Any] = {
            "cs_run": _version(), "torch": str(torch.__version__), "python": platform.python_version(),
            "host": platform.node(), "pid": os.getpid(), "run_id": RUN_ID,  # the scalars CSVs' run column
            "started": now.isoformat(timespec="seconds"),
            "command": _command(), "cwd": os.getcwd(), "mode": mode, "device": device,
            "params_file": params.source,
            "overrides": {key: _lookup(resolved, key) for key in sorted(params.overridden)},
        }
        self._write()

    def finish(self, outcome: str, *, first_step: Optional[int], last_step: int, message: str = "") -> None:
        """``outcome``: completed, interrupted, aborted or failed; ``message``: what the console said."""
        self.data.update(ended=datetime.datetime.now().astimezone().isoformat(timespec="seconds"), outcome=outcome,
                         first_step=first_step, last_step=last_step)
        if message:
            self.data["message"] = message
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(exist_ok=True)
            tmp.write_text(yaml.safe_dump(self.data, sort_keys=False, allow_unicode=True))
            os.replace(tmp, self.path)
        except OSError as e:  # bookkeeping must not end a run (a full disk fails the checkpoint loudly)
            tmp.unlink(missing_ok=True)
            logger.warning("cannot write the run record %s: %s", self.path, e.strerror or e)
