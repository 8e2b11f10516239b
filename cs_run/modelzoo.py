"""``cs_run.run``: the Model Zoo entry point, so an existing ``run.py`` works with only its import changed.

::

    from cs_run import run
    run(MNISTModel, get_train_dataloader, get_eval_dataloader)

parses ``python run.py {CPU,GPU,CSX} --mode {train,eval,train_and_eval,eval_all} --params params.yaml``
(or the older form without the device word, with ``--device``). ``model_fn`` and the data functions
receive the whole params dict, as in the Model Zoo.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Optional

import torch

from cs_run._logging import setup_console_logging
from cs_run.exits import ArgumentParser, report
from cs_run.params import CLUSTER_INT_KEYS, CLUSTER_LIST_KEYS, flag_overrides, load_params, parse_override
from cs_run.runners import PyTorchBaseRunner

__all__ = ["run"]

_MODES = ("train", "eval", "train_and_eval", "eval_all")
_DEVICES = ("CPU", "GPU", "CSX")


def _parser(extra_args_parser_fn: Optional[Callable]) -> argparse.ArgumentParser:
    parents = []
    if extra_args_parser_fn is not None:
        extra = extra_args_parser_fn()
        parents = list(extra) if isinstance(extra, (list, tuple)) else [extra]
    p = ArgumentParser(description="Train or evaluate a Model Zoo model with cs-run.", parents=parents,
                                conflict_handler="resolve")
    p.add_argument("device_word", nargs="?", metavar="{CPU,GPU,CSX}", type=str.upper, choices=_DEVICES,
                   help="Where to run (or use --device).")
    p.add_argument("--device", type=str.upper, choices=_DEVICES, help="Where to run (older flat form).")
    p.add_argument("-m", "--mode", required=True, choices=_MODES)
    p.add_argument("-p", "--params", required=True, help="Params YAML (Model Zoo layout).")
    p.add_argument("-o", "--model_dir")
    p.add_argument("--checkpoint_path")
    for name in ("max_steps", "num_steps", "num_epochs", "eval_steps"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--logging", type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    p.add_argument("--runner", help="A custom runner class, 'module:Class'.")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="Override any params key (repeatable).")
    csx = p.add_argument_group("CSX")
    csx.add_argument("--compile_only", action="store_true", default=None, help="Trace and compile only.")
    csx.add_argument("--validate_only", action="store_true", default=None, help="Trace only.")
    csx.add_argument("--compile_dir")
    for name in CLUSTER_INT_KEYS:
        csx.add_argument(f"--{name}", type=int)
    for name in CLUSTER_LIST_KEYS:
        csx.add_argument(f"--{name}", nargs="+")
    return p


def run(model_fn: Callable[[dict], torch.nn.Module], train_data_fn: Optional[Callable[[dict], Any]] = None,
        eval_data_fn: Optional[Callable[[dict], Any]] = None, default_params_fn: Optional[Callable] = None,
        extra_args_parser_fn: Optional[Callable] = None, argv: Optional[list[str]] = None) -> dict:
    """Parse the command line, build the runner with these functions, and run the mode.

    This is a script entry point: errors are reported by :mod:`cs_run.exits`, like ``cs-run``: one
    ``Error:`` line and exit code 2 (bad input) or 1 (failed run); an error in the user's own code
    keeps the traceback of the user's frames.

    Returns:
        The eval results of eval modes (empty for train).
    """
    args = _parser(extra_args_parser_fn).parse_args(argv)
    try:
        return _run(args, model_fn, train_data_fn, eval_data_fn, default_params_fn)
    except Exception as e:  # noqa: BLE001 - reported the one way every entry point reports
        raise SystemExit(report(e)) from None


def _run(args, model_fn, train_data_fn, eval_data_fn, default_params_fn) -> dict:
    known = {a.dest for a in _parser(None)._actions}
    extra_args = {k: v for k, v in vars(args).items() if k not in known}

    def defaults(raw: dict) -> dict:
        raw = default_params_fn(raw) or raw if default_params_fn else raw
        raw.setdefault("model", {}).setdefault("name", f"{model_fn.__module__}:{model_fn.__qualname__}")
        return raw

    def with_extra_args(fn):
        def call(params_dict: dict):
            params_dict.setdefault("runconfig", {}).update(extra_args)
            return fn(params_dict)
        return call if fn is not None else None

    flags = flag_overrides(vars(args))
    overrides = dict(parse_override(text) for text in args.overrides)
    params = load_params(args.params, {**overrides, **flags}, defaults_fn=defaults)
    setup_console_logging(params.runconfig.logging)
    runner = PyTorchBaseRunner.create(params, device=args.device_word or args.device or "CPU", runner=args.runner,
                                      mode=args.mode,
                                      model_fn=with_extra_args(model_fn),
                                      train_data_fn=with_extra_args(train_data_fn),
                                      eval_data_fn=with_extra_args(eval_data_fn))
    mode = args.mode
    if params.runconfig.compile_only or params.runconfig.validate_only:
        mode = "eval" if mode == "eval" else "train"  # the compiler traces one step of that kind
    return runner.run(mode) or {}
