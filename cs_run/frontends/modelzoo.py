"""``cs_run.run``: the Model Zoo entry point, so an existing ``run.py`` works with only its import changed.

::

    from cs_run import run
    run(MNISTModel, get_train_dataloader, get_eval_dataloader)

parses ``python run.py {CPU,GPU,CSX} --mode {train,eval,train_and_eval,eval_all} --params params.yaml``
(or the older form without the device word, with ``--device``). ``model_fn`` and the data functions
receive the whole params dict as the Model Zoo passes it: the file's keys as written (after
``default_params_fn``), the command-line values in ``runconfig`` (``runconfig.mode`` included).

Each Model Zoo generation's entry point is here: ``run(...)`` (R_1.6 ... 1.8), and
``get_params_from_args()`` + ``main(params, model_fn, ...)`` (Release_1.9+). A model function may also
return a ``PyTorchBaseModel``-style object (R_1.6/1.7): its ``.model`` is trained, its optimizer and
LR scheduler (built from the params by :class:`PyTorchBaseModel`) are used, ``__call__(batch)`` is the loss.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from cs_run import _yaml, amp
from cs_run._logging import setup_console_logging
from cs_run.backend import BACKEND_TYPES
from cs_run.errors import ParamsError
from cs_run.exits import ArgumentParser, report
from cs_run.frontends.flags import flag_overrides, run_options
from cs_run.optim import configure_from_params
from cs_run.params import apply_overrides, params_from_dict, parse_override
from cs_run.runners import MODES, PyTorchBaseRunner, build_lr_scheduler, build_optimizer
from cs_run.vendor_params import from_trainer_form

__all__ = ["PyTorchBaseModel", "get_params_from_args", "main", "run"]


def _parser(extra_args_parser_fn: Optional[Callable]) -> argparse.ArgumentParser:
    parents = []
    if extra_args_parser_fn is not None:
        extra = extra_args_parser_fn()
        parents = list(extra) if isinstance(extra, (list, tuple)) else [extra]
    p = ArgumentParser(description="Train or evaluate a Model Zoo model with cs-run.", parents=parents,
                                conflict_handler="resolve")
    p.add_argument("device_word", nargs="?", metavar="{" + ",".join(BACKEND_TYPES) + "}", type=str.upper,
                   choices=BACKEND_TYPES, help="Where to run (or use --device).")
    p.add_argument("--device", type=str.upper, choices=BACKEND_TYPES, help="Where to run (older flat form).")
    p.add_argument("-m", "--mode", required=True, choices=MODES)
    p.add_argument("-p", "--params", required=True, help="Params YAML (Model Zoo layout).")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="Override any params key (repeatable). Precedence: params file < --set < a flag.")
    for option in run_options():  # one declaration: the flag-marked RunConfig fields (cs_run.frontends.flags)
        if not option.run_py:
            continue
        names = [f"--{option.name}"] + ([option.short] if option.short else [])
        if option.kind == "bool":
            p.add_argument(*names, dest=option.dest, action="store_true", default=None, help=option.help)
        elif option.kind == "list":
            p.add_argument(*names, dest=option.dest, nargs="+", metavar=option.metavar, help=option.help)
        elif option.kind == "choice":
            spelled = {choice.upper(): choice for choice in option.choices}  # case-insensitive, as cs-run's
            p.add_argument(*names, dest=option.dest, type=lambda v, s=spelled: s.get(v.upper(), v),
                           choices=option.choices, help=option.help)
        else:
            p.add_argument(*names, dest=option.dest, type=int if option.kind == "int" else str,
                           metavar=option.metavar, help=option.help)
    return p


def run(model_fn: Optional[Callable[[dict], Any]] = None, train_data_fn: Optional[Callable[[dict], Any]] = None,
        eval_data_fn: Optional[Callable[[dict], Any]] = None, default_params_fn: Optional[Callable] = None,
        extra_args_parser_fn: Optional[Callable] = None, argv: Optional[list[str]] = None) -> dict:
    """Parse the command line, build the runner with these functions, and run the mode.

    This is a script entry point: errors are reported by :mod:`cs_run.exits`, like ``cs-run``: one
    ``Error:`` line and exit code 2 (bad input) or 1 (failed run); an error in the user's own code
    keeps the traceback of the user's frames.

    Without ``model_fn`` (Release_2.10's ``run()``), ``model.name`` in the params picks the model (a
    registered name such as ``fc_mnist``, or ``module:function``) and its default data, as ``cs-run train``.

    Returns:
        The eval results of eval modes (empty for train).
    """
    params = get_params_from_args(extra_args_parser_fn=extra_args_parser_fn, argv=argv)
    if default_params_fn is not None:
        try:
            params = default_params_fn(params) or params
        except Exception as e:  # noqa: BLE001 - reported the one way every entry point reports
            raise SystemExit(report(e)) from None
    return main(params, model_fn, train_data_fn, eval_data_fn)


_CLI_KEYS = ("params", "mode", "target_device")


def get_params_from_args(run_dir: Optional[str] = None, extra_args_parser_fn: Optional[Callable] = None,
                         argv: Optional[list[str]] = None) -> dict:
    """The Model Zoo CLI (Release_1.9+): parse the command line and return the params dict.

    The params file is read as written; ``--set`` overrides apply; the command-line values go into
    ``runconfig`` (``mode``, ``target_device``, ``params``, model_dir, ..., and the script's own extra
    arguments), as the vendor's CLI does. ``run_dir`` is accepted for the vendor's signature.
    """
    args = _parser(extra_args_parser_fn).parse_args(argv)
    try:
        return _params_from_args(args)
    except Exception as e:  # noqa: BLE001 - reported the one way every entry point reports
        raise SystemExit(report(e)) from None


def _params_from_args(args: argparse.Namespace) -> dict:
    path = Path(args.params)
    if not path.is_file():
        raise ParamsError(f"params file not found: {path}")
    raw = _yaml.parse(_yaml.read_text(path), str(path))[0] or {}  # the params file's limits (cs_run._yaml)
    if not isinstance(raw, dict):
        raise ParamsError(f"params file must be a mapping of sections ({path})")
    raw = from_trainer_form(raw)
    apply_overrides(raw, dict(parse_override(text) for text in args.overrides))
    apply_overrides(raw, flag_overrides(vars(args)))
    rc = raw.setdefault("runconfig", {})
    known = {a.dest for a in _parser(None)._actions}
    extra = {k: v for k, v in vars(args).items() if k not in known}
    rc.update(extra)
    rc["_extra_args"] = sorted(extra)
    rc.update(params=str(path.resolve()), mode=args.mode, target_device=args.device_word or args.device or "CPU")
    if args.runner:
        rc["runner"] = args.runner
    return raw


def main(params: dict, model_fn: Optional[Callable[[dict], Any]] = None, train_data_fn: Optional[Callable[[dict], Any]] = None,
         eval_data_fn: Optional[Callable[[dict], Any]] = None, script: Optional[str] = None,
         extra_args_parser_fn: Optional[Callable] = None) -> dict:
    """Run ``params["runconfig"]["mode"]`` on ``target_device`` (Release_1.9+ ``run_utils.main``).

    ``params`` is the dict :func:`get_params_from_args` returns (after the script's ``set_defaults``);
    the model and data functions receive it as it is. ``script`` and ``extra_args_parser_fn`` are
    accepted for the vendor's signature.
    """
    try:
        return _main(params, model_fn, train_data_fn, eval_data_fn)
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - reported the one way every entry point reports
        raise SystemExit(report(e)) from None  # an interrupt: exit 130 / 143, its line already logged


def _main(vendor: dict, model_fn, train_data_fn, eval_data_fn) -> dict:
    rc = vendor.setdefault("runconfig", {})
    mode = rc.setdefault("mode", "train")
    device = str(rc.get("target_device") or "CPU").upper()
    raw = copy.deepcopy(vendor)
    rc_copy = raw["runconfig"]
    for key in rc_copy.pop("_extra_args", []):
        rc_copy.pop(key, None)
    rc.pop("_extra_args", None)
    for key in _CLI_KEYS:
        rc_copy.pop(key, None)
    if model_fn is not None:
        raw.setdefault("model", {}).setdefault("name", f"{model_fn.__module__}:{model_fn.__qualname__}")
    source = rc.get("params")
    params = params_from_dict(raw, base_dir=Path(source).parent if source else None, source=source)
    setup_console_logging(params.runconfig.logging)
    model_section = params.model
    if model_section.fp16_type in ("bfloat16", "cbfloat16") or model_section.use_bfloat16:
        amp.set_half_dtype(model_section.fp16_type or "bfloat16")
    else:
        amp.set_half_dtype(model_section.fp16_type or "float16")
    amp.enable_mixed_precision(bool(model_section.mixed_precision))

    built: dict[str, Any] = {}

    def build_model(_ignored: dict):
        obj = model_fn(vendor)
        if isinstance(obj, torch.nn.Module):
            return obj
        if isinstance(getattr(obj, "model", None), torch.nn.Module) and callable(obj):
            built["base_model"] = obj
            return _BaseModelModule(obj)
        raise ParamsError(f"model function {model_fn.__qualname__} returned {type(obj).__name__}; expected a "
                          "torch.nn.Module whose forward(batch) returns the loss, or a PyTorchBaseModel")

    def data(fn):
        return None if fn is None else (lambda _ignored: fn(vendor))

    builders: dict[str, Any] = dict(train_data_fn=data(train_data_fn), eval_data_fn=data(eval_data_fn))
    if model_fn is not None:  # else: the params' model.name, built by the runner
        builders.update(model_fn=build_model,
                        optimizer_fn=lambda module: _base_model_part(built, "optimizer", module, params),
                        lr_scheduler_fn=lambda opt: _base_model_part(built, "lr_scheduler", opt, params))
    runner = PyTorchBaseRunner.create(params, device=device, runner=rc.get("runner"), mode=mode, **builders)
    if params.runconfig.compile_only or params.runconfig.validate_only:
        mode = "eval" if mode == "eval" else "train"  # the compiler traces one step of that kind
    return runner.run(mode) or {}


def _base_model_part(built: dict, part: str, arg: Any, params) -> Any:
    """The optimizer / LR scheduler: the PyTorchBaseModel's own when it built them, else from params."""
    base = built.get("base_model")
    if base is not None and getattr(base, part, None) is not None:
        return getattr(base, part)
    if part == "optimizer":
        return build_optimizer(params.optimizer, arg)
    return build_lr_scheduler(params.optimizer, arg)


class _BaseModelModule(torch.nn.Module):
    """A PyTorchBaseModel as the runners' model: its ``.model`` holds the weights, calling it gives the loss."""

    def __init__(self, base: Any) -> None:
        super().__init__()
        self.model = base.model
        object.__setattr__(self, "_base", base)

    def forward(self, batch: Any) -> torch.Tensor:
        return self._base(batch)


class PyTorchBaseModel:
    """The R_1.6/1.7 model base class: a subclass builds ``self.model`` (and its loss), then calls
    ``super().__init__(params, model, device)``, which builds the optimizer and LR schedule from the
    ``optimizer`` params (in train modes) the way the Model Zoo does; ``__call__(batch)`` returns the loss.
    """

    def __init__(self, params: dict, model: torch.nn.Module, device: Optional[torch.device] = None) -> None:
        self.model = model
        if device is not None:
            self.model = self.model.to(device)
        self.mode = params["runconfig"]["mode"]
        self.mixed_precision = params.get("model", {}).get("mixed_precision", False)
        self.optimizer = None
        self.lr_scheduler = None
        oparams = params.get("optimizer")
        if oparams and self.mode in ("train", "train_and_eval"):
            self.optimizer, self.lr_scheduler, _ = configure_from_params(dict(oparams), self.model)

    def __call__(self, data: Any) -> torch.Tensor:
        raise NotImplementedError("a PyTorchBaseModel subclass defines __call__(data) returning the loss")

    def get_optimizer(self):
        return self.optimizer

    def get_lr_scheduler(self):
        return self.lr_scheduler

    def train(self) -> None:
        self.model.train()

    def eval(self) -> None:
        self.model.eval()

    @property
    def supported_modes(self) -> list[str]:
        return list(MODES)
